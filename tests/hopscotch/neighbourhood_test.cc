// The pure reader over hand-made snapshots: hits through the home bucket, hop bits and the scan;
// busy lines; dangling hop bits; malformed keys; random garbage.
#include "hopscotch/neighbourhood.h"

#include <random>

#include "gtest/gtest.h"
#include "hopscotch/hash.h"

namespace hopscotch {
namespace {

using Kind = LookupResult::Kind;

class Span {
 public:
  Span() { std::memset(bytes_, 0, sizeof(bytes_)); }
  // Stores (key, value) clean and occupied at `offset`; `hop`: set the home's hop bit too.
  void Put(int offset, std::string_view key, const Value& value, bool hop = true) {
    uint8_t* b = bytes_ + offset * kBucketBytes;
    b[0] = kOccupied | 2;
    std::memcpy(b + kKeyOffset, PadKey(key).data(), kKeyBytes);
    std::memcpy(b + kValueOffset, value.data(), kValueBytes);
    if (hop) SetHop(HopOf(bytes_) | (1u << offset));
  }
  void SetHop(uint32_t hop) { std::memcpy(bytes_ + kHopOffset, &hop, 4); }
  void SetInfo(int offset, uint8_t info) { bytes_[offset * kBucketBytes] = info; }
  uint8_t* bucket(int offset) { return bytes_ + offset * kBucketBytes; }
  Snapshot snapshot() const { return Snapshot(bytes_, kNeighbourhoodBytes); }

 private:
  uint8_t bytes_[kNeighbourhoodBytes];
};

TEST(FindInNeighbourhood, EmptyIsAMiss) {
  Span s;
  EXPECT_EQ(FindInNeighbourhood(s.snapshot(), "user1").kind, Kind::kMiss);
}

TEST(FindInNeighbourhood, FindsAtHomeAndThroughHopBits) {
  Span s;
  s.Put(0, "home", ExpectedValue("home"));
  s.Put(5, "five", ExpectedValue("five"));
  s.Put(31, "last", ExpectedValue("last"));
  LookupResult r = FindInNeighbourhood(s.snapshot(), "home");
  ASSERT_EQ(r.kind, Kind::kFound);
  EXPECT_EQ(r.offset, 0);
  EXPECT_EQ(r.value, ExpectedValue("home"));
  r = FindInNeighbourhood(s.snapshot(), "five");
  ASSERT_EQ(r.kind, Kind::kFound);
  EXPECT_EQ(r.offset, 5);
  EXPECT_TRUE(r.via_hop);
  EXPECT_EQ(r.value, ExpectedValue("five"));
  r = FindInNeighbourhood(s.snapshot(), "last");
  ASSERT_EQ(r.kind, Kind::kFound);
  EXPECT_EQ(r.offset, 31);
  EXPECT_EQ(FindInNeighbourhood(s.snapshot(), "fiv").kind, Kind::kMiss);  // a prefix
  EXPECT_EQ(FindInNeighbourhood(s.snapshot(), "").kind, Kind::kMiss);
}

// A key mid-displacement: its new bucket is filled, the hop bit this snapshot saw still names
// the old (already empty) bucket.
TEST(FindInNeighbourhood, ScanFindsAKeyNoHopBitNames) {
  Span s;
  s.Put(9, "moved", ExpectedValue("moved"), /*hop=*/false);
  s.SetHop(1u << 3);  // stale: bucket 3 is empty now
  const LookupResult r = FindInNeighbourhood(s.snapshot(), "moved");
  ASSERT_EQ(r.kind, Kind::kFound);
  EXPECT_EQ(r.offset, 9);
  EXPECT_FALSE(r.via_hop);
  EXPECT_EQ(r.dangling, 1);
}

TEST(FindInNeighbourhood, BusyLinesAreNeverReadAndMakeAMissTorn) {
  Span s;
  s.Put(4, "k", ExpectedValue("k"));
  s.SetInfo(4, kOccupied | 3);  // an in-place update in flight: value may be torn
  EXPECT_EQ(FindInNeighbourhood(s.snapshot(), "k").kind, Kind::kTorn);
  EXPECT_EQ(FindInNeighbourhood(s.snapshot(), "other").kind, Kind::kTorn);
  s.Put(6, "other", ExpectedValue("other"));
  EXPECT_EQ(FindInNeighbourhood(s.snapshot(), "other").kind, Kind::kFound);  // busy elsewhere
  s.SetInfo(4, kOccupied | 4);
  EXPECT_EQ(FindInNeighbourhood(s.snapshot(), "k").kind, Kind::kFound);
}

TEST(FindInNeighbourhood, EmptyBucketsHoldingOldKeysDoNotMatch) {
  Span s;
  s.Put(2, "gone", ExpectedValue("gone"));
  s.SetInfo(2, 4);  // cleared: the key bytes stay, the occupied bit does not
  EXPECT_EQ(FindInNeighbourhood(s.snapshot(), "gone").kind, Kind::kMiss);
}

TEST(FindInNeighbourhood, CountsMalformedKeys) {
  Span s;
  s.Put(1, "abc", ExpectedValue("abc"));
  s.bucket(1)[kKeyOffset + 10] = 'z';  // "abc\0...z": never written by Insert
  const LookupResult r = FindInNeighbourhood(s.snapshot(), "abc");
  EXPECT_EQ(r.kind, Kind::kMiss);
  EXPECT_EQ(r.malformed, 1);
}

// Garbage never crashes the reader, and a hit always reports the bytes of a bucket that holds
// exactly the key.
TEST(FindInNeighbourhood, RandomGarbage) {
  std::mt19937_64 rng(17);
  uint8_t bytes[kNeighbourhoodBytes];
  int found = 0;
  for (int round = 0; round < 20000; ++round) {
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    const std::string key = round % 2 ? "k" : std::string(32, 'k');
    if (round % 4 == 0) {  // plant the key in a random bucket
      const int at = static_cast<int>(rng() % kNeighbourhood);
      std::memcpy(bytes + at * kBucketBytes + kKeyOffset, PadKey(key).data(), kKeyBytes);
    }
    const LookupResult r = FindInNeighbourhood(Snapshot(bytes, kNeighbourhoodBytes), key);
    if (r.kind != Kind::kFound) continue;
    ++found;
    ASSERT_GE(r.offset, 0);
    ASSERT_LT(r.offset, 32);
    const uint8_t* b = bytes + r.offset * kBucketBytes;
    EXPECT_TRUE(IsOccupied(b[0]) && !IsBusy(b[0]));
    EXPECT_EQ(std::memcmp(b + kKeyOffset, PadKey(key).data(), kKeyBytes), 0);
    EXPECT_EQ(std::memcmp(b + kValueOffset, r.value.data(), kValueBytes), 0);
  }
  EXPECT_GT(found, 100);  // planted keys in clean occupied lines are found
}

}  // namespace
}  // namespace hopscotch
