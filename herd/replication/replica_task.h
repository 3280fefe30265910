// A replica's work that must run on a worker's own thread, between two of its batches: the
// partition is the worker's alone, so a backup's repair (replaying a cut chain) and its promotion
// (taking the partition's state over, taking writes, answering through a new gate) go there.
// The replication member builds the tasks; the engine hands each to its worker (Worker::RunTask).
#ifndef HERD_HERD_REPLICATION_REPLICA_TASK_H_
#define HERD_HERD_REPLICATION_REPLICA_TASK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "herd/response_gate.h"
#include "mica/partition.h"

namespace herd {

// `apply` repairs or takes over the replica (replay the last committed redo record;
// ResumeFromRegion); with `take_writes`, once it succeeded, replica mode ends and mutations
// execute from the next batch on (a promotion). On failure the worker stays a replica.
struct ReplicaTask {
  std::function<absl::Status(mica::Partition&)> apply;
  bool take_writes = false;
  absl::Status status;
  // A promotion's: the client ids whose outcomes the old primary left in this partition
  // (replication/outcome_table.h). They await their clients' resumption: the worker records no new
  // outcome over theirs until then.
  std::vector<uint32_t> awaiting_resume;
  // A promotion that takes backups again (coordinated replication): called on the worker's
  // thread once the partition took writes, it returns the gate the worker answers through from
  // the next batch on (it must outlive the worker's thread); null: none.
  std::function<ResponseGate*(mica::Partition&)> make_gate;
  std::atomic<bool> done{false};
};

}  // namespace herd

#endif  // HERD_HERD_REPLICATION_REPLICA_TASK_H_
