// The one-sided reader: a lookup over ONE 2 KiB snapshot of a neighbourhood (what a client's READ
// returns), as a pure function, and the local copier that stands in for the READ.
//
// What a snapshot is assumed to be (the model the writer's ordering in table.h is built for):
//  (1) each 64 B bucket is copied as of one instant: a cache line read coherently at once, which
//      shows a prefix of the writer's program-ordered stores to that line (x86-TSO; FaRM relies
//      on the same line atomicity of DMA reads);
//  (2) lines are copied in ascending address order, each at its own instant (memcpy does; NICs
//      split a READ into ascending PCIe reads in practice, though InfiniBand does not promise
//      it; see docs/architecture.md for what breaks without it).
// Under (1) a line whose version is odd is mid-write ("busy"): its key and value may be torn.
// Under (2) and the writer's rule that items only ever move to HIGHER buckets, copying the
// destination before clearing the source, a key present when the copy began is present in at
// least one clean line of the snapshot (the argument is in table.h). So the reader:
//   1. checks the home bucket and then each bucket named by the home's hop info (the fast path:
//      an existing key is almost always found here);
//   2. otherwise scans the other buckets (a key mid-displacement may sit where a stale hop bit
//      does not point);
//   3. a clean occupied line whose 32 key bytes equal the padded key is a hit (the key's home is
//      this neighbourhood by definition); no hit and no busy line is a miss; no hit and a busy
//      line is "torn": the key might be in that line, so re-read.
// Garbage cannot crash it: 32 hop bits name 32 buckets of the span, nothing is followed further.
#ifndef HERD_HOPSCOTCH_NEIGHBOURHOOD_H_
#define HERD_HOPSCOTCH_NEIGHBOURHOOD_H_

#include <cstdint>
#include <span>
#include <string_view>

#include "hopscotch/format.h"

namespace hopscotch {

struct LookupResult {
  enum class Kind { kFound, kMiss, kTorn };
  Kind kind = Kind::kMiss;
  Value value{};        // kFound: the value
  int offset = -1;      // kFound: the bucket, counted from the home bucket
  bool via_hop = true;  // kFound: reached by the home bucket or a hop bit (false: by the scan)
  int dangling = 0;     // hop bits of the home naming an empty bucket (mid-move, or corruption)
  int malformed = 0;    // occupied clean buckets whose key field is not a valid padded key
  int rereads = 0;      // set by Table::Lookup: torn snapshots it read again
};

using Snapshot = std::span<const uint8_t, kNeighbourhoodBytes>;

// Looks `key` up in a snapshot of its neighbourhood (bucket 0 = its home bucket). A key that
// ValidateKey rejects is a miss (it cannot be stored).
LookupResult FindInNeighbourhood(Snapshot snapshot, std::string_view key);
LookupResult FindInNeighbourhood(Snapshot snapshot, const PaddedKey& key);

// Copies `buckets` buckets starting at `first` (64-byte aligned, in a live table) into `out`,
// each line as of one instant (a seqlock read on its word 0: the writer changes word 0 before and
// after every change to a line), lines in ascending order: the local stand-in for a READ with
// model (1)+(2). Loads are relaxed atomics, so it may race the writer.
void CopyLines(const uint8_t* first, uint64_t buckets, uint8_t* out);

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_NEIGHBOURHOOD_H_
