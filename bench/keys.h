// Deterministic benchmark keys and values: key i is the same bytes in every process and run, so a
// client can check what a server returns without sharing state.
#ifndef HERD_BENCH_KEYS_H_
#define HERD_BENCH_KEYS_H_

#include <bit>
#include <cstdint>
#include <cstring>

namespace bench {

// Writes key `index` into out[0, key_bytes): the index's little-endian bytes first (unique for
// key_bytes >= 8, or while index < 256^key_bytes), then filler derived from the index: byte i is
// byte i % 8 of the index XOR the low byte of i * 0x9d.
//
// A word at a time (a client draws two keys per request, and byte by byte they were a tenth of
// its time): bytes [c, c + 8) are the index XOR the word whose byte j is (c + j) * 0x9d mod 256,
// the bytes j * 0x9d plus c * 0x9d, added bytewise (no carry from one byte into the next).
inline void MakeKey(uint64_t index, uint32_t key_bytes, char* out) {
  static_assert(std::endian::native == std::endian::little, "the index's bytes, lowest first");
  constexpr uint64_t kHighBits = 0x8080808080808080ULL;
  uint64_t steps = 0;  // byte j: j * 0x9d mod 256
  for (uint64_t j = 0; j < 8; ++j) steps |= ((j * 0x9d) & 0xff) << (8 * j);
  const uint32_t head = key_bytes < 8 ? key_bytes : 8;
  std::memcpy(out, &index, head);
  for (uint64_t c = 8; c < key_bytes; c += 8) {  // 64-bit: never wraps near 2^32 bytes
    const uint64_t base = ((c * 0x9d) & 0xff) * 0x0101010101010101ULL;
    const uint64_t filler =
        ((steps & ~kHighBits) + (base & ~kHighBits)) ^ ((steps ^ base) & kHighBits);
    const uint64_t word = index ^ filler;
    if (key_bytes - c >= 8) {
      std::memcpy(out + c, &word, 8);
    } else {
      std::memcpy(out + c, &word, key_bytes - c);
    }
  }
}

// Writes the value that write number `stamp` stores for key `index`: checkable bytes.
inline void MakeValue(uint64_t index, uint64_t stamp, uint32_t value_bytes, char* out) {
  const uint64_t seed = index * 0x9e3779b97f4a7c15ULL ^ stamp;
  for (uint32_t i = 0; i < value_bytes; ++i) {
    out[i] = static_cast<char>(seed >> ((i % 8) * 8)) + static_cast<char>(i / 8);
  }
}

}  // namespace bench

#endif  // HERD_BENCH_KEYS_H_
