#include "mica/keyhash.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "mica/index_hash.h"

namespace mica {
namespace {

constexpr int kKeys = 1 << 18;

std::string SequentialKey(int i) { return absl::StrCat("key-", i); }

// Chi-square statistic of `counts` against a uniform expectation.
double ChiSquare(const std::vector<int>& counts, int total) {
  const double expected = static_cast<double>(total) / counts.size();
  double chi = 0;
  for (int c : counts) chi += (c - expected) * (c - expected) / expected;
  return chi;
}

// For k bins and a uniform source, chi-square has mean k-1 and stddev sqrt(2(k-1)); six standard
// deviations is a bound a good hash never reaches in a deterministic test.
void ExpectUniform(const std::vector<int>& counts, int total, const char* what) {
  const double dof = counts.size() - 1.0;
  EXPECT_LT(ChiSquare(counts, total), dof + 6 * std::sqrt(2 * dof)) << what;
}

TEST(KeyHash, IsDeterministicAndLengthSensitive) {
  EXPECT_EQ(KeyHash("herd"), KeyHash(std::string("herd")));
  // Keys of zero bytes that differ only in length must differ.
  absl::flat_hash_set<uint64_t> seen;
  for (size_t n = 0; n <= 256; ++n) {
    EXPECT_TRUE(seen.insert(KeyHash(std::string(n, '\0'))).second) << n;
  }
}

TEST(KeyHash, NoCollisionsAcrossLengthsAndSequentialKeys) {
  absl::flat_hash_set<uint64_t> seen;
  for (int i = 0; i < kKeys; ++i) ASSERT_TRUE(seen.insert(KeyHash(SequentialKey(i))).second);
  // Every length 1..256 with one differing byte position.
  for (size_t n = 1; n <= 256; ++n) {
    for (size_t pos = 0; pos < n; pos += 7) {
      std::string key(n, 'a');
      key[pos] = 'b';
      ASSERT_TRUE(seen.insert(KeyHash(key)).second) << n << " " << pos;
    }
  }
}

TEST(KeyHash, PartitionTagAndBucketBitsAreEachUniform) {
  constexpr int kBins = 64;
  std::vector<int> partition(kBins), tag(kBins), bucket(kBins);
  for (int i = 0; i < kKeys; ++i) {
    const uint64_t h = KeyHash(SequentialKey(i));
    ++partition[PartitionOf(h, kBins)];
    ++tag[TagOf(h) % kBins];
    ++bucket[BucketOf(h, kBins - 1)];
  }
  ExpectUniform(partition, kKeys, "partition");
  ExpectUniform(tag, kKeys, "tag");
  ExpectUniform(bucket, kKeys, "bucket");
}

TEST(KeyHash, PartitionAndBucketAreIndependent) {
  // Keys of one partition must still spread over all buckets (the bit ranges do not overlap).
  constexpr int kPartitions = 4;
  constexpr int kBuckets = 16;
  std::vector<int> joint(kPartitions * kBuckets);
  for (int i = 0; i < kKeys; ++i) {
    const uint64_t h = KeyHash(SequentialKey(i));
    ++joint[PartitionOf(h, kPartitions) * kBuckets + BucketOf(h, kBuckets - 1)];
  }
  ExpectUniform(joint, kKeys, "partition x bucket");
}

TEST(KeyHash, NonPowerOfTwoPartitionCountsAreBalanced) {
  constexpr int kPartitions = 3;
  std::vector<int> counts(kPartitions);
  for (int i = 0; i < kKeys; ++i) ++counts[PartitionOf(KeyHash(SequentialKey(i)), kPartitions)];
  ExpectUniform(counts, kKeys, "3 partitions");
}

TEST(KeyHash, OneFlippedInputBitFlipsAboutHalfTheOutput) {
  for (const size_t n : {1, 3, 8, 16, 17, 64, 256}) {
    double flipped = 0;
    int trials = 0;
    for (int seed = 0; seed < 32; ++seed) {
      std::string key(n, static_cast<char>(seed * 37 + 11));
      const uint64_t base = KeyHash(key);
      for (size_t bit = 0; bit < n * 8; bit += (n > 32 ? 13 : 1)) {
        std::string flipped_key = key;
        flipped_key[bit / 8] ^= static_cast<char>(1 << (bit % 8));
        flipped += std::popcount(base ^ KeyHash(flipped_key));
        ++trials;
      }
    }
    const double mean = flipped / trials;
    EXPECT_GT(mean, 30.0) << "key bytes " << n;
    EXPECT_LT(mean, 34.0) << "key bytes " << n;
  }
}

TEST(KeyHash, TagIsNeverZero) {
  EXPECT_EQ(TagOf(0), 1);
  EXPECT_EQ(TagOf(uint64_t{0xabcd} << 48), 1);
  EXPECT_EQ(TagOf(uint64_t{0x1234} << 32), 0x1234);
}

}  // namespace

// IndexHash is SipHash-1-3 of the 8-byte little-endian keyhash: the reference values for the
// all-zero key are CPython 3.11's hash() of those 8 bytes under PYTHONHASHSEED=0 (its string
// hash is SipHash-1-3 with a zero key then): an implementation written apart from this one.
//   PYTHONHASHSEED=0 python3 -c "import struct; print(hex(hash(struct.pack('<Q', M)) % 2**64))"
TEST(IndexHash, IsSipHash13OfTheKeyhash) {
  const IndexKey zero;
  EXPECT_EQ(IndexHash(0, zero), 0xbd60acb658c79e45ULL);
  EXPECT_EQ(IndexHash(1, zero), 0x1e9f734161d62dd9ULL);
  EXPECT_EQ(IndexHash(0x0123456789abcdefULL, zero), 0x8662046e52264db8ULL);
  EXPECT_EQ(IndexHash(0xffffffffffffffffULL, zero), 0x2f205be2fec8e38dULL);
  // Another key, another function.
  const IndexKey other{1, 2};
  EXPECT_NE(IndexHash(0, other), IndexHash(0, zero));
  const IndexKey a = RandomIndexKey();
  const IndexKey b = RandomIndexKey();
  EXPECT_TRUE(a.k0 != b.k0 || a.k1 != b.k1);
}

}  // namespace mica
