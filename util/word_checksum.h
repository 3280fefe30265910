// A fast 64-bit checksum over whole 8-byte words, keyed by a seed: herd's wire checksum (keyed by
// a session's secret) and mica's item checksum (read back by one-sided readers) are both this.
// Not cryptographic: it detects torn, mixed and stale bytes, not a forger who knows the seed.
//
// kLanes independent accumulators: word i goes to lane i % kLanes, in order, so the
// multiplications of neighbouring words overlap instead of forming one serial chain (about 4x
// the throughput of one lane), and moving a word still changes the result. The message length
// seeds every lane, so a prefix never matches its extension.
#ifndef HERD_UTIL_WORD_CHECKSUM_H_
#define HERD_UTIL_WORD_CHECKSUM_H_

#include <cstdint>
#include <cstring>

namespace util {

class WordChecksum {
 public:
  // `length_bytes`: the whole message's length (what the words absorbed will add up to).
  WordChecksum(uint64_t seed, uint64_t length_bytes) {
    for (int l = 0; l < kLanes; ++l) {
      lane_[l] = (seed + static_cast<uint64_t>(l) * kMixC) ^ (length_bytes * kMixA);
    }
  }

  void Absorb(uint64_t word) {
    uint64_t& l = lane_[words_ % kLanes];
    l = Round(l, word);
    ++words_;
  }
  // Absorbs `count` words starting at `p` (any alignment).
  void AbsorbWords(const uint8_t* p, uint64_t count) { Words</*kCopy=*/false>(p, nullptr, count); }
  // The same, and stores each word at `to` as it is absorbed (`to` must not overlap `from`): the
  // copy holds exactly the bytes the sum saw, each read once. (A copy first and a sum over it
  // read every word twice and call memcpy for a key's few words.)
  void CopyAbsorbWords(const uint8_t* from, void* to, uint64_t count) {
    Words</*kCopy=*/true>(from, static_cast<uint8_t*>(to), count);
  }

  uint64_t Finish() const {
    uint64_t h = Rotl(lane_[0], 1) + Rotl(lane_[1], 7) + Rotl(lane_[2], 12) + Rotl(lane_[3], 18);
    h ^= h >> 33;
    h *= kMixC;
    h ^= h >> 29;
    return h;
  }

 private:
  static constexpr int kLanes = 4;
  // Multipliers of the rounds: odd 64-bit constants with well-mixed bits (the 64-bit golden
  // ratio and two primes used by xxHash64), so every input bit reaches every output bit.
  static constexpr uint64_t kMixA = 0x9E3779B97F4A7C15ULL;
  static constexpr uint64_t kMixB = 0xC2B2AE3D27D4EB4FULL;
  static constexpr uint64_t kMixC = 0x165667B19E3779F9ULL;

  static uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t Load(const uint8_t* p) {
    uint64_t w;
    std::memcpy(&w, p, sizeof(w));
    return w;
  }
  static uint64_t Round(uint64_t lane, uint64_t word) {
    return Rotl(lane ^ (word * kMixB), 31) * kMixA;
  }
  template <bool kCopy>
  void Words(const uint8_t* p, uint8_t* to, uint64_t count) {
    auto take = [&](uint64_t i) {
      const uint64_t word = Load(p + i * sizeof(uint64_t));
      if constexpr (kCopy) std::memcpy(to + i * sizeof(uint64_t), &word, sizeof(word));
      return word;
    };
    uint64_t i = 0;
    for (; i < count && words_ % kLanes != 0; ++i) Absorb(take(i));
    for (; i + kLanes <= count; i += kLanes) {  // whole rounds: no lane arithmetic
      for (int l = 0; l < kLanes; ++l) lane_[l] = Round(lane_[l], take(i + l));
      words_ += kLanes;
    }
    for (; i < count; ++i) Absorb(take(i));
  }

  uint64_t lane_[kLanes];
  uint64_t words_ = 0;  // absorbed so far
};

}  // namespace util

#endif  // HERD_UTIL_WORD_CHECKSUM_H_
