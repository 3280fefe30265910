// The vector SlotsTagged (AVX2) marks exactly the slots the slot-by-slot definition marks: every
// slot position, tags differing in one bit, empty slots, and version and link words that look
// like tags.
#include "mica/bucket.h"

#include <cstdint>
#include <iterator>
#include <random>

#include "gtest/gtest.h"

namespace mica {
namespace {

#if defined(__x86_64__)
TEST(BucketTest, VectorSlotsTaggedMatchesTheDefinition) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937_64 random(7);
  const uint16_t tags[] = {1, 2, 0x8000, 0x8001, 0xffff, 0x00ff, 0xff00};
  for (int trial = 0; trial < 20000; ++trial) {
    Bucket bucket{};
    bucket.version = static_cast<uint32_t>(random());
    bucket.next_extra = trial % 2 == 0 ? 0xffffffffu : static_cast<uint32_t>(random());
    for (uint64_t& slot : bucket.slots) {
      switch (random() % 4) {
        case 0:
          slot = 0;  // empty
          break;
        case 1:
          slot = MakeSlot(tags[random() % std::size(tags)], random());
          break;
        default:
          slot = random();  // any tag, any offset
          break;
      }
    }
    // A tag some slot carries, one that differs from it in one bit, and a fixed one.
    const uint16_t present = SlotTag(bucket.slots[random() % kSlotsPerBucket]);
    for (uint16_t tag : {present, static_cast<uint16_t>(present ^ (1u << (random() % 16))),
                         tags[trial % std::size(tags)]}) {
      if (tag == 0) continue;  // never a tag (TagOf)
      ASSERT_EQ(SlotsTaggedAvx2(bucket, tag), SlotsTaggedEach(bucket, tag))
          << "trial " << trial << ", tag " << tag;
    }
  }
}

TEST(BucketTest, VectorSlotsTaggedSeesEverySlotAlone) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "this CPU has no AVX2";
  for (int i = 0; i < kSlotsPerBucket; ++i) {
    Bucket bucket{};
    bucket.version = 0xffffffffu;
    bucket.next_extra = 0xffffffffu;  // the link word's top bits read as tag 0xffff
    bucket.slots[i] = MakeSlot(0xffff, 64);
    EXPECT_EQ(SlotsTaggedAvx2(bucket, 0xffff), 1u << i) << "slot " << i;
  }
}
#endif

}  // namespace
}  // namespace mica
