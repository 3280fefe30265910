// Where a partition places a key's index entry (issue 36). Clients know KeyHash (they route by
// it), and it is no keyed function: a client can compute keys with any KeyHash it likes (its last
// step inverts), so a bucket and tag taken from it, or from any function of it alone, let a
// client compute keys that share a victim's bucket and evict its acknowledged value in cache mode
// with a handful of PUTs. A partition picks bucket and tag from IndexHash(key): SipHash-1-3 (a
// keyed pseudorandom function, the standard defence against hash flooding) of the key's bytes
// under a random 128-bit key that never leaves the servers. Routing to partitions, and matching
// an item to its key, stay on the public hash.
#ifndef HERD_MICA_INDEX_HASH_H_
#define HERD_MICA_INDEX_HASH_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace mica {

// How a partition places entries, for a replica to check it places them alike: 1 was the public
// keyhash's bits (before issue 36), 2 is IndexHash of the key's bytes.
inline constexpr uint32_t kIndexScheme = 2;

struct IndexKey {
  uint64_t k0 = 0;
  uint64_t k1 = 0;
};

// A fresh random key (getrandom): each partition draws its own at creation.
IndexKey RandomIndexKey();

// SipHash-1-3 of `bytes` under `key` (the reference algorithm: 8-byte little-endian blocks, one
// compression round each; the last block holds the 0..7 bytes left and the length mod 256 in its
// top byte; three finalization rounds).
inline uint64_t IndexHash(std::string_view bytes, const IndexKey& key) {
  uint64_t v0 = key.k0 ^ 0x736f6d6570736575ULL;
  uint64_t v1 = key.k1 ^ 0x646f72616e646f6dULL;
  uint64_t v2 = key.k0 ^ 0x6c7967656e657261ULL;
  uint64_t v3 = key.k1 ^ 0x7465646279746573ULL;
  auto round = [&] {
    v0 += v1;
    v1 = std::rotl(v1, 13);
    v1 ^= v0;
    v0 = std::rotl(v0, 32);
    v2 += v3;
    v3 = std::rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = std::rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = std::rotl(v1, 17);
    v1 ^= v2;
    v2 = std::rotl(v2, 32);
  };
  auto absorb = [&](uint64_t m) {
    v3 ^= m;
    round();
    v0 ^= m;
  };
  const char* p = bytes.data();
  const size_t n = bytes.size();
  const size_t whole = n & ~size_t{7};
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t m;
    std::memcpy(&m, p + i, sizeof(m));  // little-endian on the machines herd runs on
    absorb(m);
  }
  uint64_t last = static_cast<uint64_t>(n & 0xff) << 56;
  for (size_t i = 0; i < (n & 7); ++i) {
    last |= uint64_t{static_cast<uint8_t>(p[whole + i])} << (8 * i);
  }
  absorb(last);
  v2 ^= 0xff;
  round();
  round();
  round();
  return v0 ^ v1 ^ v2 ^ v3;
}

}  // namespace mica

#endif  // HERD_MICA_INDEX_HASH_H_
