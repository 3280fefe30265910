// Issue 16's write path on a primary worker: a ResponseGate (response_gate.h) that mirrors the
// worker's partition to its backups and holds each mutation's answer until every live backup
// holds the mutation.
//
// How: the partition records the region ranges each operation changes
// (mica::Partition::set_change_recorder, into the gate's recorder). EndBatch posts, to each live
// backup, ONE chain of RDMA WRITEs of those ranges at the same offsets of the backup's partition
// region (one doorbell per backup per batch; only the last WR signaled), and the batch's
// mutations are released once every live backup's chain completed (an RC completion in order:
// everything before it completed too). Release() polls the links' CQ without blocking; the
// worker never waits for a backup.
//
// Contract (tests/herd/replication_gate_test.cc):
// - A released mutation's bytes, and everything the partition changed before them, have been
//   placed in every backup that is still live: a backup's partition answers it.
// - A mutation executed in a batch that changed nothing (CAS_FAILED, NOT_FOUND) is released
//   only after every batch before it completed (its answer may name a version still in flight).
// - A backup whose WRITE completes in error (dead, QP broken) is dropped for good; the gate goes
//   on with the others (live_backups() says how many) and, with none left, releases at once.
// - At most max_batches_in_flight batches are posted per backup; beyond that the next batch's
//   ranges keep accumulating (DirtyRanges merges them) and are posted once one completes.
// - Worker thread only (like every ResponseGate call); no locks; posting allocates nothing. The
//   list of held answers grows past its initial reservation only when more are held at once
//   than ever before.
// Not yet (issue 16): a stalled backup (no completion, no error) is not timed out.
#ifndef HERD_HERD_REPLICATION_GATE_H_
#define HERD_HERD_REPLICATION_GATE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "herd/response_gate.h"
#include "mica/partition.h"
#include "transport/fabric.h"

namespace herd {

// One backup partition, as the primary worker reaches it.
struct BackupLink {
  transport::QueuePair* qp = nullptr;  // RC, connected to the backup; its send CQ is the gate's
  uint64_t region_addr = 0;            // the backup's partition region base (its address space)
  uint32_t rkey = 0;                   // the backup region's MR (remote write)
};

struct ReplicationOptions {
  // WRITEs (ranges) one batch posts per backup; more ranges merge into supersets.
  uint32_t max_ranges_per_batch = 64;
  // Batches in flight per backup: the link's send queue needs max_ranges_per_batch times this.
  uint32_t max_batches_in_flight = 4;
  // Held answers reserved up front.
  uint32_t held_reserve = 1024;
};

struct ReplicationCounters {
  uint64_t batches_posted = 0;  // batches whose ranges went to the backups
  uint64_t writes_posted = 0;   // WRITE WRs, all backups
  uint64_t bytes_posted = 0;    // their bytes, all backups
  uint64_t deferred = 0;        // EndBatch calls that found a backup's window full
  uint64_t links_dropped = 0;
  uint64_t released = 0;
};

class ReplicationGate : public ResponseGate {
 public:
  // `partition` (the worker's) records into the gate from now on; `region_lkey`: the local MR
  // covering its region (the WRITEs' source); `cq`: the send CQ of every link's QP, polled only
  // by this gate. Each link's send queue must hold max_ranges_per_batch * max_batches_in_flight.
  static absl::StatusOr<std::unique_ptr<ReplicationGate>> Create(mica::Partition* partition,
                                                                 uint32_t region_lkey,
                                                                 transport::CompletionQueue* cq,
                                                                 std::vector<BackupLink> links,
                                                                 const ReplicationOptions& options);
  ~ReplicationGate() override;  // the partition stops recording

  bool Hold(const ExecutedMutation& mutation) override;
  void EndBatch() override;
  uint32_t Release(absl::Span<HeldId> released) override;

  uint32_t live_backups() const { return live_; }
  const ReplicationCounters& counters() const { return counters_; }

 private:
  struct Link {
    BackupLink backup;
    bool live = true;
    uint64_t posted_through = 0;     // the last batch posted to it
    uint64_t completed_through = 0;  // the last batch whose chain completed
  };
  struct Held {
    HeldId id;
    uint64_t batch;  // the batch whose completion releases it (kUnposted until posted)
  };
  static constexpr uint64_t kUnposted = UINT64_MAX;

  ReplicationGate(mica::Partition* partition, uint32_t region_lkey, transport::CompletionQueue* cq,
                  std::vector<BackupLink> links, const ReplicationOptions& options);
  // Posts the accumulated ranges as the next batch to every live link, if every live link has
  // room; gives the unposted held answers that batch. False when deferred.
  bool PostPending();
  void DropLink(Link& link);
  uint64_t ReleasableThrough() const;

  mica::Partition* const partition_;
  const uint32_t region_lkey_;
  const uint64_t region_base_;
  transport::CompletionQueue* const cq_;
  const ReplicationOptions options_;
  std::vector<Link> links_;
  uint32_t live_ = 0;
  mica::DirtyRanges changes_;
  std::vector<transport::SendWr> wrs_;  // one chain, prepared once; filled per batch
  std::vector<transport::Sge> sges_;
  std::vector<transport::Completion> completions_;
  // Held answers in batch order: a ring over held_ring_ (grows only past its high-water mark).
  std::vector<Held> held_ring_;
  size_t held_head_ = 0, held_count_ = 0;
  Held& HeldAt(size_t i) { return held_ring_[(held_head_ + i) % held_ring_.size()]; }
  uint64_t last_posted_ = 0;    // the last batch posted (to every live link)
  bool unposted_held_ = false;  // held answers wait for the next posting
  ReplicationCounters counters_;
};

}  // namespace herd

#endif  // HERD_HERD_REPLICATION_GATE_H_
