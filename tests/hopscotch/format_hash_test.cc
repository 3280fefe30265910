// The file format's constants and the lookup3 hash against Bob Jenkins' published vectors
// (lookup3.c, driver5), the bit split between home bucket and server, and ExpectedValue.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "hopscotch/format.h"
#include "hopscotch/hash.h"

namespace hopscotch {
namespace {

constexpr char kFourScore[] = "Four score and seven years ago";

TEST(Format, SizesTieTogether) {
  EXPECT_EQ(sizeof(Header), 4096u);
  EXPECT_EQ(kNeighbourhood * kBucketBytes, 2048u);
  EXPECT_EQ(kValueOffset + kValueBytes, kBucketBytes);
  EXPECT_EQ(FileBytes(1), 4096u + 32 * 64);
  EXPECT_EQ(FileBytes(1024), 4096u + (1024 + 31) * 64);
  EXPECT_EQ(kHeaderBytes % kBucketBytes, 0u);  // every bucket is one aligned cache line
}

TEST(Format, WordZeroHoldsInfoHopAndKeyHead) {
  uint8_t bucket[kBucketBytes] = {};
  bucket[0] = kOccupied | 6;
  const uint32_t hop = 0x80000005u;
  std::memcpy(bucket + kHopOffset, &hop, 4);
  bucket[kKeyOffset] = 'a';
  uint64_t w0;
  std::memcpy(&w0, bucket, 8);
  EXPECT_EQ(WordInfo(w0), kOccupied | 6);
  EXPECT_EQ(WordHop(w0), hop);
  EXPECT_EQ(HopOf(bucket), hop);
  EXPECT_EQ(WordHop(WithHop(w0, 7)), 7u);
  EXPECT_EQ(WordInfo(WithHop(w0, 7)), kOccupied | 6);
  EXPECT_EQ(WithHop(w0, 7) >> 40, w0 >> 40);  // key bytes untouched
  EXPECT_EQ(WordHop(WithInfo(w0, 3)), hop);
  EXPECT_TRUE(IsBusy(3));
  EXPECT_FALSE(IsBusy(kOccupied | 6));
}

TEST(Lookup3, PublishedVectors) {
  uint32_t c = 0, b = 0;
  HashLittle2("", 0, &c, &b);
  EXPECT_EQ(c, 0xdeadbeefu);
  EXPECT_EQ(b, 0xdeadbeefu);
  c = 0, b = 0xdeadbeef;
  HashLittle2("", 0, &c, &b);
  EXPECT_EQ(c, 0xbd5b7ddeu);
  EXPECT_EQ(b, 0xdeadbeefu);
  c = 0xdeadbeef, b = 0xdeadbeef;
  HashLittle2("", 0, &c, &b);
  EXPECT_EQ(c, 0x9c093ccdu);
  EXPECT_EQ(b, 0xbd5b7ddeu);
  c = 0, b = 0;
  HashLittle2(kFourScore, 30, &c, &b);
  EXPECT_EQ(c, 0x17770551u);
  EXPECT_EQ(b, 0xce7226e6u);
  c = 0, b = 1;
  HashLittle2(kFourScore, 30, &c, &b);
  EXPECT_EQ(c, 0xe3607caeu);
  EXPECT_EQ(b, 0xbd371de4u);
  c = 1, b = 0;
  HashLittle2(kFourScore, 30, &c, &b);
  EXPECT_EQ(c, 0xcd628161u);
  EXPECT_EQ(b, 0x6cbea4b3u);
  EXPECT_EQ(HashLittle(kFourScore, 30, 0), 0x17770551u);
  EXPECT_EQ(HashLittle(kFourScore, 30, 1), 0xcd628161u);
}

TEST(Lookup3, Jenkins64IsBThenC) {
  EXPECT_EQ(JenkinsHash64(kFourScore, 0), (uint64_t{0xce7226e6} << 32) | 0x17770551u);
  EXPECT_EQ(JenkinsHash64(kFourScore, uint64_t{1} << 32),
            (uint64_t{0xbd371de4} << 32) | 0xe3607caeu);
}

TEST(Lookup3, EveryTailLengthDependsOnEveryByte) {
  for (size_t n = 1; n <= 40; ++n) {
    std::string key(n, 'x');
    const uint64_t base = JenkinsHash64(key, 0);
    for (size_t i = 0; i < n; ++i) {
      std::string other = key;
      other[i] = 'y';
      EXPECT_NE(JenkinsHash64(other, 0), base) << n << " " << i;
    }
  }
}

double ChiSquare(const std::vector<int>& counts, int total) {
  const double expected = static_cast<double>(total) / counts.size();
  double chi = 0;
  for (int c : counts) chi += (c - expected) * (c - expected) / expected;
  return chi;
}

// Keys of one server still spread over all home buckets: the server reads bits the home
// bucket does not.
TEST(Hash, ServerAndHomeBucketAreIndependent) {
  constexpr int kServers = 4, kBuckets = 64, kKeys = 200000;
  std::vector<int> servers(kServers), homes(kBuckets);
  int on_server_0 = 0;
  for (int i = 0; i < kKeys; ++i) {
    const std::string key = absl::StrFormat("user%d", i);
    const uint32_t server = ServerOf(key, kServers);
    ASSERT_LT(server, kServers);
    ++servers[server];
    if (server == 0) {
      ++homes[HomeBucket(key, 0, kBuckets)];
      ++on_server_0;
    }
  }
  // Six standard deviations of chi-square with k - 1 degrees of freedom.
  EXPECT_LT(ChiSquare(servers, kKeys), 3 + 6 * std::sqrt(6.0));
  EXPECT_LT(ChiSquare(homes, on_server_0), 63 + 6 * std::sqrt(126.0));
}

TEST(Keys, ValidateAndPad) {
  EXPECT_TRUE(ValidateKey("user6284781860667377211").ok());
  EXPECT_TRUE(ValidateKey(std::string(32, 'k')).ok());
  EXPECT_FALSE(ValidateKey("").ok());
  EXPECT_FALSE(ValidateKey(std::string(33, 'k')).ok());
  EXPECT_FALSE(ValidateKey(std::string("a\0b", 3)).ok());
  const PaddedKey p = PadKey("ab");
  EXPECT_EQ(p[0], 'a');
  EXPECT_EQ(p[1], 'b');
  for (size_t i = 2; i < kKeyBytes; ++i) EXPECT_EQ(p[i], 0);
}

TEST(Keys, ExpectedValueIsDeterministicPrintableAndKeyed) {
  const Value a = ExpectedValue("user1");
  EXPECT_EQ(a, ExpectedValue("user1"));
  EXPECT_NE(a, ExpectedValue("user2"));
  for (uint8_t c : a) EXPECT_TRUE(std::isalnum(c) || c == '_' || c == '-') << int{c};
}

}  // namespace
}  // namespace hopscotch
