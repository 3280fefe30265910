// A backup worker's GET: reads its partition's replica while the primary's WRITEs land in it
// (herd/replication/gate.h), with no help from the primary and no backup CPU on the write path.
//
// Contract (tests/herd/replica_reader_test.cc):
// - A value is answered only from a whole, verified copy of the key's item
//   (mica::Partition::ReadReplica): never torn, never another key's.
// - Never older than a write the primary acknowledged before the GET began: an acknowledged
//   write's bytes were placed here before its acknowledgement, and every later landing brings
//   newer bytes. A hit is the item a slot named at the moment of reading, at least that new.
// - A miss is answered only from a read that began and ended while no in-place WRITE landed
//   (LandingWords: begun == done before, begun unchanged after): a slot half-way through a
//   batch (an old slot naming a reused block, a chain being relinked) can make a present key
//   look absent, so an unconfirmed miss is read again.
// - Never what a failover could take back: a value newer than the primary's "released"
//   watermark (every write up to it is at every live backup), or a miss while a DELETE newer
//   than it landed here (ReleasedWords), is looked at again up to kMaxUnreleasedAttempts times,
//   then answered busy. (Another backup may lack a batch this one holds: promoted, it would
//   answer older.)
// - A backup its primary dropped (it went on without it: its copy misses acknowledged writes)
//   answers every GET busy.
// - A kBufferTooSmall (an item too long to copy here: the caller READs it itself) is answered
//   only from a quiet read, like a miss: a header read while its bytes land can be anything.
// - Bounded: after kMaxAttempts torn reads or unconfirmed misses (a primary that died mid-chain
//   leaves begun != done until promotion) the answer is kCorrupt, which the worker sends as
//   BACKUP_BUSY: ask again, or ask the primary. Never blocks, allocates or locks.
#ifndef HERD_HERD_REPLICATION_REPLICA_READER_H_
#define HERD_HERD_REPLICATION_REPLICA_READER_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "mica/partition.h"
#include "transport/types.h"
#include "util/lease.h"

namespace herd {

struct ReplicaReadCounters {
  transport::Counter reads;        // GETs read from the replica
  transport::Counter torn;         // attempts that found a bucket or item changing
  transport::Counter unconfirmed;  // misses read again (a WRITE was landing meanwhile)
  transport::Counter busy;         // GETs given up after kMaxAttempts
  transport::Counter unreleased;   // reads that found a write newer than the watermark
  transport::Counter held_back;    // ... GETs answered busy for it (counted in busy too)
};

class ReplicaReader {
 public:
  // Attempts per GET before it is answered busy: a batch's WRITEs land within microseconds, so
  // this many reads (each well under a microsecond) outlast a live primary's chain unless the
  // thread placing it (a NIC, shm's progress thread) stalls.
  static constexpr uint32_t kMaxAttempts = 4096;
  // Reads of an unreleased write before the GET is answered busy: the watermark moves once per
  // replication round trip, so spinning longer only burns the worker.
  static constexpr uint32_t kMaxUnreleasedAttempts = 16;

  // `redo_area`: the backup's redo area for this partition (its commit line's begun and done
  // words). Both must outlive the reader.
  // `stale`, when set, means the primary dropped this backup: every GET is answered busy.
  // `lease`, if not null, is this backup's read lease (coordinated replication): GETs are
  // answered busy whenever it is not valid (the primary may be acknowledging writes without it).
  ReplicaReader(const mica::Partition* partition, const uint8_t* redo_area,
                const std::atomic<bool>* stale = nullptr, const util::Lease* lease = nullptr);

  // A GET (request.op must be kGet): ReadReplica's results, with kNotFound confirmed and
  // kCorrupt meaning busy (see above).
  mica::Response Get(const mica::Request& request);

  const ReplicaReadCounters& counters() const { return counters_; }

 private:
  const mica::Partition* partition_;
  const uint8_t* redo_area_;
  const std::atomic<bool>* stale_;
  const util::Lease* lease_;
  std::vector<uint64_t> scratch_;  // one item, the largest the partition stores
  ReplicaReadCounters counters_;
};

}  // namespace herd

#endif  // HERD_HERD_REPLICATION_REPLICA_READER_H_
