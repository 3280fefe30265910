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

// IndexHash is SipHash-1-3 of the key's bytes: the reference values for the all-zero key are
// CPython 3.11's hash() of the same bytes under PYTHONHASHSEED=0 (its bytes hash is SipHash-1-3
// with a zero key then): an implementation written apart from this one. Lengths 1..17 cover
// every tail length and one and two whole blocks.
//   PYTHONHASHSEED=0 python3 -c "print(hex(hash(b'...') % 2**64))"
TEST(IndexHash, IsSipHash13OfTheKeyBytes) {
  const IndexKey zero;
  const std::string bytes = "0123456789abcdefg";
  const uint64_t want[] = {0 /* unused: CPython hashes b'' to 0 without SipHash */,
                           0x49bc192c478bfc2eULL,
                           0x748af13ac9ed7becULL,
                           0x27007a47f534b10cULL,
                           0xe2614298a482dc84ULL,
                           0xe2c4ef0f59d25695ULL,
                           0xb95fd06b7c3d68abULL,
                           0x810aaf7acf670379ULL,
                           0xda3dcedf84ea6cc6ULL,
                           0xb79d8581f8552753ULL,
                           0x52b62a4184e1c734ULL,
                           0x7188f6617526617bULL,
                           0x58ad1e5ac2bf1033ULL,
                           0x6c5a77666b0b9ac0ULL,
                           0x5aa577192a3435c6ULL,
                           0x26f4d862282d8fcbULL,
                           0x1d42b30f7e060c24ULL,
                           0x3323a4f8b8d9776bULL};
  for (size_t n = 1; n <= bytes.size(); ++n) {
    EXPECT_EQ(IndexHash(std::string_view(bytes.data(), n), zero), want[n]) << n << " bytes";
  }
  // Another key, another function.
  const IndexKey other{1, 2};
  EXPECT_NE(IndexHash("key", other), IndexHash("key", zero));
  const IndexKey a = RandomIndexKey();
  const IndexKey b = RandomIndexKey();
  EXPECT_TRUE(a.k0 != b.k0 || a.k1 != b.k1);
}

}  // namespace mica
