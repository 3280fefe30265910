// util::WordChecksum: the sum is the definition's (word i into lane i % 4, whatever mix of calls
// absorbed it: the wire and one-sided readers depend on it), CopyAbsorbWords sums exactly what
// AbsorbWords sums, at every lane phase, and copies each word it absorbed; the sum depends on
// the words' order and on the length.
#include "util/word_checksum.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace util {
namespace {

constexpr uint64_t kSeed = 0x5eed5eed12345678ULL;
constexpr uint64_t kMaxWords = 37;  // several whole rounds of lanes and every remainder

std::vector<uint8_t> Bytes(uint64_t words) {
  std::vector<uint8_t> bytes(words * sizeof(uint64_t));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + 7);
  return bytes;
}

// The definition, written plainly: lane i % 4 takes word i.
uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t DefinedSum(uint64_t seed, uint64_t length, const std::vector<uint64_t>& words) {
  constexpr uint64_t kA = 0x9E3779B97F4A7C15ULL, kB = 0xC2B2AE3D27D4EB4FULL,
                     kC = 0x165667B19E3779F9ULL;
  uint64_t lane[4];
  for (int l = 0; l < 4; ++l) lane[l] = (seed + static_cast<uint64_t>(l) * kC) ^ (length * kA);
  for (size_t i = 0; i < words.size(); ++i) {
    lane[i % 4] = Rotl(lane[i % 4] ^ (words[i] * kB), 31) * kA;
  }
  uint64_t h = Rotl(lane[0], 1) + Rotl(lane[1], 7) + Rotl(lane[2], 12) + Rotl(lane[3], 18);
  h ^= h >> 33;
  h *= kC;
  h ^= h >> 29;
  return h;
}

// Values the checksum had before session 38 rewrote its loops (computed with util/word_checksum.h
// at e2eac23): the wire, the items one-sided readers check and the stored logs depend on them,
// so a change of the definition itself (its constants too) fails here.
TEST(WordChecksumTest, KnownAnswers) {
  struct Case {
    uint64_t seed, words, sum;
  };
  const Case cases[] = {
      {0x0000000000000000ULL, 0, 0x636b6c2b8c912402ULL},
      {0x0000000000000000ULL, 1, 0xa9adc4e193c2014dULL},
      {0x0000000000000000ULL, 2, 0xb3f0b379d5f90864ULL},
      {0x0000000000000000ULL, 3, 0xb96cd708a449ebd3ULL},
      {0x0000000000000000ULL, 4, 0x434b9a93eaf2ba08ULL},
      {0x0000000000000000ULL, 5, 0xea52afba17191e81ULL},
      {0x0000000000000000ULL, 7, 0x4433354741c5d15aULL},
      {0x0000000000000000ULL, 9, 0x7e6d8d17d9fe90a2ULL},
      {0x5eed5eed12345678ULL, 0, 0x2d9f8a7a9aab3a69ULL},
      {0x5eed5eed12345678ULL, 1, 0x062b2217253e06eaULL},
      {0x5eed5eed12345678ULL, 2, 0xc8610790a9f042d5ULL},
      {0x5eed5eed12345678ULL, 3, 0x603732982f0ef2e7ULL},
      {0x5eed5eed12345678ULL, 4, 0x400dfe948190b458ULL},
      {0x5eed5eed12345678ULL, 5, 0x31b4d57e510e9543ULL},
      {0x5eed5eed12345678ULL, 7, 0x7cd474a40069f2faULL},
      {0x5eed5eed12345678ULL, 9, 0x0e7d9513a3a75093ULL},
  };
  for (const Case& c : cases) {
    std::vector<uint64_t> words(c.words);
    for (uint64_t i = 0; i < c.words; ++i) words[i] = 0x0123456789abcdefULL * (i + 1) ^ (i << 56);
    WordChecksum sum(c.seed, c.words * sizeof(uint64_t));
    sum.AbsorbWords(reinterpret_cast<const uint8_t*>(words.data()), c.words);
    EXPECT_EQ(sum.Finish(), c.sum) << "seed " << c.seed << ", " << c.words << " words";
    EXPECT_EQ(DefinedSum(c.seed, c.words * sizeof(uint64_t), words), c.sum);
  }
}

TEST(WordChecksumTest, AnyMixOfCallsSumsAsDefined) {
  std::mt19937_64 random(42);
  for (int trial = 0; trial < 2000; ++trial) {
    const uint64_t length = random() % 4096;
    WordChecksum sum(kSeed, length);
    std::vector<uint64_t> words;
    const int calls = static_cast<int>(random() % 6);
    for (int c = 0; c < calls; ++c) {
      const uint64_t count = random() % 11;
      std::vector<uint64_t> part(count);
      for (uint64_t& w : part) w = random();
      switch (random() % 3) {
        case 0:
          for (uint64_t w : part) sum.Absorb(w);
          break;
        case 1:
          sum.AbsorbWords(reinterpret_cast<const uint8_t*>(part.data()), count);
          break;
        default: {
          std::vector<uint64_t> copy(count);
          sum.CopyAbsorbWords(reinterpret_cast<const uint8_t*>(part.data()), copy.data(), count);
          break;
        }
      }
      words.insert(words.end(), part.begin(), part.end());
    }
    ASSERT_EQ(sum.Finish(), DefinedSum(kSeed, length, words))
        << "trial " << trial << ", " << words.size() << " words";
  }
}

TEST(WordChecksumTest, CopyAbsorbSumsWhatAbsorbSumsAndCopiesIt) {
  const std::vector<uint8_t> source = Bytes(kMaxWords + 1);
  // A leading word absorbed alone puts the copy at each lane phase in turn; the source is read
  // at an odd address too (any alignment).
  for (uint64_t leading = 0; leading < 5; ++leading) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{3}}) {
      for (uint64_t count = 0; count + 1 <= kMaxWords; ++count) {
        const uint64_t length = (leading + count) * sizeof(uint64_t);
        WordChecksum plain(kSeed, length);
        WordChecksum copying(kSeed, length);
        for (uint64_t w = 0; w < leading; ++w) {
          plain.Absorb(w + 1);
          copying.Absorb(w + 1);
        }
        std::vector<uint8_t> copy(count * sizeof(uint64_t) + 1, 0xee);
        plain.AbsorbWords(source.data() + offset, count);
        copying.CopyAbsorbWords(source.data() + offset, copy.data(), count);
        EXPECT_EQ(plain.Finish(), copying.Finish())
            << "leading " << leading << " offset " << offset << " count " << count;
        EXPECT_EQ(std::memcmp(copy.data(), source.data() + offset, count * sizeof(uint64_t)), 0)
            << "count " << count;
        EXPECT_EQ(copy.back(), 0xee) << "wrote past the words, count " << count;
      }
    }
  }
}

TEST(WordChecksumTest, OrderAndLengthChangeTheSum) {
  const std::vector<uint8_t> bytes = Bytes(8);
  std::vector<uint8_t> swapped = bytes;
  std::memcpy(swapped.data(), bytes.data() + sizeof(uint64_t), sizeof(uint64_t));
  std::memcpy(swapped.data() + sizeof(uint64_t), bytes.data(), sizeof(uint64_t));
  auto sum = [](const std::vector<uint8_t>& b, uint64_t words, uint64_t length) {
    WordChecksum s(kSeed, length);
    s.AbsorbWords(b.data(), words);
    return s.Finish();
  };
  const uint64_t length = bytes.size();
  EXPECT_NE(sum(bytes, 8, length), sum(swapped, 8, length));
  EXPECT_NE(sum(bytes, 8, length), sum(bytes, 8, length + sizeof(uint64_t)));
  EXPECT_NE(sum(bytes, 7, 7 * sizeof(uint64_t)), sum(bytes, 8, length));
}

}  // namespace
}  // namespace util
