// The slab allocator (mica/slab.h) against a model of live blocks: no overlap, contents intact,
// CheckInvariants after every step; filling to kNoBlock and back without a leak; memory moving
// between classes and to large blocks; a byte copy of the region (a backup) attached and
// continuing identically, also when only the reported dirty ranges were copied; Attach's
// rejections; bad offsets to Free; and a fragmentation report over a mixed-size workload.
#include "mica/slab.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "mica/config.h"
#include "mica/item.h"

namespace mica {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
// The longest item store mode will place: a 1 MiB value, a 256 B key, header and checksum.
constexpr uint64_t kLargestItem = ItemBytes(kMaxKeyBytes, kDefaultMaxValueBytes, true);

// A page-aligned buffer standing for a partition's registered region; starts as garbage so
// nothing relies on zeroed memory.
class Region {
 public:
  explicit Region(uint64_t bytes)
      : bytes_(bytes), data_(static_cast<uint8_t*>(std::aligned_alloc(4096, RoundUp(bytes)))) {
    std::memset(data_.get(), 0xA5, bytes_);
  }
  absl::Span<uint8_t> span() { return {data_.get(), bytes_}; }
  uint8_t* data() { return data_.get(); }
  uint64_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  static uint64_t RoundUp(uint64_t n) { return (n + 4095) / 4096 * 4096; }
  uint64_t bytes_;
  std::unique_ptr<uint8_t, Free> data_;
};

SlabAllocator FormatOrDie(Region& region, uint64_t page_bytes = kSlabDefaultPageBytes) {
  auto formatted = SlabAllocator::Format(region.span(), SlabConfig{.page_bytes = page_bytes});
  EXPECT_TRUE(formatted.ok()) << formatted.status();
  return *std::move(formatted);
}

// The byte pattern of block `id`: words id * K + i, so any two blocks and any two places differ.
uint64_t PatternWord(uint64_t id, uint64_t i) { return id * 0x9E3779B97F4A7C15ULL + i; }
void Fill(uint8_t* p, uint64_t bytes, uint64_t id) {
  for (uint64_t i = 0; i * 8 < bytes; ++i) {
    const uint64_t w = PatternWord(id, i);
    std::memcpy(p + i * 8, &w, std::min<uint64_t>(8, bytes - i * 8));
  }
}
bool Intact(const uint8_t* p, uint64_t bytes, uint64_t id) {
  for (uint64_t i = 0; i * 8 < bytes; ++i) {
    const uint64_t w = PatternWord(id, i);
    if (std::memcmp(p + i * 8, &w, std::min<uint64_t>(8, bytes - i * 8)) != 0) return false;
  }
  return true;
}

// Mixed sizes from 1 B to the largest item: mostly small, a tail of large ones.
uint64_t MixedSize(std::mt19937_64& rng) {
  const uint64_t r = rng() % 100;
  if (r < 50) return 1 + rng() % 256;
  if (r < 75) return 257 + rng() % (2048 - 256);
  if (r < 90) return 2049 + rng() % (kSlabMaxSmallBytes - 2048);
  if (r < 98) return kSlabMaxSmallBytes + 1 + rng() % (64 * 1024);
  return 64 * 1024 + rng() % (kLargestItem - 64 * 1024 + 64);  // up to a little over
}

// The test's model: live blocks by offset.
struct LiveBlock {
  uint64_t requested;
  uint64_t block_bytes;
  uint64_t id;
};
class Model {
 public:
  // Checks a new block against every live one and the region, fills it, records it.
  void Add(SlabAllocator& slab, uint8_t* base, uint64_t offset, uint64_t requested) {
    const uint64_t block_bytes = slab.BlockBytes(offset);
    ASSERT_GE(block_bytes, requested) << offset;
    ASSERT_GE(offset, slab.data_offset());
    ASSERT_LE(offset + block_bytes, slab.region_bytes());
    ASSERT_EQ(offset % 16, 0u);
    auto next = blocks_.lower_bound(offset);
    if (next != blocks_.end()) {
      ASSERT_GE(next->first, offset + block_bytes) << "overlaps the live block at " << next->first;
    }
    if (next != blocks_.begin()) {
      auto previous = std::prev(next);
      ASSERT_LE(previous->first + previous->second.block_bytes, offset)
          << "overlaps the live block at " << previous->first;
    }
    const uint64_t id = next_id_++;
    Fill(base + offset, block_bytes, id);
    blocks_[offset] = LiveBlock{requested, block_bytes, id};
    offsets_.push_back(offset);
  }
  // A random live block (checked intact), removed from the model.
  uint64_t TakeRandom(std::mt19937_64& rng, const uint8_t* base) {
    const size_t i = rng() % offsets_.size();
    const uint64_t offset = offsets_[i];
    offsets_[i] = offsets_.back();
    offsets_.pop_back();
    const LiveBlock& block = blocks_.at(offset);
    EXPECT_TRUE(Intact(base + offset, block.block_bytes, block.id))
        << "block " << block.id << " at " << offset << " was overwritten while live";
    blocks_.erase(offset);
    return offset;
  }
  bool AllIntact(const uint8_t* base) const {
    for (const auto& [offset, block] : blocks_) {
      if (!Intact(base + offset, block.block_bytes, block.id)) return false;
    }
    return true;
  }
  size_t size() const { return offsets_.size(); }
  bool empty() const { return offsets_.empty(); }
  const std::map<uint64_t, LiveBlock>& blocks() const { return blocks_; }

 private:
  std::map<uint64_t, LiveBlock> blocks_;
  std::vector<uint64_t> offsets_;
  uint64_t next_id_ = 1;
};

uint64_t LiveBlocks(const SlabStats& stats) {
  uint64_t blocks = stats.large_blocks;
  for (const SlabClassStats& c : stats.classes) blocks += c.used_blocks;
  return blocks;
}

TEST(SlabClassTest, EverySizeHasTheSmallestClassThatHoldsIt) {
  for (uint64_t bytes = 1; bytes <= kSlabMaxSmallBytes; ++bytes) {
    const int c = SlabClassOf(bytes);
    ASSERT_GE(c, 0);
    ASSERT_LT(c, kSlabClassCount);
    ASSERT_GE(SlabClassBytes(c), bytes);
    if (c > 0) {
      ASSERT_LT(SlabClassBytes(c - 1), bytes) << bytes;
    }
    ASSERT_EQ(SlabClassBytes(c) % 16, 0u);
    // The design's bound: rounding adds less than a quarter of what was asked (above 64 B).
    if (bytes > kSlabMinBlockBytes) {
      ASSERT_LT((SlabClassBytes(c) - bytes) * 4, bytes) << bytes;
    }
  }
  for (int c = 1; c < kSlabClassCount; ++c) ASSERT_GT(SlabClassBytes(c), SlabClassBytes(c - 1));

  // Average rounding waste (block - asked) / asked over uniform and log-uniform sizes.
  double uniform = 0;
  for (uint64_t b = 65; b <= kSlabMaxSmallBytes; ++b) {
    uniform += static_cast<double>(SlabClassBytes(SlabClassOf(b)) - b) / b;
  }
  uniform /= kSlabMaxSmallBytes - 64;
  double log_uniform = 0;
  double weight = 0;
  for (uint64_t b = 65; b <= kSlabMaxSmallBytes; ++b) {
    log_uniform += (1.0 / b) * static_cast<double>(SlabClassBytes(SlabClassOf(b)) - b) / b;
    weight += 1.0 / b;
  }
  log_uniform /= weight;
  std::printf("rounding waste over 65..8192 B: uniform sizes %.1f%%, log-uniform sizes %.1f%%\n",
              100 * uniform, 100 * log_uniform);
  EXPECT_LT(uniform, 0.125);
  EXPECT_LT(log_uniform, 0.125);

  Region region(4 * kMiB);
  SlabAllocator slab = FormatOrDie(region);
  const SlabStats stats = slab.Stats();
  std::printf("class  block  span pages  blocks  tail\n");
  for (int c = 0; c < kSlabClassCount; ++c) {
    const SlabClassStats& s = stats.classes[c];
    const uint64_t span = s.span_pages * stats.page_bytes;
    std::printf("%5d  %5lu  %10lu  %6lu  %4lu B\n", c, s.block_bytes, s.span_pages,
                span / s.block_bytes, span % s.block_bytes);
    EXPECT_LE((span % s.block_bytes) * 32, span) << "class " << c << ": span tail over 1/32";
  }
}

TEST(SlabTest, FormatLaysOutHeaderDescriptorsAndPages) {
  Region region(4 * kMiB);
  SlabAllocator slab = FormatOrDie(region);
  EXPECT_EQ(slab.page_bytes(), 4096u);
  EXPECT_EQ(slab.data_offset() % 4096, 0u);
  EXPECT_GE(slab.data_offset(), sizeof(SlabHeader) + slab.page_count() * sizeof(SlabPage));
  EXPECT_LE(slab.data_offset() + slab.page_count() * 4096, region.bytes());
  // No room for one more page with its descriptor.
  EXPECT_GT(slab.data_offset() + (slab.page_count() + 1) * 4096 + sizeof(SlabPage), region.bytes());
  EXPECT_EQ(slab.Stats().free_pages, slab.page_count());
  std::string why;
  EXPECT_TRUE(slab.CheckInvariants(&why)) << why;

  const uint64_t small = slab.Allocate(100);
  EXPECT_EQ(slab.BlockBytes(small), 112u);
  EXPECT_EQ(small, slab.data_offset());  // the first block of the first span
  const uint64_t large = slab.Allocate(10000);
  EXPECT_EQ(slab.BlockBytes(large), 3 * 4096u);
  EXPECT_EQ((large - slab.data_offset()) % 4096, 0u);
  EXPECT_NE(slab.Allocate(0), kNoBlock);
  EXPECT_EQ(slab.Allocate(uint64_t{1} << 62), kNoBlock);
  EXPECT_EQ(slab.Allocate(UINT64_MAX), kNoBlock);
  EXPECT_TRUE(slab.CheckInvariants(&why)) << why;
}

TEST(SlabTest, FormatRejectsBadConfigs) {
  Region region(4 * kMiB);
  for (uint64_t page_bytes : {uint64_t{0}, uint64_t{2048}, uint64_t{3000}, uint64_t{1} << 17}) {
    EXPECT_FALSE(SlabAllocator::Format(region.span(), SlabConfig{.page_bytes = page_bytes}).ok())
        << page_bytes;
  }
  EXPECT_FALSE(SlabAllocator::Format(region.span().subspan(0, 6000), SlabConfig{}).ok());
  EXPECT_FALSE(SlabAllocator::Format(region.span().subspan(8), SlabConfig{}).ok());  // misaligned
}

struct WorkloadParam {
  uint64_t page_bytes;
  uint64_t seed;
};
void PrintTo(const WorkloadParam& p, std::ostream* os) {
  *os << "page " << p.page_bytes << " seed " << p.seed;
}
class SlabWorkloadTest : public ::testing::TestWithParam<WorkloadParam> {};

// Thousands of random allocations and frees of 1 B .. 1 MiB+ against the model, in phases that
// fill the region to kNoBlock and drain it again.
TEST_P(SlabWorkloadTest, RandomWorkloadMatchesModel) {
  const WorkloadParam& param = GetParam();
  Region region(8 * kMiB);
  SlabAllocator slab = FormatOrDie(region, param.page_bytes);
  std::mt19937_64 rng(param.seed);
  Model model;
  std::string why;
  uint64_t no_memory = 0;
  constexpr int kSteps = 20000;
  for (int step = 0; step < kSteps; ++step) {
    const int alloc_percent = (step / 2000) % 2 == 0 ? 75 : 30;  // fill, then drain
    if (model.empty() || static_cast<int>(rng() % 100) < alloc_percent) {
      const uint64_t bytes = MixedSize(rng);
      const uint64_t offset = slab.Allocate(bytes);
      if (offset == kNoBlock) {
        ++no_memory;
        // Only when nothing could hold it: no free block of its class, no run long enough.
        const SlabStats stats = slab.Stats();
        if (bytes <= kSlabMaxSmallBytes) {
          const SlabClassStats& c = stats.classes[SlabClassOf(bytes)];
          ASSERT_EQ(c.free_blocks, 0u) << "step " << step << ": " << bytes << " B refused";
          ASSERT_LT(stats.largest_free_run, c.span_pages) << "step " << step;
        } else {
          ASSERT_LT(stats.largest_free_run * slab.page_bytes(), bytes) << "step " << step;
        }
      } else {
        ASSERT_NO_FATAL_FAILURE(model.Add(slab, region.data(), offset, bytes)) << "step " << step;
      }
    } else {
      const uint64_t offset = model.TakeRandom(rng, region.data());
      ASSERT_TRUE(slab.TryFree(offset)) << "step " << step;
    }
    ASSERT_TRUE(slab.CheckInvariants(&why)) << "step " << step << ": " << why;
    ASSERT_EQ(LiveBlocks(slab.Stats()), model.size()) << "step " << step;
  }
  EXPECT_TRUE(model.AllIntact(region.data()));
  EXPECT_GT(no_memory, 0u) << "the fill phases should reach kNoBlock";
  while (!model.empty()) ASSERT_TRUE(slab.TryFree(model.TakeRandom(rng, region.data())));
  ASSERT_TRUE(slab.CheckInvariants(&why)) << why;
  EXPECT_EQ(slab.Stats().free_pages, slab.page_count()) << "everything freed coalesces into one";
  std::printf("page %lu seed %lu: %d steps, %lu refused\n", param.page_bytes, param.seed, kSteps,
              no_memory);
}

INSTANTIATE_TEST_SUITE_P(PagesAndSeeds, SlabWorkloadTest,
                         ::testing::Values(WorkloadParam{4096, 1}, WorkloadParam{4096, 2},
                                           WorkloadParam{16384, 3}, WorkloadParam{65536, 4}));

// Fills with one size to kNoBlock (exactly as many blocks as the pages hold: no false refusal),
// frees in random order (everything coalesces back), and fills again to the same count.
TEST(SlabTest, FillToNoMemoryAndBackWithoutLeak) {
  Region region(8 * kMiB);
  for (uint64_t bytes :
       {uint64_t{1}, uint64_t{64}, uint64_t{100}, uint64_t{1000}, uint64_t{3000}, uint64_t{6000},
        uint64_t{8192}, uint64_t{8193}, uint64_t{20000}, kLargestItem}) {
    SCOPED_TRACE(bytes);
    SlabAllocator slab = FormatOrDie(region);
    const uint64_t pages = slab.page_count();
    uint64_t expected;
    if (bytes <= kSlabMaxSmallBytes) {
      const SlabClassStats c = slab.Stats().classes[SlabClassOf(bytes)];
      expected = pages / c.span_pages * (c.span_pages * 4096 / c.block_bytes);
    } else {
      expected = pages / ((bytes + 4095) / 4096);
    }
    std::mt19937_64 rng(bytes);
    std::string why;
    for (int round = 0; round < 3; ++round) {
      std::vector<uint64_t> offsets;
      for (uint64_t o; (o = slab.Allocate(bytes)) != kNoBlock;) offsets.push_back(o);
      ASSERT_EQ(offsets.size(), expected) << "round " << round;
      ASSERT_TRUE(slab.CheckInvariants(&why)) << why;
      std::shuffle(offsets.begin(), offsets.end(), rng);
      for (uint64_t o : offsets) ASSERT_TRUE(slab.TryFree(o));
      ASSERT_TRUE(slab.CheckInvariants(&why)) << why;
      const SlabStats stats = slab.Stats();
      ASSERT_EQ(stats.free_pages, pages);
      ASSERT_EQ(stats.span_pages, 0u);
      ASSERT_EQ(LiveBlocks(stats), 0u);
    }
  }
}

// A seeded mixed sequence up to its first refusal, all freed, then the same sequence again: the
// same offsets (nothing leaked, everything coalesced, decisions depend only on region bytes).
TEST(SlabTest, MixedFillRepeatsExactly) {
  Region region(8 * kMiB);
  SlabAllocator slab = FormatOrDie(region);
  std::vector<uint64_t> first_fill;
  for (int round = 0; round < 2; ++round) {
    std::mt19937_64 rng(7);
    std::vector<uint64_t> offsets;
    for (uint64_t o; (o = slab.Allocate(MixedSize(rng))) != kNoBlock;) offsets.push_back(o);
    ASSERT_GT(offsets.size(), 50u);
    if (round == 0) first_fill = offsets;
    EXPECT_EQ(offsets, first_fill);
    std::shuffle(offsets.begin(), offsets.end(), rng);
    for (uint64_t o : offsets) ASSERT_TRUE(slab.TryFree(o));
    std::string why;
    ASSERT_TRUE(slab.CheckInvariants(&why)) << why;
  }
}

// A workload that switches from small values to large ones: the small classes' pages go back
// to the heap as their spans empty, and the large blocks take them.
TEST(SlabTest, MemoryMovesFromSmallClassesToLargeBlocks) {
  Region region(16 * kMiB);
  SlabAllocator slab = FormatOrDie(region);
  std::mt19937_64 rng(11);
  Model model;
  // Phase 1: small values (16..1000 B) until full.
  for (;;) {
    const uint64_t bytes = 16 + rng() % 985;
    const uint64_t o = slab.Allocate(bytes);
    if (o == kNoBlock) break;
    ASSERT_NO_FATAL_FAILURE(model.Add(slab, region.data(), o, bytes));
  }
  const size_t small_blocks = model.size();
  EXPECT_LT(slab.Stats().free_pages, 8u);
  // Phase 2: each round frees a random tenth of what was stored small and stores large values
  // (the largest item) until refused, as a cache whose values grew would.
  std::vector<uint64_t> large;
  while (!model.empty()) {
    for (size_t i = 0; i < small_blocks / 10 && !model.empty(); ++i) {
      ASSERT_TRUE(slab.TryFree(model.TakeRandom(rng, region.data())));
    }
    for (uint64_t o; (o = slab.Allocate(kLargestItem)) != kNoBlock;) {
      large.push_back(o);
      Fill(region.data() + o, kLargestItem, o);
    }
    std::string why;
    ASSERT_TRUE(slab.CheckInvariants(&why)) << why;
    ASSERT_TRUE(model.AllIntact(region.data()));
  }
  const SlabStats stats = slab.Stats();
  EXPECT_EQ(stats.span_pages, 0u) << "every small span went back to the heap";
  const uint64_t most = slab.page_count() / ((kLargestItem + 4095) / 4096);
  std::printf("%zu small blocks, then %zu of %lu possible largest items\n", small_blocks,
              large.size(), most);
  // Large blocks placed while small ones still pinned pages may leave gaps shorter than one.
  EXPECT_GE(large.size() * 10, most * 8);
  for (uint64_t o : large) {
    ASSERT_TRUE(Intact(region.data() + o, kLargestItem, o));
    ASSERT_TRUE(slab.TryFree(o));
  }
  // And back: all of it serves small values again.
  uint64_t again = 0;
  while (slab.Allocate(100) != kNoBlock) ++again;
  EXPECT_EQ(again, slab.page_count() * (4096 / 112));
}

// The backup: a byte copy of the primary's region, at another address, attached and driven with
// the same operations, returns the same offsets.
TEST(SlabTest, AttachedCopyContinuesIdentically) {
  Region primary_region(16 * kMiB);
  SlabAllocator primary = FormatOrDie(primary_region);
  std::mt19937_64 rng(5);
  Model model;
  for (int step = 0; step < 2000; ++step) {
    if (model.empty() || rng() % 100 < 60) {
      const uint64_t bytes = MixedSize(rng);
      const uint64_t o = primary.Allocate(bytes);
      if (o != kNoBlock) {
        ASSERT_NO_FATAL_FAILURE(model.Add(primary, primary_region.data(), o, bytes));
      }
    } else {
      ASSERT_TRUE(primary.TryFree(model.TakeRandom(rng, primary_region.data())));
    }
  }
  Region backup_region(16 * kMiB);
  std::memcpy(backup_region.data(), primary_region.data(), primary_region.bytes());
  auto attached = SlabAllocator::Attach(backup_region.span());
  ASSERT_TRUE(attached.ok()) << attached.status();
  SlabAllocator& backup = *attached;
  std::string why;
  ASSERT_TRUE(backup.CheckInvariants(&why)) << why;
  uint64_t compared = 0;
  for (int step = 0; step < 3000; ++step) {
    if (model.empty() || rng() % 100 < 55) {
      const uint64_t bytes = MixedSize(rng);
      const uint64_t o = primary.Allocate(bytes);
      ASSERT_EQ(backup.Allocate(bytes), o) << "step " << step;
      ++compared;
      if (o != kNoBlock) {
        ASSERT_NO_FATAL_FAILURE(model.Add(primary, primary_region.data(), o, bytes));
      }
    } else {
      const uint64_t o = model.TakeRandom(rng, primary_region.data());
      ASSERT_TRUE(primary.TryFree(o));
      ASSERT_TRUE(backup.TryFree(o));
    }
  }
  ASSERT_TRUE(backup.CheckInvariants(&why)) << why;
  EXPECT_EQ(std::memcmp(primary_region.data(), backup_region.data(), primary.data_offset()), 0);
  EXPECT_GT(compared, 1000u);
}

TEST(SlabTest, AttachRejectsWhatFormatDidNotWrite) {
  Region region(4 * kMiB);
  // Never formatted.
  std::memset(region.data(), 0, region.bytes());
  auto unformatted = SlabAllocator::Attach(region.span());
  ASSERT_FALSE(unformatted.ok());
  EXPECT_NE(unformatted.status().message().find("magic"), std::string::npos)
      << unformatted.status();

  SlabAllocator slab = FormatOrDie(region);
  slab.Allocate(5000);
  slab.Allocate(50000);
  ASSERT_TRUE(SlabAllocator::Attach(region.span()).ok());

  // Shorter than a header.
  auto short_span = SlabAllocator::Attach(region.span().subspan(0, 100));
  ASSERT_FALSE(short_span.ok());
  EXPECT_NE(short_span.status().message().find("truncated"), std::string::npos)
      << short_span.status();
  // A header that describes more bytes than the span has.
  auto truncated = SlabAllocator::Attach(region.span().subspan(0, region.bytes() - 4096));
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos)
      << truncated.status();
  // Not aligned.
  EXPECT_FALSE(SlabAllocator::Attach(region.span().subspan(8)).ok());

  SlabHeader* header = reinterpret_cast<SlabHeader*>(region.data());
  const SlabHeader good = *header;
  const auto attach_fails_with = [&](const char* what) {
    auto attached = SlabAllocator::Attach(region.span());
    EXPECT_FALSE(attached.ok()) << what;
    if (!attached.ok()) {
      EXPECT_NE(attached.status().message().find(what), std::string::npos) << attached.status();
    }
    *header = good;
  };
  header->magic ^= 1;
  attach_fails_with("magic");
  header->format_version = kSlabFormatVersion + 1;
  attach_fails_with("version");
  header->region_bytes = region.bytes() + 1;  // sizes beyond the span
  attach_fails_with("truncated");
  header->page_count += 1;  // identity changed: the checksum catches it
  attach_fails_with("checksum");
  header->page_bytes = 8192;
  attach_fails_with("checksum");
  header->bin_heads[5] = static_cast<uint32_t>(good.page_count + 3);  // mutable state out of range
  attach_fails_with("bin 5");
  header->classes[3].partial_head = static_cast<uint32_t>(good.page_count);
  attach_fails_with("class 3");
  header->bin_bitmap[1] ^= 1;
  attach_fails_with("bitmap");
  header->free_pages = good.page_count + 1;
  attach_fails_with("free");
  header->classes[4].block_bytes += 16;  // not this build's classes
  attach_fails_with("class 4");
  ASSERT_TRUE(SlabAllocator::Attach(region.span()).ok());
}

// Only the ranges Allocate and Free report, copied from the primary to a backup after each
// operation, keep the backup's allocator state identical: metadata byte for byte, and the free
// lists inside free blocks (the backup attaches, checks out and allocates the same offsets).
TEST(SlabTest, DirtyRangesKeepABackupIdentical) {
  Region primary_region(16 * kMiB);
  SlabAllocator primary = FormatOrDie(primary_region);
  Region backup_region(16 * kMiB);
  std::memcpy(backup_region.data(), primary_region.data(), primary_region.bytes());
  DirtyRanges dirty;
  primary.set_dirty_ranges(&dirty);
  std::mt19937_64 rng(9);
  Model model;
  uint64_t ops = 0;
  uint64_t ranges = 0;
  uint64_t bytes_copied = 0;
  size_t most_ranges = 0;
  std::string why;
  for (int step = 0; step < 4000; ++step) {
    dirty.Clear();
    const int alloc_percent = (step / 800) % 2 == 0 ? 75 : 35;
    if (model.empty() || static_cast<int>(rng() % 100) < alloc_percent) {
      const uint64_t bytes = MixedSize(rng);
      const uint64_t o = primary.Allocate(bytes);
      if (o == kNoBlock) continue;
      // The caller's bytes (the item) are written by the caller, not in these ranges.
      ASSERT_NO_FATAL_FAILURE(model.Add(primary, primary_region.data(), o, bytes));
    } else {
      ASSERT_TRUE(primary.TryFree(model.TakeRandom(rng, primary_region.data())));
    }
    ASSERT_FALSE(dirty.overflowed());
    ASSERT_FALSE(dirty.ranges().empty()) << "every operation changes allocator state";
    for (const ByteRange& r : dirty.ranges()) {
      ASSERT_LE(r.offset + r.bytes, primary_region.bytes());
      std::memcpy(backup_region.data() + r.offset, primary_region.data() + r.offset, r.bytes);
      bytes_copied += r.bytes;
    }
    ++ops;
    ranges += dirty.ranges().size();
    most_ranges = std::max(most_ranges, dirty.ranges().size());
    ASSERT_EQ(std::memcmp(primary_region.data(), backup_region.data(), primary.data_offset()), 0)
        << "step " << step << ": the backup's metadata differs";
    if (step % 400 == 0) {
      auto backup = SlabAllocator::Attach(backup_region.span());
      ASSERT_TRUE(backup.ok()) << backup.status();
      ASSERT_TRUE(backup->CheckInvariants(&why)) << "step " << step << ": " << why;
    }
  }
  std::printf("dirty ranges per operation: %.2f on average, %zu at most; %.1f bytes\n",
              static_cast<double>(ranges) / ops, most_ranges,
              static_cast<double>(bytes_copied) / ops);
  // Promote the backup: it continues as the primary does.
  auto backup = SlabAllocator::Attach(backup_region.span());
  ASSERT_TRUE(backup.ok()) << backup.status();
  ASSERT_TRUE(backup->CheckInvariants(&why)) << why;
  primary.set_dirty_ranges(nullptr);
  for (int step = 0; step < 1000; ++step) {
    if (model.empty() || rng() % 100 < 50) {
      const uint64_t bytes = MixedSize(rng);
      const uint64_t o = primary.Allocate(bytes);
      ASSERT_EQ(backup->Allocate(bytes), o) << "step " << step;
      if (o != kNoBlock) {
        ASSERT_NO_FATAL_FAILURE(model.Add(primary, primary_region.data(), o, bytes));
      }
    } else {
      const uint64_t o = model.TakeRandom(rng, primary_region.data());
      ASSERT_TRUE(primary.TryFree(o));
      ASSERT_TRUE(backup->TryFree(o));
    }
  }
  ASSERT_TRUE(backup->CheckInvariants(&why)) << why;
}

TEST(DirtyRangesTest, MergesAndNeverLosesARange) {
  DirtyRanges dirty;
  dirty.Add(100, 8);
  dirty.Add(108, 8);  // touching: merged
  dirty.Add(104, 2);  // inside: merged
  dirty.Add(0, 0);    // empty: ignored
  ASSERT_EQ(dirty.ranges().size(), 1u);
  EXPECT_EQ(dirty.ranges()[0].offset, 100u);
  EXPECT_EQ(dirty.ranges()[0].bytes, 16u);
  dirty.Clear();
  for (size_t i = 0; i < DirtyRanges::kDefaultCapacity; ++i) dirty.Add(uint64_t(i) * 1000, 8);
  EXPECT_FALSE(dirty.overflowed());
  dirty.Add(5010, 8);  // full: merged into the nearest (5000)
  EXPECT_TRUE(dirty.overflowed());
  ASSERT_EQ(dirty.ranges().size(), static_cast<size_t>(DirtyRanges::kDefaultCapacity));
  bool covered = false;
  for (const ByteRange& r : dirty.ranges()) {
    covered |= r.offset <= 5010 && r.offset + r.bytes >= 5018;
    EXPECT_LE(r.bytes, 18u);
  }
  EXPECT_TRUE(covered);
}

// Offsets that are no live block: rejected, and not one byte of the region changes.
TEST(SlabTest, BadOffsetsAreRejectedWithoutChangingState) {
  Region region(4 * kMiB);
  SlabAllocator slab = FormatOrDie(region);
  const uint64_t a = slab.Allocate(100);  // class 112 B
  const uint64_t b = slab.Allocate(100);
  const uint64_t freed = slab.Allocate(100);
  const uint64_t large = slab.Allocate(20000);  // 5 pages
  const uint64_t medium = slab.Allocate(9000);  // 3 pages
  ASSERT_TRUE(slab.TryFree(freed));
  const uint64_t end = slab.data_offset() + slab.page_count() * 4096;
  std::vector<uint8_t> before(region.data(), region.data() + region.bytes());
  const std::vector<uint64_t> bad = {
      kNoBlock,
      0,
      8,
      slab.data_offset() - 64,  // header, descriptors
      a + 1,
      a + 16,
      a + 56,        // inside a block
      freed,         // a double free
      b + 10 * 112,  // a block of the span never handed out
      large + 4096,
      large + 4 * 4096,
      large + 8,   // an inner page, the tail page, unaligned
      end - 4096,  // a free page
      end,
      region.bytes() + 4096,
      UINT64_MAX - 7,
  };
  for (uint64_t offset : bad) {
    EXPECT_FALSE(slab.TryFree(offset)) << offset;
    if (offset != freed) {
      EXPECT_EQ(slab.BlockBytes(offset), 0u) << offset;
    }
  }
  EXPECT_EQ(slab.rejected_frees(), bad.size());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), region.data())) << "a rejection wrote";
  std::string why;
  EXPECT_TRUE(slab.CheckInvariants(&why)) << why;
  EXPECT_DEBUG_DEATH(slab.Free(a + 1), "no live block starts there");

  // A live block that holds, by chance, what a free block's tag would be is still freed once.
  const uint64_t tag = kFreeBlockTag ^ b;
  std::memcpy(region.data() + b + 8, &tag, sizeof(tag));
  EXPECT_TRUE(slab.TryFree(b));
  EXPECT_FALSE(slab.TryFree(b));
  EXPECT_TRUE(slab.TryFree(a));
  EXPECT_TRUE(slab.TryFree(large));
  EXPECT_TRUE(slab.TryFree(medium));
  EXPECT_FALSE(slab.TryFree(large));
  EXPECT_TRUE(slab.CheckInvariants(&why)) << why;
  EXPECT_EQ(slab.Stats().free_pages, slab.page_count());
}

// What a free + allocate pair costs once warm, printed (timing bounds belong to benchmarks):
// small items churned across classes, and large ones across page runs.
TEST(SlabTest, OperationCost) {
  Region region(64 * kMiB);
  SlabAllocator slab = FormatOrDie(region);
  std::mt19937_64 rng(3);
  struct Case {
    const char* name;
    uint64_t lo, hi;
    size_t live;
    int pairs;
  };
  for (const Case& c : {Case{"small (40..1000 B)", 40, 1000, 50000, 1000000},
                        Case{"large (9 KiB..1 MiB)", 9 << 10, kMiB, 40, 100000}}) {
    std::vector<uint64_t> sizes(1 << 16);
    for (uint64_t& size : sizes) size = c.lo + rng() % (c.hi - c.lo);
    std::vector<uint64_t> live;
    for (size_t i = 0; i < c.live; ++i) live.push_back(slab.Allocate(sizes[i % sizes.size()]));
    ASSERT_EQ(std::count(live.begin(), live.end(), kNoBlock), 0);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < c.pairs; ++i) {
      uint64_t& victim = live[(uint64_t(i) * 7919) % live.size()];
      slab.Free(victim);
      victim = slab.Allocate(sizes[i % sizes.size()]);
    }
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
        c.pairs;
    std::printf("free + allocate, %s: %.0f ns\n", c.name, ns);
    ASSERT_EQ(std::count(live.begin(), live.end(), kNoBlock), 0);
    for (uint64_t o : live) slab.Free(o);
    std::string why;
    ASSERT_TRUE(slab.CheckInvariants(&why)) << why;
  }
}

// Store mode's items (16 B keys, checksummed) with values from a size distribution, churned as
// PUTs that change size (free the old block, allocate a new one), then a report of what the
// memory holds. A distribution is bands of value sizes, log-uniform within each.
struct Band {
  int percent;
  double lo, hi;
};
struct FragmentationScenario {
  const char* name;
  uint64_t region_bytes;
  std::vector<Band> bands;
};
void PrintTo(const FragmentationScenario& s, std::ostream* os) { *os << s.name; }
class SlabFragmentationTest : public ::testing::TestWithParam<FragmentationScenario> {};

TEST_P(SlabFragmentationTest, Report) {
  const FragmentationScenario& scenario = GetParam();
  Region region(scenario.region_bytes);
  SlabAllocator slab = FormatOrDie(region);
  std::mt19937_64 rng(2024);
  const auto value_bytes = [&]() {
    int r = static_cast<int>(rng() % 100);
    for (const Band& band : scenario.bands) {
      if (r < band.percent) {
        const double u = std::uniform_real_distribution<double>(0, 1)(rng);
        return static_cast<uint64_t>(band.lo * std::pow(band.hi / band.lo, u));
      }
      r -= band.percent;
    }
    return uint64_t{1};
  };
  const auto item_bytes = [&]() { return ItemBytes(16, value_bytes(), true); };
  Model model;
  uint64_t refused = 0;
  // Fill to ~85% of the pages, then 30000 size-changing overwrites.
  while (slab.Stats().free_pages * 100 > slab.page_count() * 15) {
    const uint64_t bytes = item_bytes();
    const uint64_t o = slab.Allocate(bytes);
    ASSERT_NE(o, kNoBlock);
    ASSERT_NO_FATAL_FAILURE(model.Add(slab, region.data(), o, bytes));
  }
  for (int i = 0; i < 30000; ++i) {
    ASSERT_TRUE(slab.TryFree(model.TakeRandom(rng, region.data())));
    const uint64_t bytes = item_bytes();
    const uint64_t o = slab.Allocate(bytes);
    if (o == kNoBlock) {
      ++refused;
      continue;
    }
    ASSERT_NO_FATAL_FAILURE(model.Add(slab, region.data(), o, bytes));
  }
  std::string why;
  ASSERT_TRUE(slab.CheckInvariants(&why)) << why;

  uint64_t small_requested = 0, small_blocks = 0, large_requested = 0, large_blocks = 0;
  for (const auto& [offset, block] : model.blocks()) {
    if (block.requested <= kSlabMaxSmallBytes) {
      small_requested += block.requested;
      small_blocks += block.block_bytes;
    } else {
      large_requested += block.requested;
      large_blocks += block.block_bytes;
    }
  }
  const SlabStats stats = slab.Stats();
  const uint64_t requested = small_requested + large_requested;
  const uint64_t span_bytes = stats.span_pages * stats.page_bytes;
  const uint64_t large_bytes = stats.large_pages * stats.page_bytes;
  const uint64_t in_use = span_bytes + large_bytes;
  uint64_t free_in_spans = 0;
  uint64_t tails = 0;
  uint64_t cumulative_requested = 0;
  uint64_t cumulative_rounding = 0;
  for (const SlabClassStats& c : stats.classes) {
    free_in_spans += c.free_blocks * c.block_bytes;
    tails += c.span_tail_bytes;
    cumulative_requested += c.requested_bytes;
    cumulative_rounding += c.rounding_bytes;
  }
  const auto pct = [](uint64_t part, uint64_t whole) {
    return whole == 0 ? 0.0 : 100.0 * part / whole;
  };
  std::printf("fragmentation (%s), %zu live items (%lu B asked), %lu overwrites refused:\n",
              scenario.name, model.size(), requested, refused);
  std::printf("  small blocks: rounding %.1f%% of the bytes asked (%lu of %lu)\n",
              pct(small_blocks - small_requested, small_requested), small_blocks - small_requested,
              small_requested);
  std::printf("  large blocks: rounding %.1f%% (%lu of %lu); %lu live\n",
              pct(large_blocks - large_requested, large_requested), large_blocks - large_requested,
              large_requested, stats.large_blocks);
  std::printf("  free blocks inside spans %.1f%%, span tails %.2f%% of span pages\n",
              pct(free_in_spans, span_bytes), pct(tails, span_bytes));
  std::printf("  pages in use / bytes asked: %.3f (wasted / used: %.1f%%); free pages %.1f%%\n",
              static_cast<double>(in_use) / requested, pct(in_use - requested, requested),
              pct(stats.free_pages, stats.page_count));
  std::printf("  small rounding over all allocations (stats): %.1f%%; metadata %.2f%% of region\n",
              pct(cumulative_rounding, cumulative_requested),
              pct(stats.data_offset, slab.region_bytes()));
  // The design's bounds: rounding under a quarter of what was asked (above the 64 B minimum,
  // which items of a 16 B key reach with an 8 B value), a large block wastes less than a page.
  EXPECT_LE((small_blocks - small_requested) * 4, small_requested);
  EXPECT_LE(stats.large_rounding_bytes, stats.large_blocks * (stats.page_bytes - 1));
  EXPECT_EQ(stats.large_rounding_bytes, large_blocks - large_requested);
  EXPECT_LT(stats.data_offset * 100, slab.region_bytes());  // metadata under 1%
  EXPECT_TRUE(model.AllIntact(region.data()));
}

INSTANTIATE_TEST_SUITE_P(
    Distributions, SlabFragmentationTest,
    ::testing::Values(
        // A cache's values: most under 1 KiB, a tail to 1 MiB.
        FragmentationScenario{
            "mixed",
            128 * kMiB,
            {{45, 1, 128}, {30, 128, 1024}, {17, 1024, 8192}, {7, 8192, 65536}, {1, 65536, kMiB}}},
        // HERD's evaluation sizes: small values only.
        FragmentationScenario{"small", 32 * kMiB, {{60, 4, 128}, {40, 128, 1024}}},
        // Just past the classes: page runs of 3..17 pages.
        FragmentationScenario{"medium", 64 * kMiB, {{100, 8192, 65536}}}),
    [](const ::testing::TestParamInfo<FragmentationScenario>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace mica
