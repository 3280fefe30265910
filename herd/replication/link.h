// The replication handshake (issue 16): a primary attaches to a backup's replication port, once
// at start, over the TCP control plane, and keeps the connection (its closing is how either side
// learns the other left):
//   ReplicaHello(workers, staging bytes, the partition layout, per worker the primary's RC QP)
//     -> ReplicaWelcome(per worker: the backup's RC QP, its partition region and redo area,
//        registered for remote WRITE in a protection domain of this attachment alone)  [or Error]
// The backup checks that every size that gives an offset its meaning matches its own
// (CheckSameLayout): a WRITE at the same offset must land in the same field.
#ifndef HERD_HERD_REPLICATION_LINK_H_
#define HERD_HERD_REPLICATION_LINK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mica/partition.h"
#include "transport/types.h"

namespace herd {

// Everything of a partition's layout a byte offset depends on.
struct ReplicaLayout {
  uint32_t mode = 0;  // mica::StoreMode
  uint64_t bucket_count = 0;
  uint64_t extra_bucket_count = 0;
  uint64_t buckets_offset = 0;
  uint64_t index_bytes = 0;
  // herd's replicated outcome table (herd/replication/outcome_table.h).
  uint64_t owner_area_offset = 0;
  uint64_t owner_area_bytes = 0;
  uint64_t log_bytes = 0;
  uint64_t pool_bytes = 0;
  uint64_t max_item_bytes = 0;
  uint32_t max_value_bytes = 0;
  uint32_t checksum_from_value_bytes = 0;
  uint64_t head_bytes = 0;  // the region's mapping: [head | ring | mirror]
  uint64_t ring_bytes = 0;
  uint64_t mapped_bytes = 0;
  // How entries are placed in buckets (mica::kIndexScheme): a backup that placed them otherwise
  // would miss every key its primary stored.
  uint32_t index_scheme = 0;
};
ReplicaLayout LayoutOf(const mica::Partition& partition);
// OK when `theirs` (the primary's) equals `mine` field by field; else which field differs.
absl::Status CheckSameLayout(const ReplicaLayout& theirs, const ReplicaLayout& mine);

struct ReplicaHello {
  uint32_t workers = 0;
  uint64_t staging_bytes = 0;  // the gates' staging rings: each redo area holds one
  ReplicaLayout layout;        // every worker's partition has it
  // The primary runs and will transfer its partitions' state to this backup (a backup that
  // joins or rejoins): it serves no read and refuses promotion until told kReplicaSynced.
  bool transfer = false;
  // What indexes the outcome table in the owner area (herd/replication/outcome_table.h): its size
  // alone would let 64 x 8 pass for 128 x 4.
  uint32_t max_clients = 0;
  uint32_t window = 0;
  std::vector<transport::QpEndpoint> link_qps;  // per worker
  // Coordinated replication: the configuration epoch the primary acts in and its member name
  // (epoch 0: uncoordinated). A backup takes only its current epoch's primary.
  uint64_t epoch = 0;
  std::string member;
};

struct ReplicaPartition {
  transport::QpEndpoint qp;  // the backup's RC QP for this worker's link
  uint64_t region_addr = 0;  // the partition region (mapped_bytes), remote WRITE
  uint32_t region_rkey = 0;
  uint64_t redo_addr = 0;  // its redo area: RedoAreaBytes(staging_bytes), remote WRITE
  uint32_t redo_rkey = 0;
};

struct ReplicaWelcome {
  std::vector<ReplicaPartition> partitions;  // per worker
};

std::vector<uint8_t> Encode(const ReplicaHello& hello);
std::vector<uint8_t> Encode(const ReplicaWelcome& welcome);
// `max_workers`: lists longer than this are refused before anything is allocated for them.
absl::StatusOr<ReplicaHello> DecodeReplicaHello(const std::vector<uint8_t>& bytes,
                                                uint32_t max_workers);
absl::StatusOr<ReplicaWelcome> DecodeReplicaWelcome(const std::vector<uint8_t>& bytes,
                                                    uint32_t workers);

}  // namespace herd

#endif  // HERD_HERD_REPLICATION_LINK_H_
