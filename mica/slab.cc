// Why the slab allocator is shaped as it is (the contract is in slab.h, the bytes in
// slab_layout.h).
//
// Size classes: 64 B, then 4 per doubling to 8 KiB (80, 96, 112, 128, 160, ..., 7168, 8192): 29
// classes. Rounding waste (block - asked) / asked, averaged over sizes 65 B..8 KiB, uniform /
// log-uniform: powers of two (8 classes) 39% / 44%, worst 50% of the block; 2 per doubling
// (15) 18% / 20%; 4 per doubling 8.9% / 9.4%, worst 20% of the block (24% of what was asked:
// 129 B -> 160 B); 8 per doubling (57) 4.4% / 4.5%, but twice the classes, each holding a
// partly used span (stranded memory grows with the class count). Measured on churned item
// workloads (tests/mica/slab_test.cc): 8-9% rounding on small items. The class of a size is
// arithmetic (its bit width and the two bits below its top bit), no table, no search.
//
// Pages and spans: the data area is page_bytes pages (4 KiB by default). A class takes a span of
// 1..7 pages (the fewest whose leftover tail is <= 1/32 of the span) from the page heap when it
// has no free block, and gives it back when its last block is freed, so memory moves between
// classes and to large blocks as the workload changes. 4 KiB pages rather than 64 KiB or 2 MiB:
// large blocks are page runs, so the page is their rounding unit (a 9 KiB value in 64 KiB would
// waste 86%), and a span per class stranded by one live block costs 4-28 KiB instead of
// 29 x 2 MiB. TLB reach does not depend on this choice: it is the region's hugepage backing.
// The price is a 32-byte descriptor per page: 0.78% of the region.
//
// Large blocks (> 8 KiB) are runs of whole pages from the same heap: segregated fits over free
// runs (TLSF: bins four per doubling of the run length, a two-word bitmap of non-empty bins, a
// request takes the head of the first non-empty bin whose runs all fit, and the rest of that run
// goes back), with boundary tags (first and last page of each run) so a freed run merges with
// free neighbours in O(1). A buddy system would round a 1 MiB value's item (1 MiB + ~300 B) to
// 2 MiB; here it takes 257 pages (0.4% waste). The page unit costs most just past the classes:
// 8193 B takes 12 KiB (33% of the block); churned values of 8..64 KiB measure 7.6%.
//
// An emptied span goes back to the heap at once (no cached empty span per class): memory moves
// as soon as a class shrinks, and a class that flips between 0 and 1 live blocks pays a span's
// descriptors (1..7) and a coalescing free per flip, still O(1). Spans with a free block and
// runs in a bin are LIFO lists: O(1), and the span just freed into is warm in cache.
//
// Per operation, one small allocation from a span with a free block touches its descriptor,
// its class record and the block's tag word (3 dirty ranges); the worst case (a free that
// releases a span and merges it with free runs on both sides) about 12.

#include "mica/slab.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "util/round_up.h"
#include "util/word_checksum.h"

namespace mica {
namespace {

// A span takes the fewest pages (at most kSlabMaxSpanPages) whose tail after its last block is
// at most 1/kSpanTailFraction of the span: with 4 KiB pages, 1..7 pages and tails of 0..2.3%.
constexpr uint64_t kSpanTailFraction = 32;

// Descriptors start on a cache line after the header.
constexpr uint64_t kDescriptorAlignment = 64;

// Offset of the second word of a free small block (the tag; the first is the link).
constexpr uint64_t kTagOffset = 8;

uint64_t SpanPagesFor(uint64_t block_bytes, uint64_t page_bytes) {
  uint64_t best = 0;
  uint64_t best_tail = 0;
  for (uint64_t k = 1; k <= kSlabMaxSpanPages; ++k) {
    const uint64_t span = k * page_bytes;
    if (span < block_bytes) continue;
    const uint64_t tail = span % block_bytes;
    if (tail * kSpanTailFraction <= span) return k;
    // Otherwise the k with the smallest tail fraction (tail / span).
    if (best == 0 || tail * best * page_bytes < best_tail * span) {
      best = k;
      best_tail = tail;
    }
  }
  return best;
}

// Free-run bins: runs of 1..3 pages have bins 1..3 (bin 0 is never used); a run of n >= 4 pages,
// with fl = floor(log2 n), goes to bin 4 * (fl - 1) + the two bits below n's top bit.
int BinOf(uint64_t pages) {
  if (pages < 4) return static_cast<int>(pages);
  const int fl = std::bit_width(pages) - 1;
  return 4 * (fl - 1) + static_cast<int>((pages >> (fl - 2)) & 3);
}
// The shortest run bin `bin` holds.
uint64_t BinMinPages(int bin) {
  if (bin < 4) return static_cast<uint64_t>(bin);
  const int fl = bin / 4 + 1;
  return (uint64_t{1} << fl) + (static_cast<uint64_t>(bin % 4) << (fl - 2));
}

uint64_t IdentityChecksum(const SlabHeader& header) {
  constexpr uint64_t kWords = offsetof(SlabHeader, identity_checksum) / sizeof(uint64_t);
  uint64_t words[kWords];
  std::memcpy(words, &header, sizeof(words));
  util::WordChecksum checksum(kSlabMagic, sizeof(words));
  for (uint64_t word : words) checksum.Absorb(word);
  return checksum.Finish();
}

struct Layout {
  uint64_t page_count = 0;
  uint64_t descriptors_offset = 0;
  uint64_t data_offset = 0;
};

// The most pages (with their descriptors, after the header) that fit in region_bytes.
absl::StatusOr<Layout> ComputeLayout(uint64_t region_bytes, uint64_t page_bytes) {
  Layout layout;
  layout.descriptors_offset = util::RoundUp(sizeof(SlabHeader), kDescriptorAlignment);
  const auto data_offset = [&](uint64_t pages) {
    return util::RoundUp(layout.descriptors_offset + pages * sizeof(SlabPage), page_bytes);
  };
  const auto fits = [&](uint64_t pages) {
    return data_offset(pages) + pages * page_bytes <= region_bytes;
  };
  uint64_t pages = 0;
  if (region_bytes > layout.descriptors_offset) {
    pages = (region_bytes - layout.descriptors_offset) / (page_bytes + sizeof(SlabPage));
    // The estimate ignores the rounding of data_offset: one page less always absorbs it.
    while (pages > 0 && !fits(pages)) --pages;
    while (fits(pages + 1)) ++pages;
  }
  if (pages == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slab region of ", region_bytes, " bytes holds no ", page_bytes,
                     "-byte page after its ", layout.descriptors_offset, "-byte header"));
  }
  if (pages >= kNoPage) {
    return absl::InvalidArgumentError(absl::StrCat("slab region of ", region_bytes,
                                                   " bytes has more pages than a 32-bit page "
                                                   "index names; use larger pages"));
  }
  layout.page_count = pages;
  layout.data_offset = data_offset(pages);
  return layout;
}

}  // namespace

absl::Status ValidateSlabConfig(const SlabConfig& config) {
  if (!std::has_single_bit(config.page_bytes) || config.page_bytes < kSlabMinPageBytes ||
      config.page_bytes > kSlabMaxPageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("slab page_bytes ", config.page_bytes,
                                                   " is not a power of two in [", kSlabMinPageBytes,
                                                   ", ", kSlabMaxPageBytes, "]"));
  }
  return absl::OkStatus();
}

SlabAllocator::SlabAllocator(uint8_t* base, const SlabHeader& header)
    : base_(base),
      pages_(reinterpret_cast<SlabPage*>(base + header.descriptors_offset)),
      region_bytes_(header.region_bytes),
      page_bytes_(header.page_bytes),
      page_shift_(std::countr_zero(header.page_bytes)),
      page_count_(header.page_count),
      data_offset_(header.data_offset) {}

absl::StatusOr<SlabAllocator> SlabAllocator::Format(absl::Span<uint8_t> region,
                                                    const SlabConfig& config) {
  if (absl::Status s = ValidateSlabConfig(config); !s.ok()) return s;
  if (reinterpret_cast<uintptr_t>(region.data()) % kSlabRegionAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slab region must start ", kSlabRegionAlignment, "-byte aligned"));
  }
  absl::StatusOr<Layout> layout = ComputeLayout(region.size(), config.page_bytes);
  if (!layout.ok()) return layout.status();

  SlabHeader header;
  std::memset(&header, 0, sizeof(header));
  header.magic = kSlabMagic;
  header.format_version = kSlabFormatVersion;
  header.header_bytes = sizeof(SlabHeader);
  header.region_bytes = region.size();
  header.page_bytes = config.page_bytes;
  header.page_count = layout->page_count;
  header.descriptors_offset = layout->descriptors_offset;
  header.data_offset = layout->data_offset;
  header.class_count = kSlabClassCount;
  header.bin_count = kSlabBinCount;
  header.identity_checksum = IdentityChecksum(header);
  for (int b = 0; b < kSlabBinCount; ++b) header.bin_heads[b] = kNoPage;
  for (int c = 0; c < kSlabClassCount; ++c) {
    SlabClassRecord& record = header.classes[c];
    record.block_bytes = static_cast<uint32_t>(SlabClassBytes(c));
    record.span_pages = static_cast<uint32_t>(SpanPagesFor(record.block_bytes, config.page_bytes));
    record.blocks_per_span =
        static_cast<uint32_t>(record.span_pages * config.page_bytes / record.block_bytes);
    record.partial_head = kNoPage;
  }
  // All metadata bytes are defined (gaps zero), so two formats of one size are byte-identical;
  // every descriptor starts kPageUnused.
  std::memset(region.data(), 0, layout->data_offset);
  std::memcpy(region.data(), &header, sizeof(header));

  SlabAllocator allocator(region.data(), header);
  allocator.WriteFreeRun(0, layout->page_count);
  allocator.InsertFreeRun(0);
  allocator.header()->free_pages = layout->page_count;
  return allocator;
}

absl::StatusOr<SlabAllocator> SlabAllocator::Attach(absl::Span<uint8_t> region) {
  if (region.size() < sizeof(SlabHeader)) {
    return absl::InvalidArgumentError(absl::StrCat("slab region truncated: ", region.size(),
                                                   " bytes is less than its ", sizeof(SlabHeader),
                                                   "-byte header"));
  }
  if (reinterpret_cast<uintptr_t>(region.data()) % kSlabRegionAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slab region must start ", kSlabRegionAlignment, "-byte aligned"));
  }
  SlabHeader header;
  std::memcpy(&header, region.data(), sizeof(header));
  if (header.magic != kSlabMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not a slab region: magic %#x, want %#x", header.magic, kSlabMagic));
  }
  if (header.format_version != kSlabFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("slab format version ", header.format_version,
                                                   "; this build reads ", kSlabFormatVersion));
  }
  if (header.region_bytes > region.size()) {
    return absl::InvalidArgumentError(absl::StrCat("slab region truncated: its header describes ",
                                                   header.region_bytes, " bytes, the span has ",
                                                   region.size()));
  }
  if (IdentityChecksum(header) != header.identity_checksum) {
    return absl::DataLossError("slab header damaged: its identity checksum does not match");
  }
  // The checksum vouches for the identity; what follows checks that it is one Format writes.
  if (header.header_bytes != sizeof(SlabHeader) || header.class_count != kSlabClassCount ||
      header.bin_count != kSlabBinCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("slab header of ", header.header_bytes, " bytes with ", header.class_count,
                     " classes and ", header.bin_count, " bins; this build has ",
                     sizeof(SlabHeader), ", ", kSlabClassCount, " and ", kSlabBinCount));
  }
  if (absl::Status s = ValidateSlabConfig(SlabConfig{.page_bytes = header.page_bytes}); !s.ok()) {
    return s;
  }
  absl::StatusOr<Layout> layout = ComputeLayout(header.region_bytes, header.page_bytes);
  if (!layout.ok()) return layout.status();
  if (layout->page_count != header.page_count ||
      layout->descriptors_offset != header.descriptors_offset ||
      layout->data_offset != header.data_offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slab header layout (", header.page_count, " pages, descriptors at ",
        header.descriptors_offset, ", data at ", header.data_offset, ") is not the one ",
        header.region_bytes, " bytes of ", header.page_bytes, "-byte pages give"));
  }
  for (int c = 0; c < kSlabClassCount; ++c) {
    const SlabClassRecord& record = header.classes[c];
    const uint64_t span_pages = SpanPagesFor(SlabClassBytes(c), header.page_bytes);
    if (record.block_bytes != SlabClassBytes(c) || record.span_pages != span_pages ||
        record.blocks_per_span != span_pages * header.page_bytes / SlabClassBytes(c)) {
      return absl::InvalidArgumentError(absl::StrCat("slab class ", c, " record (",
                                                     record.block_bytes, " B, ", record.span_pages,
                                                     " pages) differs from this build's"));
    }
    if (record.partial_head != kNoPage && record.partial_head >= header.page_count) {
      return absl::DataLossError(absl::StrCat("slab class ", c, " list starts at page ",
                                              record.partial_head, " of ", header.page_count));
    }
  }
  for (int b = 0; b < kSlabBinCount; ++b) {
    const uint32_t head = header.bin_heads[b];
    const bool bit = (header.bin_bitmap[b / 64] >> (b % 64)) & 1;
    if ((head != kNoPage && head >= header.page_count) || bit != (head != kNoPage)) {
      return absl::DataLossError(absl::StrCat("slab bin ", b, " starts at page ", head,
                                              " (bitmap bit ", bit ? 1 : 0, ")"));
    }
  }
  if (header.free_pages > header.page_count || header.large_pages > header.page_count) {
    return absl::DataLossError(absl::StrCat("slab header counts ", header.free_pages, " free and ",
                                            header.large_pages, " large pages of ",
                                            header.page_count));
  }
  return SlabAllocator(region.data(), header);
}

uint64_t SlabAllocator::LoadWord(uint64_t offset) const {
  uint64_t word;
  std::memcpy(&word, base_ + offset, sizeof(word));
  return word;
}

void SlabAllocator::StoreWord(uint64_t offset, uint64_t value) {
  std::memcpy(base_ + offset, &value, sizeof(value));
  Dirty(base_ + offset, sizeof(value));
}

uint64_t SlabAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) bytes = 1;
  return bytes <= kSlabMaxSmallBytes ? AllocateSmall(bytes) : AllocateLarge(bytes);
}

uint64_t SlabAllocator::AllocateSmall(uint64_t bytes) {
  const int size_class = SlabClassOf(bytes);
  SlabClassRecord& record = header()->classes[size_class];
  uint32_t span_index = record.partial_head;
  bool listed = true;  // whether the span is on the class's list
  if (span_index == kNoPage) {
    span_index = TakeRun(record.span_pages);
    if (span_index == kNoPage) return kNoBlock;
    SlabPage* head = page(span_index);
    *head = SlabPage{};
    head->kind = kPageSpanHead;
    head->size_class = static_cast<uint8_t>(size_class);
    head->pages_or_first = record.span_pages;
    head->prev = kNoPage;
    head->next = kNoPage;
    head->word = kNoBlock;
    for (uint32_t i = 1; i < record.span_pages; ++i) {
      SlabPage* inner = page(span_index + i);
      inner->kind = kPageSpanInner;
      inner->pages_or_first = span_index;
    }
    Dirty(head, uint64_t{record.span_pages} * sizeof(SlabPage));
    ++record.spans;
    listed = false;
  }
  SlabPage* span = page(span_index);
  uint64_t block;
  if (span->word != kNoBlock) {
    block = span->word;
    DCHECK_EQ(LoadWord(block + kTagOffset), kFreeBlockTag ^ block)
        << "the free block at " << block << " was written to while free";
    span->word = LoadWord(block);
  } else {
    // Lazy carving: the next never-used block.
    block = PageOffset(span_index) + uint64_t{span->carved_blocks} * record.block_bytes;
    ++span->carved_blocks;
  }
  StoreWord(block + kTagOffset, 0);  // no longer looks free
  ++span->used_blocks;
  Dirty(span);
  if (span->used_blocks == record.blocks_per_span) {
    if (listed) UnlinkSpan(size_class, span_index);
  } else if (!listed) {
    LinkSpan(size_class, span_index);
  }
  ++record.used_blocks;
  ++record.allocations;
  record.requested_bytes += bytes;
  Dirty(&record);
  return block;
}

uint64_t SlabAllocator::AllocateLarge(uint64_t bytes) {
  const uint64_t pages = (bytes >> page_shift_) + ((bytes & (page_bytes_ - 1)) != 0);
  if (pages > page_count_) return kNoBlock;
  const uint32_t first = TakeRun(pages);
  if (first == kNoPage) return kNoBlock;
  SlabPage* head = page(first);
  head->kind = kPageLargeHead;
  head->pages_or_first = static_cast<uint32_t>(pages);
  head->prev = kNoPage;
  head->next = kNoPage;
  head->word = bytes;
  Dirty(head);
  if (pages > 1) {
    SlabPage* tail = page(first + static_cast<uint32_t>(pages) - 1);
    tail->kind = kPageLargeTail;
    tail->pages_or_first = first;
    Dirty(tail);
  }
  SlabHeader* h = header();
  ++h->large_blocks;
  h->large_pages += pages;
  h->large_requested_bytes += bytes;
  ++h->large_allocations;
  Dirty(&h->large_blocks, 4 * sizeof(uint64_t));
  return PageOffset(first);
}

void SlabAllocator::Free(uint64_t offset) {
  if (TryFree(offset)) return;
  DLOG(FATAL) << "SlabAllocator::Free(" << offset << "): no live block starts there";
  if (rejected_frees_ % 1024 == 1) {
    LOG(ERROR) << "SlabAllocator::Free(" << offset << "): no live block starts there; ignored ("
               << rejected_frees_ << " so far)";
  }
}

bool SlabAllocator::TryFree(uint64_t offset) {
  if (const uint32_t span = SpanOfBlock(offset, /*check_free_list=*/true); span != kNoPage) {
    FreeSmall(span, offset);
    return true;
  }
  if (const uint32_t first = LargeOfBlock(offset); first != kNoPage) {
    FreeLarge(first);
    return true;
  }
  ++rejected_frees_;
  return false;
}

uint64_t SlabAllocator::BlockBytesFor(uint64_t bytes) const {
  return SlabBlockBytesFor(bytes, page_bytes_);
}

SlabAllocator::ClassUsage SlabAllocator::ClassUsageOf(int size_class) const {
  const SlabClassRecord& c = header()->classes[size_class];
  return ClassUsage{c.spans, c.used_blocks, c.blocks_per_span, c.block_bytes};
}

SlabAllocator::PageUsage SlabAllocator::PageUsageNow() const {
  const SlabHeader* h = header();
  return PageUsage{h->free_pages, h->large_blocks, h->large_pages};
}

uint64_t SlabAllocator::BlockBytes(uint64_t offset) const {
  if (const uint32_t span = SpanOfBlock(offset, /*check_free_list=*/false); span != kNoPage) {
    return header()->classes[page(span)->size_class].block_bytes;
  }
  if (const uint32_t first = LargeOfBlock(offset); first != kNoPage) {
    return uint64_t{page(first)->pages_or_first} << page_shift_;
  }
  return 0;
}

uint32_t SlabAllocator::SpanOfBlock(uint64_t offset, bool check_free_list) const {
  if (offset < data_offset_ || offset - data_offset_ >= (page_count_ << page_shift_)) {
    return kNoPage;
  }
  const uint32_t index = static_cast<uint32_t>((offset - data_offset_) >> page_shift_);
  const SlabPage* d = page(index);
  uint32_t first;
  if (d->kind == kPageSpanHead) {
    first = index;
  } else if (d->kind == kPageSpanInner && d->pages_or_first < page_count_) {
    first = d->pages_or_first;
  } else {
    return kNoPage;
  }
  const SlabPage* head = page(first);
  if (head->kind != kPageSpanHead || head->size_class >= kSlabClassCount) return kNoPage;
  const SlabClassRecord& record = header()->classes[head->size_class];
  if (index - first >= record.span_pages) return kNoPage;  // also rejects first > index
  // Within a span (< 8 pages of at most 64 KiB): 32-bit division.
  const uint32_t in_span = static_cast<uint32_t>(offset - PageOffset(first));
  const uint32_t block = in_span / record.block_bytes;
  if (in_span != block * record.block_bytes || block >= head->carved_blocks) return kNoPage;
  if (check_free_list && LoadWord(offset + kTagOffset) == (kFreeBlockTag ^ offset)) {
    // Looks free; a live block may hold these bytes by chance, so look it up.
    uint64_t steps = head->carved_blocks - head->used_blocks;
    for (uint64_t b = head->word; b != kNoBlock && steps > 0; b = LoadWord(b), --steps) {
      if (b == offset) return kNoPage;  // a double free
    }
  }
  return first;
}

uint32_t SlabAllocator::LargeOfBlock(uint64_t offset) const {
  if (offset < data_offset_ || offset - data_offset_ >= (page_count_ << page_shift_)) {
    return kNoPage;
  }
  if (((offset - data_offset_) & (page_bytes_ - 1)) != 0) return kNoPage;
  const uint32_t index = static_cast<uint32_t>((offset - data_offset_) >> page_shift_);
  return page(index)->kind == kPageLargeHead ? index : kNoPage;
}

void SlabAllocator::FreeSmall(uint32_t span_index, uint64_t offset) {
  SlabPage* span = page(span_index);
  const int size_class = span->size_class;
  SlabClassRecord& record = header()->classes[size_class];
  const bool was_full = span->used_blocks == record.blocks_per_span;
  --record.used_blocks;
  Dirty(&record);
  if (span->used_blocks == 1) {
    // The span's last block: the whole span goes back to the page heap.
    if (!was_full) UnlinkSpan(size_class, span_index);
    --record.spans;
    std::memset(span, 0, uint64_t{record.span_pages} * sizeof(SlabPage));
    Dirty(span, uint64_t{record.span_pages} * sizeof(SlabPage));
    ReleaseRun(span_index, record.span_pages);
    return;
  }
  StoreWord(offset, span->word);
  StoreWord(offset + kTagOffset, kFreeBlockTag ^ offset);
  span->word = offset;
  --span->used_blocks;
  Dirty(span);
  if (was_full) LinkSpan(size_class, span_index);
}

void SlabAllocator::FreeLarge(uint32_t first) {
  SlabPage* head = page(first);
  const uint64_t pages = head->pages_or_first;
  SlabHeader* h = header();
  --h->large_blocks;
  h->large_pages -= pages;
  h->large_requested_bytes -= head->word;
  Dirty(&h->large_blocks, 3 * sizeof(uint64_t));
  *head = SlabPage{};
  Dirty(head);
  if (pages > 1) {
    SlabPage* tail = page(first + static_cast<uint32_t>(pages) - 1);
    *tail = SlabPage{};
    Dirty(tail);
  }
  ReleaseRun(first, pages);
}

void SlabAllocator::LinkSpan(int size_class, uint32_t span_index) {
  SlabClassRecord& record = header()->classes[size_class];
  SlabPage* span = page(span_index);
  span->prev = kNoPage;
  span->next = record.partial_head;
  Dirty(span);
  if (record.partial_head != kNoPage) {
    page(record.partial_head)->prev = span_index;
    Dirty(page(record.partial_head));
  }
  record.partial_head = span_index;
  Dirty(&record);
}

void SlabAllocator::UnlinkSpan(int size_class, uint32_t span_index) {
  SlabClassRecord& record = header()->classes[size_class];
  SlabPage* span = page(span_index);
  if (span->prev != kNoPage) {
    page(span->prev)->next = span->next;
    Dirty(page(span->prev));
  } else {
    record.partial_head = span->next;
    Dirty(&record);
  }
  if (span->next != kNoPage) {
    page(span->next)->prev = span->prev;
    Dirty(page(span->next));
  }
  span->prev = kNoPage;
  span->next = kNoPage;
  Dirty(span);
}

uint32_t SlabAllocator::TakeRun(uint64_t pages) {
  SlabHeader* h = header();
  const int own_bin = BinOf(pages);
  // Good fit: the first non-empty bin whose every run is long enough.
  const int from = BinMinPages(own_bin) < pages ? own_bin + 1 : own_bin;
  uint32_t first = kNoPage;
  for (int word = from / 64; word < kSlabBinBitmapWords && from < kSlabBinCount; ++word) {
    uint64_t bits = h->bin_bitmap[word];
    if (word == from / 64) bits &= ~uint64_t{0} << (from % 64);
    if (bits != 0) {
      first = h->bin_heads[word * 64 + std::countr_zero(bits)];
      break;
    }
  }
  if (first == kNoPage) {
    // Near full: a run of the request's own bin may still be long enough (first fit).
    for (uint32_t p = h->bin_heads[own_bin]; p != kNoPage; p = page(p)->next) {
      if (page(p)->pages_or_first >= pages) {
        first = p;
        break;
      }
    }
    if (first == kNoPage) return kNoPage;
  }
  const uint64_t run_pages = page(first)->pages_or_first;
  RemoveFreeRun(first);
  // The taken pages come back all kPageUnused: clear the run's tags that fall inside them.
  *page(first) = SlabPage{};
  Dirty(page(first));
  if (run_pages > pages) {
    WriteFreeRun(first + static_cast<uint32_t>(pages), run_pages - pages);
    InsertFreeRun(first + static_cast<uint32_t>(pages));
  } else if (run_pages > 1) {
    SlabPage* tail = page(first + static_cast<uint32_t>(run_pages) - 1);
    *tail = SlabPage{};
    Dirty(tail);
  }
  h->free_pages -= pages;
  Dirty(&h->free_pages);
  return first;
}

void SlabAllocator::ReleaseRun(uint32_t first, uint64_t pages) {
  uint32_t start = first;
  uint64_t length = pages;
  if (first > 0) {
    SlabPage* left = page(first - 1);
    uint32_t left_first = kNoPage;
    if (left->kind == kPageFreeTail) left_first = left->pages_or_first;
    if (left->kind == kPageFreeHead) left_first = first - 1;  // a one-page run
    if (left_first != kNoPage) {
      length += page(left_first)->pages_or_first;
      RemoveFreeRun(left_first);
      *left = SlabPage{};  // inside the merged run now (rewritten if it is its head)
      Dirty(left);
      start = left_first;
    }
  }
  const uint64_t end = uint64_t{first} + pages;
  if (end < page_count_) {
    SlabPage* right = page(static_cast<uint32_t>(end));
    if (right->kind == kPageFreeHead) {
      length += right->pages_or_first;
      RemoveFreeRun(static_cast<uint32_t>(end));
      *right = SlabPage{};  // inside the merged run now (rewritten if it is its tail)
      Dirty(right);
    }
  }
  WriteFreeRun(start, length);
  InsertFreeRun(start);
  header()->free_pages += pages;
  Dirty(&header()->free_pages);
}

void SlabAllocator::WriteFreeRun(uint32_t first, uint64_t pages) {
  SlabPage* head = page(first);
  *head = SlabPage{};
  head->kind = kPageFreeHead;
  head->pages_or_first = static_cast<uint32_t>(pages);
  head->prev = kNoPage;
  head->next = kNoPage;
  Dirty(head);
  if (pages > 1) {
    SlabPage* tail = page(first + static_cast<uint32_t>(pages) - 1);
    *tail = SlabPage{};
    tail->kind = kPageFreeTail;
    tail->pages_or_first = first;
    Dirty(tail);
  }
}

void SlabAllocator::InsertFreeRun(uint32_t first) {
  SlabHeader* h = header();
  SlabPage* run = page(first);
  const int bin = BinOf(run->pages_or_first);
  run->prev = kNoPage;
  run->next = h->bin_heads[bin];
  Dirty(run);
  if (run->next != kNoPage) {
    page(run->next)->prev = first;
    Dirty(page(run->next));
  } else {
    SetBinBit(bin, true);
  }
  h->bin_heads[bin] = first;
  Dirty(&h->bin_heads[bin]);
}

void SlabAllocator::RemoveFreeRun(uint32_t first) {
  SlabHeader* h = header();
  SlabPage* run = page(first);
  const int bin = BinOf(run->pages_or_first);
  if (run->prev != kNoPage) {
    page(run->prev)->next = run->next;
    Dirty(page(run->prev));
  } else {
    h->bin_heads[bin] = run->next;
    Dirty(&h->bin_heads[bin]);
    if (run->next == kNoPage) SetBinBit(bin, false);
  }
  if (run->next != kNoPage) {
    page(run->next)->prev = run->prev;
    Dirty(page(run->next));
  }
  run->prev = kNoPage;
  run->next = kNoPage;
  Dirty(run);
}

void SlabAllocator::SetBinBit(int bin, bool on) {
  uint64_t& word = header()->bin_bitmap[bin / 64];
  const uint64_t bit = uint64_t{1} << (bin % 64);
  word = on ? (word | bit) : (word & ~bit);
  Dirty(&word);
}

SlabStats SlabAllocator::Stats() const {
  const SlabHeader& h = *header();
  SlabStats stats;
  stats.page_bytes = page_bytes_;
  stats.page_count = page_count_;
  stats.free_pages = h.free_pages;
  stats.data_offset = data_offset_;
  for (int b = kSlabBinCount - 1; b > 0; --b) {
    if (h.bin_heads[b] == kNoPage) continue;
    // Runs of lower bins are shorter than any of this one.
    for (uint32_t p = h.bin_heads[b]; p != kNoPage; p = page(p)->next) {
      stats.largest_free_run = std::max<uint64_t>(stats.largest_free_run, page(p)->pages_or_first);
    }
    break;
  }
  for (int c = 0; c < kSlabClassCount; ++c) {
    const SlabClassRecord& record = h.classes[c];
    SlabClassStats& s = stats.classes[c];
    s.block_bytes = record.block_bytes;
    s.span_pages = record.span_pages;
    s.spans = record.spans;
    s.used_blocks = record.used_blocks;
    s.free_blocks = record.spans * record.blocks_per_span - record.used_blocks;
    s.used_bytes = record.used_blocks * record.block_bytes;
    s.span_tail_bytes = record.spans * (uint64_t{record.span_pages} * page_bytes_ -
                                        uint64_t{record.blocks_per_span} * record.block_bytes);
    s.allocations = record.allocations;
    s.requested_bytes = record.requested_bytes;
    s.rounding_bytes = record.allocations * record.block_bytes - record.requested_bytes;
    stats.span_pages += record.spans * record.span_pages;
  }
  stats.large_blocks = h.large_blocks;
  stats.large_pages = h.large_pages;
  stats.large_requested_bytes = h.large_requested_bytes;
  stats.large_rounding_bytes = (h.large_pages << page_shift_) - h.large_requested_bytes;
  stats.large_allocations = h.large_allocations;
  return stats;
}

bool SlabAllocator::CheckInvariants(std::string* why) const {
  const auto fail = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  const SlabHeader& h = *header();
  if (h.magic != kSlabMagic || h.identity_checksum != IdentityChecksum(h) ||
      h.page_count != page_count_ || h.data_offset != data_offset_ || h.page_bytes != page_bytes_ ||
      h.region_bytes != region_bytes_) {
    return fail("header identity changed since Format");
  }

  // 1. Runs tile the pages: walk them in address order.
  uint64_t free_pages = 0;
  uint64_t free_runs = 0;
  uint64_t large_blocks = 0;
  uint64_t large_pages = 0;
  uint64_t large_requested = 0;
  std::array<uint64_t, kSlabClassCount> spans{};
  std::array<uint64_t, kSlabClassCount> used{};
  std::array<uint64_t, kSlabClassCount> partial{};
  uint64_t max_blocks = 0;
  for (int c = 0; c < kSlabClassCount; ++c) {
    max_blocks = std::max<uint64_t>(max_blocks, h.classes[c].blocks_per_span);
  }
  std::vector<uint32_t> seen_in_span(max_blocks, kNoPage);  // block -> span that saw it free
  // A page inside a free or large run is kPageUnused, and all zero (what TakeRun hands out).
  const auto inner_unused = [&](uint64_t from, uint64_t to) -> bool {
    static constexpr SlabPage kZero{};
    for (uint64_t q = from; q < to; ++q) {
      if (std::memcmp(&pages_[q], &kZero, sizeof(SlabPage)) != 0) return false;
    }
    return true;
  };
  bool previous_free = false;
  for (uint64_t p = 0; p < page_count_;) {
    const SlabPage& d = pages_[p];
    uint64_t n = 0;
    if (d.kind == kPageFreeHead) {
      n = d.pages_or_first;
      if (n == 0 || p + n > page_count_) return fail(absl::StrCat("free run at ", p, " of ", n));
      if (previous_free) return fail(absl::StrCat("free runs meet at page ", p, " (uncoalesced)"));
      if (n > 1 &&
          (pages_[p + n - 1].kind != kPageFreeTail || pages_[p + n - 1].pages_or_first != p)) {
        return fail(absl::StrCat("free run at ", p, " lacks its tail tag"));
      }
      if (!inner_unused(p + 1, p + n - 1)) {
        return fail(absl::StrCat("free run at ", p, " has a tagged page inside"));
      }
      free_pages += n;
      ++free_runs;
      previous_free = true;
    } else if (d.kind == kPageSpanHead) {
      if (d.size_class >= kSlabClassCount) return fail(absl::StrCat("span ", p, ": bad class"));
      const SlabClassRecord& record = h.classes[d.size_class];
      n = record.span_pages;
      if (d.pages_or_first != n || p + n > page_count_) {
        return fail(absl::StrCat("span ", p, " of ", d.pages_or_first, " pages, class says ", n));
      }
      for (uint64_t q = p + 1; q < p + n; ++q) {
        if (pages_[q].kind != kPageSpanInner || pages_[q].pages_or_first != p) {
          return fail(absl::StrCat("span ", p, ": page ", q, " is not its inner page"));
        }
      }
      if (d.used_blocks == 0 || d.used_blocks > d.carved_blocks ||
          d.carved_blocks > record.blocks_per_span) {
        return fail(absl::StrCat("span ", p, ": ", d.used_blocks, " used, ", d.carved_blocks,
                                 " carved of ", record.blocks_per_span));
      }
      // Its free list: acyclic, inside the span, on carved block starts, each tagged.
      const uint64_t start = PageOffset(static_cast<uint32_t>(p));
      uint64_t free_count = 0;
      for (uint64_t b = d.word; b != kNoBlock; b = LoadWord(b)) {
        if (b < start || b - start >= uint64_t{d.carved_blocks} * record.block_bytes ||
            (b - start) % record.block_bytes != 0) {
          return fail(absl::StrCat("span ", p, ": free list reaches offset ", b));
        }
        const uint64_t block = (b - start) / record.block_bytes;
        if (seen_in_span[block] == p) {
          return fail(absl::StrCat("span ", p, ": free list revisits ", b, " (a cycle)"));
        }
        seen_in_span[block] = static_cast<uint32_t>(p);
        if (LoadWord(b + kTagOffset) != (kFreeBlockTag ^ b)) {
          return fail(absl::StrCat("span ", p, ": free block ", b, " lost its tag"));
        }
        ++free_count;
      }
      if (free_count != d.carved_blocks - d.used_blocks) {
        return fail(absl::StrCat("span ", p, ": ", free_count, " blocks on its free list, ",
                                 d.carved_blocks - d.used_blocks, " carved and unused"));
      }
      ++spans[d.size_class];
      used[d.size_class] += d.used_blocks;
      if (d.used_blocks < record.blocks_per_span) ++partial[d.size_class];
      previous_free = false;
    } else if (d.kind == kPageLargeHead) {
      n = d.pages_or_first;
      if (n == 0 || p + n > page_count_) return fail(absl::StrCat("large run at ", p, " of ", n));
      if (d.word <= kSlabMaxSmallBytes || ((d.word + page_bytes_ - 1) >> page_shift_) != n) {
        return fail(absl::StrCat("large run at ", p, " of ", n, " pages for ", d.word, " bytes"));
      }
      if (n > 1 &&
          (pages_[p + n - 1].kind != kPageLargeTail || pages_[p + n - 1].pages_or_first != p)) {
        return fail(absl::StrCat("large run at ", p, " lacks its tail tag"));
      }
      if (!inner_unused(p + 1, p + n - 1)) {
        return fail(absl::StrCat("large run at ", p, " has a tagged page inside"));
      }
      ++large_blocks;
      large_pages += n;
      large_requested += d.word;
      previous_free = false;
    } else {
      return fail(absl::StrCat("page ", p, " has kind ", static_cast<int>(d.kind),
                               " where a run should begin"));
    }
    p += n;
  }
  if (free_pages != h.free_pages) {
    return fail(absl::StrCat(free_pages, " free pages, the header counts ", h.free_pages));
  }
  if (large_blocks != h.large_blocks || large_pages != h.large_pages ||
      large_requested != h.large_requested_bytes) {
    return fail("large-block counters do not match the runs");
  }

  // 2. Each free run is in the bin of its length, once; the bitmap says which bins have any.
  std::vector<uint8_t> listed(page_count_, 0);
  uint64_t listed_runs = 0;
  for (int b = 0; b < kSlabBinCount; ++b) {
    const bool bit = (h.bin_bitmap[b / 64] >> (b % 64)) & 1;
    if (bit != (h.bin_heads[b] != kNoPage)) return fail(absl::StrCat("bin ", b, ": bitmap"));
    uint32_t previous = kNoPage;
    for (uint32_t p = h.bin_heads[b]; p != kNoPage; p = pages_[p].next) {
      if (p >= page_count_ || pages_[p].kind != kPageFreeHead || listed[p]) {
        return fail(absl::StrCat("bin ", b, " lists page ", p, " (no free run, or twice)"));
      }
      if (BinOf(pages_[p].pages_or_first) != b || pages_[p].prev != previous) {
        return fail(absl::StrCat("bin ", b, ": run ", p, " misfiled or mislinked"));
      }
      listed[p] = 1;
      ++listed_runs;
      previous = p;
    }
  }
  if (listed_runs != free_runs) {
    return fail(absl::StrCat(free_runs, " free runs, ", listed_runs, " in bins"));
  }

  // 3. Each class lists exactly its spans that have a free block; counters match.
  for (int c = 0; c < kSlabClassCount; ++c) {
    const SlabClassRecord& record = h.classes[c];
    uint64_t listed_spans = 0;
    uint32_t previous = kNoPage;
    for (uint32_t p = record.partial_head; p != kNoPage; p = pages_[p].next) {
      if (p >= page_count_ || pages_[p].kind != kPageSpanHead || pages_[p].size_class != c ||
          listed[p] || pages_[p].used_blocks >= record.blocks_per_span ||
          pages_[p].prev != previous) {
        return fail(absl::StrCat("class ", c, " lists page ", p, " wrongly"));
      }
      listed[p] = 1;
      ++listed_spans;
      previous = p;
    }
    if (listed_spans != partial[c]) {
      return fail(absl::StrCat("class ", c, ": ", partial[c], " spans with a free block, ",
                               listed_spans, " listed"));
    }
    if (record.spans != spans[c] || record.used_blocks != used[c]) {
      return fail(absl::StrCat("class ", c, " counts ", record.spans, " spans and ",
                               record.used_blocks, " blocks; found ", spans[c], " and ", used[c]));
    }
  }
  return true;
}

}  // namespace mica
