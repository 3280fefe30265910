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
      due_[l] = (seed + static_cast<uint64_t>(l) * kMixC) ^ (length_bytes * kMixA);
    }
  }

  void Absorb(uint64_t word) {
    Rotate<1>(Round(due_[0], word), 0, 0);
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
    // Lane l (the words w with w % kLanes == l) is due_[(l - words_) % kLanes].
    auto sum = [](uint64_t l0, uint64_t l1, uint64_t l2, uint64_t l3) {
      return Rotl(l0, 1) + Rotl(l1, 7) + Rotl(l2, 12) + Rotl(l3, 18);
    };
    uint64_t h;
    switch (words_ % kLanes) {
      case 0:
        h = sum(due_[0], due_[1], due_[2], due_[3]);
        break;
      case 1:
        h = sum(due_[3], due_[0], due_[1], due_[2]);
        break;
      case 2:
        h = sum(due_[2], due_[3], due_[0], due_[1]);
        break;
      default:
        h = sum(due_[1], due_[2], due_[3], due_[0]);
        break;
    }
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
    // kLanes words in a row go to the kLanes lanes in turn, from whichever is due, and leave
    // them in the same order: no rotation, no index arithmetic.
    uint64_t i = 0;
    for (; i + kLanes <= count; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) due_[l] = Round(due_[l], take(i + l));
    }
    // The last 0..3 words, straight-line (a loop of Absorb costs more than the rounds).
    static_assert(kLanes == 4);
    switch (count - i) {
      case 3:
        Rotate<3>(Round(due_[0], take(i)), Round(due_[1], take(i + 1)),
                  Round(due_[2], take(i + 2)));
        break;
      case 2:
        Rotate<2>(Round(due_[0], take(i)), Round(due_[1], take(i + 1)), 0);
        break;
      case 1:
        Rotate<1>(Round(due_[0], take(i)), 0, 0);
        break;
      default:
        break;
    }
    words_ += count;
  }
  // After the first kTaken due lanes absorbed (a, b, c: the first kTaken of them), they are due
  // last, in the same order.
  template <int kTaken>
  void Rotate(uint64_t a, uint64_t b, uint64_t c) {
    if constexpr (kTaken == 1) {
      due_[0] = due_[1], due_[1] = due_[2], due_[2] = due_[3], due_[3] = a;
    } else if constexpr (kTaken == 2) {
      due_[0] = due_[2], due_[1] = due_[3], due_[2] = a, due_[3] = b;
    } else {
      due_[0] = due_[3], due_[1] = a, due_[2] = b, due_[3] = c;
    }
  }

  // The lanes in the order they are due: due_[0] takes the next word. Kept rotating (rather than
  // indexed by words_ % kLanes) so that every index is a constant and, inlined, the lanes stay
  // in registers.
  uint64_t due_[kLanes];
  uint64_t words_ = 0;  // absorbed so far
};

}  // namespace util

#endif  // HERD_UTIL_WORD_CHECKSUM_H_
