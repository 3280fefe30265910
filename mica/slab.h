// A slab allocator for store mode (issue 20): blocks of a caller-provided region, named by their
// byte offset in it. It does not own the memory; all its state lives in the region
// (mica/slab_layout.h), so a byte copy of the region (a backup written by RDMA at the same
// offsets) is the same allocator: Attach() to it and it continues exactly as the original would.
//
// Contract:
// - Allocate(bytes) returns the offset of a block of at least `bytes` bytes that overlaps no
//   other live block, or kNoBlock when nothing fits (the store answers kNoMemory). Deterministic:
//   the same operations on the same region bytes return the same offsets.
// - Free(offset) takes any offset Allocate returned and did not already get back; the size comes
//   from the page's descriptor. Any other offset (out of range, not a block start, a free block,
//   a double free) is rejected without changing a byte: a fatal error in debug builds, ignored
//   and counted (rejected_frees()) in release builds; TryFree() is the same check returning false.
//   (A stale offset that a later Allocate handed out again names that new block: no allocator
//   can tell those apart.)
// - Blocks are 16-byte aligned (small classes are multiples of 16 B) or page aligned (large).
// - The allocator writes into a block only while it is free: the first two words of a free small
//   block hold its free-list link and kFreeBlockTag ^ offset; Allocate clears the second. Free
//   pages and large blocks are never written (their state is in the descriptors). A one-sided
//   reader that READs a freed block may see those words: its item checksum rejects them.
// - Allocate and Free are O(1) except in two bounded, rare cases: a large allocation that finds
//   no run in a bin above its own scans its own bin (first fit), and a Free whose tag looks like
//   a double free walks that span's free list (at most blocks_per_span steps) to be sure.
//   Neither allocates, locks nor makes a system call.
// - Single-threaded (the partition's owner thread), like the rest of a partition.
//
// Layout: size classes of 64 B, then 4 per doubling to 8 KiB (29 classes), served from spans of
// 1..7 pages; larger blocks are runs of whole pages; spans and runs come from one page heap
// (4 KiB pages by default) that coalesces, so memory moves between classes and to large blocks.
// slab.cc argues the numbers; docs/architecture.md has the bytes.
#ifndef HERD_MICA_SLAB_H_
#define HERD_MICA_SLAB_H_

#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "mica/dirty_ranges.h"
#include "mica/slab_layout.h"

namespace mica {

inline constexpr uint64_t kSlabDefaultPageBytes = 4096;
// Page sizes Format accepts: below 4 KiB descriptors cost over 0.78% of the region; above
// 64 KiB large blocks round to too coarse a unit.
inline constexpr uint64_t kSlabMinPageBytes = 4096;
inline constexpr uint64_t kSlabMaxPageBytes = uint64_t{64} << 10;
// The region's start must be aligned to this (a hugepage-backed region is).
inline constexpr uint64_t kSlabRegionAlignment = 64;

// The most pages a small class's span may take (slab.cc picks the fewest with a small tail: 1..7
// at 4 KiB pages).
inline constexpr uint64_t kSlabMaxSpanPages = 8;

struct SlabConfig {
  // A power of two in [kSlabMinPageBytes, kSlabMaxPageBytes].
  uint64_t page_bytes = kSlabDefaultPageBytes;
};

absl::Status ValidateSlabConfig(const SlabConfig& config);

// The class that serves an allocation of 1..kSlabMaxSmallBytes bytes (0 is served as 1), and
// its block size. O(1): a bit width and the two bits below the top one.
inline constexpr int SlabClassOf(uint64_t bytes) {
  if (bytes <= kSlabMinBlockBytes) return 0;
  // bytes in (2^e, 2^(e+1)]: classes 2^e + j * 2^(e-2), j = 1..4, numbered from 1 at
  // e = log2(kSlabMinBlockBytes).
  constexpr int kMinShift = std::countr_zero(kSlabMinBlockBytes);
  const uint64_t n = bytes - 1;
  const int e = std::bit_width(n) - 1;
  return (e - kMinShift) * kSlabClassesPerDoubling + static_cast<int>((n >> (e - 2)) & 3) + 1;
}

inline constexpr uint64_t SlabClassBytes(int size_class) {
  if (size_class == 0) return kSlabMinBlockBytes;
  constexpr int kMinShift = std::countr_zero(kSlabMinBlockBytes);
  const int e = kMinShift + (size_class - 1) / kSlabClassesPerDoubling;
  const uint64_t j = (size_class - 1) % kSlabClassesPerDoubling + 1;
  return (uint64_t{1} << e) + (j << (e - 2));
}

// The usable bytes of the block an allocation of `bytes` (0 counts as 1) gets: its class's size,
// or whole pages of `page_bytes` (a power of two) for a large block.
inline constexpr uint64_t SlabBlockBytesFor(uint64_t bytes, uint64_t page_bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= kSlabMaxSmallBytes) return SlabClassBytes(SlabClassOf(bytes));
  return (bytes + page_bytes - 1) & ~(page_bytes - 1);
}

static_assert(SlabClassBytes(kSlabClassCount - 1) == kSlabMaxSmallBytes);
static_assert(SlabClassOf(kSlabMaxSmallBytes) == kSlabClassCount - 1);
static_assert(SlabClassOf(65) == 1 && SlabClassBytes(1) == 80);

struct SlabClassStats {
  uint64_t block_bytes = 0;
  uint64_t span_pages = 0;
  uint64_t spans = 0;
  uint64_t used_blocks = 0;
  uint64_t free_blocks = 0;      // in this class's spans (carved or not)
  uint64_t used_bytes = 0;       // used_blocks * block_bytes
  uint64_t span_tail_bytes = 0;  // per span, the bytes after its last block, times spans
  // Since Format: allocations served, bytes they asked for, and bytes rounding added to them
  // (allocations * block_bytes - requested_bytes). The allocator cannot know what a live small
  // block asked for (Free gets no size), so rounding waste is measured over allocations.
  uint64_t allocations = 0;
  uint64_t requested_bytes = 0;
  uint64_t rounding_bytes = 0;
};

struct SlabStats {
  uint64_t page_bytes = 0;
  uint64_t page_count = 0;
  uint64_t free_pages = 0;
  uint64_t largest_free_run = 0;  // pages: the longest large block that fits now
  uint64_t span_pages = 0;        // pages in small-class spans
  uint64_t data_offset = 0;       // header and descriptors: the allocator's fixed overhead
  std::array<SlabClassStats, kSlabClassCount> classes;
  // Large blocks now (exact: a large block's descriptor keeps the size it was asked for).
  uint64_t large_blocks = 0;
  uint64_t large_pages = 0;
  uint64_t large_requested_bytes = 0;
  uint64_t large_rounding_bytes = 0;  // large_pages * page_bytes - large_requested_bytes
  uint64_t large_allocations = 0;     // since Format
};

class SlabAllocator {
 public:
  // Writes a fresh header, descriptors and one free run over all pages into `region` (which
  // must start kSlabRegionAlignment-aligned). Data pages are not touched.
  static absl::StatusOr<SlabAllocator> Format(absl::Span<uint8_t> region, const SlabConfig& config);
  // Takes over a region Format (here or on another machine, copied byte for byte) wrote: checks
  // the header (magic, version, checksum of its identity, sizes against the span, every list
  // head in range). A damaged or truncated header is an error, never a crash. O(1): run
  // CheckInvariants() to also walk the descriptors and lists.
  static absl::StatusOr<SlabAllocator> Attach(absl::Span<uint8_t> region);

  SlabAllocator(SlabAllocator&&) = default;
  SlabAllocator& operator=(SlabAllocator&&) = default;
  SlabAllocator(const SlabAllocator&) = delete;  // two handles on one region would race
  SlabAllocator& operator=(const SlabAllocator&) = delete;

  // A block of at least `bytes` (0 counts as 1), or kNoBlock.
  uint64_t Allocate(uint64_t bytes);
  // Frees a live block (see the contract for any other offset).
  void Free(uint64_t offset);
  // Frees `offset` if it is a live block; false (nothing changed) otherwise.
  bool TryFree(uint64_t offset);
  // The usable bytes of the block at `offset` (its class size, or its pages); 0 if no block of a
  // live span or large run starts there.
  uint64_t BlockBytes(uint64_t offset) const;
  // The usable bytes Allocate(bytes) would return a block of (0 counts as 1): a block whose
  // BlockBytes() equals this can hold `bytes` without moving, and wastes no more than a new one.
  uint64_t BlockBytesFor(uint64_t bytes) const;

  // O(1) snapshots for gauges the owner publishes after each operation (Stats() walks more).
  // One class's spans and used blocks; and the page heap's free pages and large blocks.
  struct ClassUsage {
    uint64_t spans = 0, used_blocks = 0, blocks_per_span = 0, block_bytes = 0;
  };
  ClassUsage ClassUsageOf(int size_class) const;
  struct PageUsage {
    uint64_t free_pages = 0, large_blocks = 0, large_pages = 0;
  };
  PageUsage PageUsageNow() const;

  // Every later change of allocator state (header, descriptors, the two words of a free small
  // block) is also added to `ranges` (nullptr: none, the default); copying those ranges to a
  // replica keeps it an identical allocator. The caller clears it (per operation: at most 12
  // ranges; per batch if it has room). Format's own writes are not reported: a replica starts
  // from a full copy. `bias` is added to every offset reported (the allocator's span inside a
  // larger region: ranges then name region offsets).
  void set_dirty_ranges(DirtyRanges* ranges, uint64_t bias = 0) {
    dirty_ = ranges;
    dirty_bias_ = bias;
  }

  SlabStats Stats() const;
  // Walks the header, every descriptor and every list: runs tile the pages, free runs are
  // coalesced and each is in the bin of its length exactly once, spans with a free block are on
  // their class's list exactly once, free-block lists are acyclic and inside their span, counters
  // match. False with a reason in `why`. O(pages + blocks); tests and debug checks.
  bool CheckInvariants(std::string* why) const;

  uint64_t region_bytes() const { return region_bytes_; }
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t page_count() const { return page_count_; }
  // Header and descriptors occupy [0, data_offset()); pages follow.
  uint64_t data_offset() const { return data_offset_; }
  uint64_t rejected_frees() const { return rejected_frees_; }

 private:
  SlabAllocator(uint8_t* base, const SlabHeader& header);

  SlabHeader* header() const { return reinterpret_cast<SlabHeader*>(base_); }
  SlabPage* page(uint32_t index) const { return &pages_[index]; }
  uint64_t PageOffset(uint32_t index) const {
    return data_offset_ + (uint64_t{index} << page_shift_);
  }
  uint64_t LoadWord(uint64_t offset) const;
  void StoreWord(uint64_t offset, uint64_t value);
  // Reports a change of `bytes` bytes at `p` (inside the region) to the dirty recorder, if any.
  void Dirty(const void* p, uint64_t bytes) {
    if (dirty_ != nullptr) [[unlikely]] {
      dirty_->Add(dirty_bias_ + static_cast<uint64_t>(static_cast<const uint8_t*>(p) - base_),
                  bytes);
    }
  }
  template <typename T>
  void Dirty(const T* p) {
    Dirty(p, sizeof(T));
  }

  uint64_t AllocateSmall(uint64_t bytes);
  uint64_t AllocateLarge(uint64_t bytes);
  // The span head whose live block starts at `offset`, or kNoPage. `check_free_list`: also
  // reject a block that is on its span's free list (a double free).
  uint32_t SpanOfBlock(uint64_t offset, bool check_free_list) const;
  // The large block's head page starting at `offset`, or kNoPage.
  uint32_t LargeOfBlock(uint64_t offset) const;
  void FreeSmall(uint32_t span, uint64_t offset);
  void FreeLarge(uint32_t head);

  // Spans with a free block, per class.
  void LinkSpan(int size_class, uint32_t span);
  void UnlinkSpan(int size_class, uint32_t span);

  // The page heap.
  uint32_t TakeRun(uint64_t pages);                 // kNoPage when no free run is long enough
  void ReleaseRun(uint32_t first, uint64_t pages);  // descriptors of the run already kUnused
  void WriteFreeRun(uint32_t first, uint64_t pages);
  void InsertFreeRun(uint32_t first);
  void RemoveFreeRun(uint32_t first);
  void SetBinBit(int bin, bool on);

  uint8_t* base_ = nullptr;
  SlabPage* pages_ = nullptr;
  uint64_t region_bytes_ = 0;
  uint64_t page_bytes_ = 0;
  int page_shift_ = 0;
  uint64_t page_count_ = 0;
  uint64_t data_offset_ = 0;
  DirtyRanges* dirty_ = nullptr;
  uint64_t dirty_bias_ = 0;
  uint64_t rejected_frees_ = 0;  // diagnostics of this handle, not allocator state
};

}  // namespace mica

#endif  // HERD_MICA_SLAB_H_
