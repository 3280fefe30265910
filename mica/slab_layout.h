// The slab allocator's on-region format (mica/slab.h), byte by byte. Everything the allocator
// knows lives in these structures inside the region it manages: a header at offset 0, one
// descriptor per page right after it, and the links of free blocks inside the free blocks. No
// pointers: lists link by page index (descriptors) or by region offset (free blocks), so a copy
// of the region's bytes at another address (a backup written by RDMA) is the same allocator.
//
//   offset 0:                   SlabHeader (identity, page heap, 29 class records)
//   descriptors_offset:         SlabPage[page_count], 32 B each (64-byte aligned)
//   data_offset:                page_count pages of page_bytes (page aligned)
//
// Every field is a little-endian integer at a fixed offset (static_asserts below); a change of
// any of them needs a new kSlabFormatVersion.
#ifndef HERD_MICA_SLAB_LAYOUT_H_
#define HERD_MICA_SLAB_LAYOUT_H_

#include <cstddef>
#include <cstdint>

namespace mica {

// "HERDSLAB" in ASCII, first byte first.
inline constexpr uint64_t kSlabMagic = 0x42414C5344524548ULL;
inline constexpr uint32_t kSlabFormatVersion = 1;

// The size classes: 64 B, then four per doubling up to 8 KiB (slab.h argues the choice).
inline constexpr uint64_t kSlabMinBlockBytes = 64;
inline constexpr uint64_t kSlabMaxSmallBytes = 8192;
inline constexpr int kSlabClassesPerDoubling = 4;
inline constexpr int kSlabClassCount = 29;  // 1 + 4 * log2(8192 / 64)

// Free-run bins of the page heap: exact for runs of 1..3 pages, then four per doubling (TLSF's
// two-level index with two second-level bits), up to runs of 2^32 - 1 pages.
inline constexpr int kSlabBinCount = 124;
inline constexpr int kSlabBinBitmapWords = 2;  // one bit per bin

// "No page" in every page-index field (a list's end, an empty bin).
inline constexpr uint32_t kNoPage = UINT32_MAX;
// "No block": Allocate's answer when nothing fits, and the end of a free-block list.
inline constexpr uint64_t kNoBlock = UINT64_MAX;

// The word at byte 8 of every free small block: kFreeBlockTag ^ (the block's region offset).
// Free() reads it to notice a double free in O(1) (then confirms by walking the span's free
// list, since a live block may hold the same bytes by chance).
inline constexpr uint64_t kFreeBlockTag = 0x5EB1F4EEB10C4ED5ULL;

// What a page is. Only pages that begin or end a run carry a tag; a page inside a free run or a
// large run is kUnused, so no stale tag can make Free() accept an offset into it.
enum SlabPageKind : uint8_t {
  kPageUnused = 0,     // inside a free or large run (neither its first nor its last page)
  kPageFreeHead = 1,   // first page of a free run (also its last when the run is one page)
  kPageFreeTail = 2,   // last page of a free run of 2+ pages: coalescing finds the run's head
  kPageSpanHead = 3,   // first page of a small-class span
  kPageSpanInner = 4,  // any further page of a span: Free() finds the span's head from it
  kPageLargeHead = 5,  // first page of a large block (its offset is the block's offset)
  kPageLargeTail = 6,  // last page of a large block of 2+ pages: stops coalescing into it
};

// One per page, at descriptors_offset + 32 * page.
struct SlabPage {
  uint8_t kind;        // SlabPageKind
  uint8_t size_class;  // kPageSpanHead: the span's class
  uint16_t reserved;   // zero
  // Heads (free, span, large): the run's length in pages. kPageFreeTail, kPageSpanInner,
  // kPageLargeTail: the run's first page.
  uint32_t pages_or_first;
  // kPageFreeHead: neighbours in its bin's list. kPageSpanHead: neighbours in its class's list of
  // spans that have a free block. kNoPage ends a list.
  uint32_t prev;
  uint32_t next;
  uint32_t used_blocks;    // kPageSpanHead: blocks allocated and not freed
  uint32_t carved_blocks;  // kPageSpanHead: blocks [0, carved) were handed out at least once;
                           // the others were never touched (a new span writes no block)
  // kPageSpanHead: region offset of its first free block (each free block's first word holds the
  // next one's), or kNoBlock. kPageLargeHead: the bytes the allocation asked for.
  uint64_t word;
};
static_assert(sizeof(SlabPage) == 32, "SlabPage is part of the slab format");
static_assert(offsetof(SlabPage, pages_or_first) == 4 && offsetof(SlabPage, prev) == 8 &&
                  offsetof(SlabPage, next) == 12 && offsetof(SlabPage, used_blocks) == 16 &&
                  offsetof(SlabPage, carved_blocks) == 20 && offsetof(SlabPage, word) == 24,
              "SlabPage is part of the slab format");

// One per size class: its constants (written by Format, checked by Attach), its list of spans
// with a free block, and its counters. One cache line, so an allocation dirties one range here.
struct SlabClassRecord {
  uint32_t block_bytes;
  uint32_t span_pages;       // pages per span
  uint32_t blocks_per_span;  // span_pages * page_bytes / block_bytes
  uint32_t partial_head;     // first span of the class with a free block, or kNoPage
  uint64_t spans;            // spans of this class now
  uint64_t used_blocks;      // blocks allocated now
  uint64_t allocations;      // allocations this class served since Format (cumulative)
  uint64_t requested_bytes;  // bytes those allocations asked for (cumulative)
  uint64_t reserved[2];
};
static_assert(sizeof(SlabClassRecord) == 64, "SlabClassRecord is part of the slab format");

struct SlabHeader {
  // Identity: written once by Format; Attach checks it against the span (identity_checksum is
  // util::WordChecksum, seeded with kSlabMagic, of the 64 bytes before it).
  uint64_t magic;  // kSlabMagic
  uint32_t format_version;
  uint32_t header_bytes;  // sizeof(SlabHeader)
  uint64_t region_bytes;  // bytes the allocator manages (the span Format got)
  uint64_t page_bytes;
  uint64_t page_count;
  uint64_t descriptors_offset;
  uint64_t data_offset;  // page 0's offset
  uint32_t class_count;  // kSlabClassCount
  uint32_t bin_count;    // kSlabBinCount
  uint64_t identity_checksum;

  // Page heap.
  uint64_t free_pages;
  uint64_t bin_bitmap[kSlabBinBitmapWords];  // bit b set iff bin_heads[b] != kNoPage

  // Large blocks (> kSlabMaxSmallBytes): page runs.
  uint64_t large_blocks;           // now
  uint64_t large_pages;            // now
  uint64_t large_requested_bytes;  // bytes the live large blocks asked for
  uint64_t large_allocations;      // since Format (cumulative)
  uint64_t reserved[2];

  uint32_t bin_heads[kSlabBinCount];  // first free run of each bin, or kNoPage

  SlabClassRecord classes[kSlabClassCount];
};
static_assert(offsetof(SlabHeader, identity_checksum) == 64, "the checksum covers 8 words");
static_assert(offsetof(SlabHeader, bin_heads) == 144, "SlabHeader is part of the slab format");
static_assert(offsetof(SlabHeader, classes) == 640, "class records are cache-line aligned");
static_assert(sizeof(SlabHeader) == 640 + 64 * kSlabClassCount,
              "SlabHeader is part of the slab format");

}  // namespace mica

#endif  // HERD_MICA_SLAB_LAYOUT_H_
