#include "mica/keyhash.h"

#include <cstring>

namespace mica {
namespace {

// Odd 64-bit constants with well-mixed bits (the fractional part of the golden ratio and
// primes from the public xxHash/Murmur families); any such constants work.
constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kMul1 = 0xa0761d6478bd642fULL;
constexpr uint64_t kMul2 = 0xe7037ed1a0b428dbULL;
constexpr uint64_t kMul3 = 0x8ebc6af09c88c6e3ULL;
constexpr uint64_t kFinal1 = 0xff51afd7ed558ccdULL;
constexpr uint64_t kFinal2 = 0xc4ceb9fe1a85ec53ULL;

inline uint64_t Load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline uint64_t Load32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Folds the 128-bit product of a and b into 64 bits: every input bit reaches many output bits.
inline uint64_t MulFold(uint64_t a, uint64_t b) {
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
}

// Final avalanche so that every output bit range (partition, tag, bucket) depends on all input.
inline uint64_t Finalize(uint64_t h) {
  h ^= h >> 33;
  h *= kFinal1;
  h ^= h >> 33;
  h *= kFinal2;
  h ^= h >> 33;
  return h;
}

}  // namespace

uint64_t KeyHash(std::string_view key) {
  const char* p = key.data();
  size_t n = key.size();
  uint64_t h = kSeed ^ (static_cast<uint64_t>(n) * kMul1);
  while (n > 16) {
    h = MulFold(Load64(p) ^ kMul1, Load64(p + 8) ^ h);
    p += 16;
    n -= 16;
  }
  // 0..16 bytes remain; overlapping loads cover them without a byte loop.
  uint64_t a = 0;
  uint64_t b = 0;
  if (n >= 8) {
    a = Load64(p);
    b = Load64(p + n - 8);
  } else if (n >= 4) {
    a = Load32(p);
    b = Load32(p + n - 4);
  } else if (n > 0) {
    const auto* u = reinterpret_cast<const unsigned char*>(p);
    a = (uint64_t{u[0]} << 16) | (uint64_t{u[n / 2]} << 8) | u[n - 1];
  }
  h = MulFold(a ^ kMul2, b ^ h ^ kMul3);
  return Finalize(h ^ key.size());
}

}  // namespace mica
