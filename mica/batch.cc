// The batched hot path: overlap the cache misses of a whole batch before executing any of it.
// With a table far larger than the caches, each request costs two dependent misses (bucket, then
// item), and a cache-mode write a third (the log's tail, where it appends); issuing every
// bucket's miss, then every item's, then the tail's, lets them proceed in parallel.
#include <algorithm>
#include <bit>
#include <new>
#include <type_traits>

#include "mica/keyhash.h"
#include "mica/partition.h"
#include "util/prefetch.h"

namespace mica {
namespace {

// Cache lines of an item prefetched before execution: the header and key share the first one;
// the second covers the value of the small items HERD-style workloads use.
constexpr int kItemLinesPrefetched = 2;
// Requests whose spots are found, prefetched and executed together: more than a worker's batch
// (window x clients per worker, ~16), few enough to stay on the stack.
constexpr size_t kBatchChunk = 64;
// The most log lines one chunk's appends prefetch (4 KiB): a worker's batch of 16 small writes
// (72-80 B items, 1.1-1.25 lines each) is covered whole, a full chunk of 64 in part; a large
// value's own copy streams, and the hardware prefetcher follows it.
constexpr uint64_t kTailPrefetchLines = 64;

// Whether the op appends an item to a cache-mode log (a CAS or INSERT that fails does not: its
// line is prefetched for nothing).
constexpr bool Appends(OpCode op) {
  return op == OpCode::kPut || op == OpCode::kCas || op == OpCode::kInsert;
}

// A response is replaced by constructing over it (ExecuteBatchIn), with nothing to destroy.
static_assert(std::is_trivially_destructible_v<Response>);

}  // namespace

void Partition::ExecuteBatch(absl::Span<const Request> requests, absl::Span<Response> responses) {
  if (store_mode()) {
    ExecuteBatchIn<StoreMode::kStore>(requests, responses);
  } else {
    ExecuteBatchIn<StoreMode::kCache>(requests, responses);
  }
}

template <StoreMode kMode>
void Partition::ExecuteBatchIn(absl::Span<const Request> requests, absl::Span<Response> responses) {
  // Each request's spot is found once (IndexHash is a keyed hash, not free), in chunks whose
  // spots fit on the stack; the hash's key is read once per chunk.
  Spot spots[kBatchChunk];
  for (size_t first = 0; first < requests.size(); first += kBatchChunk) {
    const size_t n = std::min(kBatchChunk, requests.size() - first);
    const IndexKey secret = index_key();
    uint64_t append_bytes = 0;  // 64-bit: the values' lengths come from peers
    for (size_t i = 0; i < n; ++i) {
      const Request& request = requests[first + i];
      spots[i] = SpotOf(request.key, secret);
      if constexpr (kMode == StoreMode::kCache) {
        if (Appends(request.op)) {
          append_bytes += ItemBytes(request.key.size(), request.value.size(),
                                    Checksummed(request.value.size()));
        }
      }
    }
    // All the hashes first, then the bucket prefetches back to back. A prefetch that misses
    // the TLB holds its thread up until its page walk ends: one per stretch of other work (a
    // hash, about 130 instructions) is paid nearly whole, back to back the walks overlap
    // (bench/prefetch_bench: 16-22 against 3-7 ns a prefetch on VM2; engine_bench GET 0.88x,
    // PUT 0.94x; docs/performance.md, "Prefetches wait for page walks").
    for (size_t i = 0; i < n; ++i) util::PrefetchForRead(spots[i].bucket);
    // Then every request's candidate items, then the executions. (Prefetching each request's
    // items only 2, 4 or 8 requests before it executes, MICA2's staggered shape, measured
    // 0.66-0.85x of this at 100,000 and 1M items: mica_bench, session 29.)
    for (size_t i = 0; i < n; ++i) PrefetchCandidates<kMode>(spots[i]);
    // Cache mode writes each item at the log's tail, into lines untouched for a lap of the ring:
    // the appends' misses overlap the rest of the chunk's instead of filling the store buffer.
    if constexpr (kMode == StoreMode::kCache) {
      if (append_bytes > 0) PrefetchLogTail(append_bytes);
    }
    for (size_t i = 0; i < n; ++i) {
      // Constructed in place from the call's result (C++17's guaranteed elision): ExecuteAt
      // stores each field straight into the caller's response. Assigned instead, the result went
      // to a temporary on the stack, field by field, and was copied over in two 16-byte loads
      // that span several of those stores, which the CPU cannot forward: the copy waited for
      // them to reach L1 (~15% of this function's samples, on one load).
      ::new (static_cast<void*>(&responses[first + i]))
          Response(ExecuteAt(requests[first + i], spots[i]));
    }
  }
}

// Every live slot of the bucket with the spot's tag (a dead one is prefetched too in cache mode,
// where its offset stays inside the log's mapping; store mode's test keeps a damaged offset's
// address near the pool).
template <StoreMode kMode>
void Partition::PrefetchCandidates(const Spot& spot) const {
  const Bucket& bucket = *spot.bucket;
  for (uint32_t candidates = SlotsTagged(bucket, spot.tag); candidates != 0;
       candidates &= candidates - 1) {
    const uint64_t offset = SlotOffset(bucket.slots[std::countr_zero(candidates)]);
    if (kMode == StoreMode::kStore && !IsAliveIn<kMode>(offset)) continue;
    const auto* item = reinterpret_cast<const char*>(ItemAt(offset));
    for (int line = 0; line < kItemLinesPrefetched; ++line) {
      util::PrefetchForRead(item + line * kCacheLineBytes);
    }
  }
}

void Partition::PrefetchLogTail(uint64_t bytes) const {
  const uint64_t tail = header_->log_tail;
  const uint64_t first_line = tail / kCacheLineBytes;
  const uint64_t lines =
      std::min(kTailPrefetchLines, (tail + bytes - 1) / kCacheLineBytes - first_line + 1);
  for (uint64_t line = 0; line < lines; ++line) {
    // Within the ring whatever the tail: the mask wraps the offset as the mirror would.
    util::PrefetchForRead(log_ + (((first_line + line) * kCacheLineBytes) & log_mask_));
  }
}

}  // namespace mica
