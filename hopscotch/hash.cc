#include "hopscotch/hash.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace hopscotch {
namespace {

constexpr uint32_t Rot(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }

// lookup3's mix(): reversible, so no entropy is lost between blocks.
inline void Mix(uint32_t& a, uint32_t& b, uint32_t& c) {
  a -= c, a ^= Rot(c, 4), c += b;
  b -= a, b ^= Rot(a, 6), a += c;
  c -= b, c ^= Rot(b, 8), b += a;
  a -= c, a ^= Rot(c, 16), c += b;
  b -= a, b ^= Rot(a, 19), a += c;
  c -= b, c ^= Rot(b, 4), b += a;
}

// lookup3's final(): every input bit affects every bit of c (and of b).
inline void Final(uint32_t& a, uint32_t& b, uint32_t& c) {
  c ^= b, c -= Rot(b, 14);
  a ^= c, a -= Rot(c, 11);
  b ^= a, b -= Rot(a, 25);
  c ^= b, c -= Rot(b, 16);
  a ^= c, a -= Rot(c, 4);
  b ^= a, b -= Rot(a, 14);
  c ^= b, c -= Rot(b, 24);
}

// Bytes k[0..n) (n <= 4) as a little-endian word.
inline uint32_t Bytes(const uint8_t* k, size_t n) {
  uint32_t w = 0;
  for (size_t i = 0; i < n; ++i) w |= uint32_t{k[i]} << (8 * i);
  return w;
}

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
constexpr uint64_t kValueSeeds[3] = {0x76616c7565303030ULL, 0x76616c7565313131ULL,
                                     0x76616c7565323232ULL};

}  // namespace

void HashLittle2(const void* key, size_t length, uint32_t* pc, uint32_t* pb) {
  const auto* k = static_cast<const uint8_t*>(key);
  uint32_t a, b, c;
  a = b = c = 0xdeadbeef + static_cast<uint32_t>(length) + *pc;
  c += *pb;
  while (length > 12) {
    a += Bytes(k, 4);
    b += Bytes(k + 4, 4);
    c += Bytes(k + 8, 4);
    Mix(a, b, c);
    length -= 12;
    k += 12;
  }
  if (length == 0) {  // zero-length tails need no mixing (as in lookup3)
    *pc = c;
    *pb = b;
    return;
  }
  a += Bytes(k, length < 4 ? length : 4);
  if (length > 4) b += Bytes(k + 4, length < 8 ? length - 4 : 4);
  if (length > 8) c += Bytes(k + 8, length - 8);
  Final(a, b, c);
  *pc = c;
  *pb = b;
}

uint32_t HashLittle(const void* key, size_t length, uint32_t initval) {
  uint32_t c = initval, b = 0;
  HashLittle2(key, length, &c, &b);
  return c;
}

absl::Status ValidateKey(std::string_view key) {
  if (key.empty() || key.size() > kKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("key of %d bytes: keys are 1..%d bytes", key.size(), kKeyBytes));
  }
  if (key.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError("key contains a NUL byte (keys are zero-padded)");
  }
  return absl::OkStatus();
}

PaddedKey PadKey(std::string_view key) {
  PaddedKey padded{};
  std::memcpy(padded.data(), key.data(), key.size() < kKeyBytes ? key.size() : kKeyBytes);
  return padded;
}

Value ExpectedValue(std::string_view key) {
  Value value;
  size_t out = 0;
  for (uint64_t seed : kValueSeeds) {
    uint64_t bits = JenkinsHash64(key, seed);
    for (int i = 0; i < 10 && out < kValueBytes; ++i, bits >>= 6) {
      value[out++] = static_cast<uint8_t>(kAlphabet[bits & 63]);
    }
  }
  return value;
}

}  // namespace hopscotch
