// Deterministic benchmark keys and values: key i is the same bytes in every process and run, so a
// client can check what a server returns without sharing state.
#ifndef HERD_BENCH_KEYS_H_
#define HERD_BENCH_KEYS_H_

#include <cstdint>
#include <cstring>

namespace bench {

// Writes key `index` into out[0, key_bytes): the index's little-endian bytes first (unique for
// key_bytes >= 8, or while index < 256^key_bytes), then filler derived from the index.
inline void MakeKey(uint64_t index, uint32_t key_bytes, char* out) {
  const uint32_t head = key_bytes < 8 ? key_bytes : 8;
  std::memcpy(out, &index, head);
  for (uint32_t i = head; i < key_bytes; ++i) {
    out[i] = static_cast<char>((index >> ((i % 8) * 8)) ^ (i * 0x9d));
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
