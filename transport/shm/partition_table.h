// A network partition for the shm fabric: a small table in a file that every device of a run
// maps (FaultOptions::partition_file), listing pairs of processes cut off from each other. A WR
// between two cut processes is lost as it would be on a partitioned network: a UD or UC message
// silently (counted dropped), an RC operation with RETRY_EXCEEDED (the QP to error), in both
// directions. Anyone may cut and heal at any time (a test, scripts/, `shm_partition`): every
// device sees the change at its next WR. Processes are named by pid.
//
//   absl::StatusOr<PartitionTable> t = PartitionTable::Open("/tmp/run/partitions");
//   t->Cut(primary_pid, backup_pid);   // from now on nothing passes between them
//   t->Heal(primary_pid, backup_pid);  // or HealAll()
//
// Cost when nothing is cut: one relaxed load per WR (the count); devices opened without a
// partition file pay one pointer test.
#ifndef HERD_TRANSPORT_SHM_PARTITION_TABLE_H_
#define HERD_TRANSPORT_SHM_PARTITION_TABLE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace transport::shm {

class PartitionTable {
 public:
  // At most this many pairs cut at once.
  static constexpr uint32_t kMaxCuts = 64;

  // Maps the table in `path`, creating it (empty) if it does not exist. A file that is not a
  // partition table (another size, another magic) is refused, never overwritten.
  static absl::StatusOr<PartitionTable> Open(const std::string& path);
  PartitionTable(PartitionTable&& other) noexcept;
  PartitionTable& operator=(PartitionTable&& other) noexcept;
  PartitionTable(const PartitionTable&) = delete;
  PartitionTable& operator=(const PartitionTable&) = delete;
  ~PartitionTable();

  // Cuts processes a and b apart (both directions; the order does not matter). Cutting a pair
  // already cut is a no-op; RESOURCE_EXHAUSTED when kMaxCuts pairs are cut; INVALID_ARGUMENT for
  // a pid <= 0 or a == b.
  absl::Status Cut(int32_t a, int32_t b);
  // Heals the pair (a no-op when it was not cut).
  void Heal(int32_t a, int32_t b);
  void HealAll();
  // Whether a and b are cut apart: what every device asks on every WR. Lock-free.
  bool IsCut(int32_t a, int32_t b) const;
  // The pairs cut now, each (smaller pid, larger pid).
  std::vector<std::pair<int32_t, int32_t>> Cuts() const;

 private:
  struct Layout;
  PartitionTable(Layout* layout, int fd) : layout_(layout), fd_(fd) {}
  Layout* layout_ = nullptr;
  int fd_ = -1;  // kept open for the writers' flock
};

}  // namespace transport::shm

#endif  // HERD_TRANSPORT_SHM_PARTITION_TABLE_H_
