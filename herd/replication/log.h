// What makes a backup's partition whole after its primary died mid-chain: each replicated batch
// first lands in the backup's redo area as one record (the batch's ranges and their bytes), then
// a commit word naming that record, then the ranges in place (herd/replication/gate.h posts the
// three in that order on one RC QP, which executes them in order). A primary that dies leaves the
// backup's stream cut anywhere; replaying the last committed record (ReplayLastBatch) then gives
// exactly the state after some batch, never a mix:
//   - cut inside a record: the commit still names the previous record, whose in-place writes
//     all landed before this record's first byte; replaying it changes nothing;
//   - cut inside the commit word: it is one aligned 8-byte word, placed whole (old or new);
//   - cut inside the in-place writes: the commit names this batch's record; replaying it
//     finishes them.
// The primary never reuses the ring space of the newest record a backup may have committed.
//
//   redo area:  [ commit line: 64 B                                                       ]
//                   word 0: the committed record's offset in the ring + 1 (0: none)
//                   word 1: "begun", the batch whose in-place writes follow (with word 0)
//                   word 2: "deletes", the newest version a DELETE took in the batches
//                           through "begun" (with words 0 and 1, before the in-place writes)
//                   word 3: "done", the last batch whose in-place writes all landed
//                   word 4: "released", every write of a version up to it is at every live
//                           backup (with word 3, or alone: the primary's idle watermark)
//               [ ring: staging_bytes, the primary's staging ring at the same offsets    ]
//   record:     RedoHeader | RedoRange[ranges] | the ranges' bytes, each padded to 8
//
// The header and range table carry a checksum (damage or a stray writer is refused, never
// applied); the data needs none, on one condition herd states and relies on: the backup's NIC
// places a QP's messages in order, so when the stream is cut, every message before the cut is
// whole and none after it has landed (go-back-N RC: the shm fabric, Soft-RoCE, ConnectX without
// adaptive routing). A NIC that places RC messages out of order (adaptive routing, iWARP DDP)
// needs a READ before each commit word; not done.
// Words 1 and 2 let a backup reader tell a quiet moment (begun == done: nothing lands in place)
// from a landing one, and notice a batch that began landing while it read (begun moved): see
// LandingWords. Batches are numbered from 1 and only grow, so equal words never mean two batches.
// Words 2 and 4 keep a backup reader from answering what a failover could take back: a value
// newer than "released", or a miss while a DELETE newer than it landed here (ReleasedWords).
// After a replay the caller clears the commit line (ClearCommitLine: a second replay of an
// older record after the promoted partition moved on would roll it back); a new link starts
// from a zeroed line.
#ifndef HERD_HERD_REPLICATION_LOG_H_
#define HERD_HERD_REPLICATION_LOG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace herd {

inline constexpr uint64_t kRedoMagic = 0x4f44455244524548ULL;  // "HERDREDO"
inline constexpr uint64_t kRedoCommitLineBytes = 64;           // the commit word's line
inline constexpr uint64_t kRedoBegunWordOffset = 8;            // in the commit line
inline constexpr uint64_t kRedoDeletesWordOffset = 16;
inline constexpr uint64_t kRedoDoneWordOffset = 24;
inline constexpr uint64_t kRedoReleasedWordOffset = 32;
static_assert(kRedoReleasedWordOffset + sizeof(uint64_t) <= kRedoCommitLineBytes);
inline constexpr uint64_t kRedoAlignment = 8;
// The most ranges one record may hold (a gate's max_ranges_per_batch is far below): bounds every
// loop over a table whose length a damaged record could make anything.
inline constexpr uint64_t kMaxRedoRanges = uint64_t{1} << 20;

struct RedoHeader {
  uint64_t magic;         // kRedoMagic
  uint64_t batch;         // the batch number (1, 2, ...)
  uint64_t ranges;        // entries in the range table
  uint64_t record_bytes;  // header + table + padded data
  uint64_t checksum;      // util::WordChecksum of the header (this word zero) and the table
  uint64_t reserved[3];
};
static_assert(sizeof(RedoHeader) == 64, "RedoHeader is part of the redo format");

struct RedoRange {
  uint64_t offset;  // in the partition's region
  uint64_t bytes;
};
static_assert(sizeof(RedoRange) == 16, "RedoRange is part of the redo format");

inline constexpr uint64_t RedoPadded(uint64_t bytes) {
  return (bytes + kRedoAlignment - 1) & ~(kRedoAlignment - 1);
}
// The bytes of a record of `ranges` ranges whose padded data totals `padded_data_bytes`.
inline constexpr uint64_t RedoRecordBytes(uint64_t ranges, uint64_t padded_data_bytes) {
  return sizeof(RedoHeader) + ranges * sizeof(RedoRange) + padded_data_bytes;
}
// A backup's redo area for a primary staging ring of `ring_bytes`.
inline constexpr uint64_t RedoAreaBytes(uint64_t ring_bytes) {
  return kRedoCommitLineBytes + ring_bytes;
}

// A backup reader's view of its redo area's begun and done words (the primary's WRITEs change
// them while the reader runs). Quiet() gives the begun batch if nothing is landing in place now
// (begun == done), else 0 with *quiet false; a read of the partition that starts after a quiet
// Quiet() and ends with StillQuiet(that batch) true saw no in-place write at all.
class LandingWords {
 public:
  explicit LandingWords(const uint8_t* redo_area)
      : begun_(reinterpret_cast<const uint64_t*>(redo_area + kRedoBegunWordOffset)),
        done_(reinterpret_cast<const uint64_t*>(redo_area + kRedoDoneWordOffset)) {}
  uint64_t Quiet(bool* quiet) const;
  bool StillQuiet(uint64_t begun) const;

 private:
  const uint64_t* begun_;
  const uint64_t* done_;
};

// A backup reader's view of the primary's watermark words: whether what it read may be answered
// (a failover cannot take it back). Read after the partition was read.
class ReleasedWords {
 public:
  explicit ReleasedWords(const uint8_t* redo_area)
      : deletes_(reinterpret_cast<const uint64_t*>(redo_area + kRedoDeletesWordOffset)),
        released_(reinterpret_cast<const uint64_t*>(redo_area + kRedoReleasedWordOffset)) {}
  // A hit of an item of `version`.
  bool Released(uint64_t version) const;
  // A miss: no DELETE newer than the watermark landed.
  bool MissReleased() const;

 private:
  const uint64_t* deletes_;
  const uint64_t* released_;
};

// Clears what names a record and a landing (words 0, 1 and 3) and keeps the watermark words: the
// writes they call released are still released, and the DELETEs they name still landed.
void ClearCommitLine(uint8_t* redo_area);

// Seals a record whose header fields and table are written: sets magic and the checksum.
void SealRedoRecord(RedoHeader* header);

// The backup's side, at promotion: applies the record the commit word names to `region` (the
// partition region the ranges index). Nothing committed: OK, nothing done. A record that is
// damaged, not of this format, or whose ranges reach outside the ring or the region: an error,
// and nothing applied.
absl::Status ReplayLastBatch(absl::Span<const uint8_t> redo_area, absl::Span<uint8_t> region);

}  // namespace herd

#endif  // HERD_HERD_REPLICATION_LOG_H_
