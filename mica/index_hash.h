// Where a partition places a key's index entry (issue 36). Clients know KeyHash (they route by
// it), so a bucket and tag taken from it directly let a client compute, offline, keys that share
// a victim's bucket and evict its acknowledged value in cache mode with a handful of PUTs. A
// partition picks bucket and tag from IndexHash(keyhash): SipHash-1-3 (a keyed pseudorandom
// function, the standard defence against hash flooding) of the public hash under a random
// 128-bit key that never leaves the servers. Routing to partitions stays on the public hash.
//
// Finding keys that share a victim's bucket then needs the key, or a second preimage of the
// victim key's 64-bit KeyHash; without either, a client's keys land in its bucket no more often
// than anyone's.
#ifndef HERD_MICA_INDEX_HASH_H_
#define HERD_MICA_INDEX_HASH_H_

#include <bit>
#include <cstdint>

namespace mica {

struct IndexKey {
  uint64_t k0 = 0;
  uint64_t k1 = 0;
};

// A fresh random key (getrandom): each partition draws its own at creation.
IndexKey RandomIndexKey();

// SipHash-1-3 of the one 8-byte message `keyhash` under `key` (the reference algorithm: one
// compression round per block, three finalization rounds; the length byte 8 in the last block).
inline uint64_t IndexHash(uint64_t keyhash, const IndexKey& key) {
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
  v3 ^= keyhash;
  round();
  v0 ^= keyhash;
  constexpr uint64_t kLastBlock = uint64_t{8} << 56;  // no bytes left, message length 8
  v3 ^= kLastBlock;
  round();
  v0 ^= kLastBlock;
  v2 ^= 0xff;
  round();
  round();
  round();
  return v0 ^ v1 ^ v2 ^ v3;
}

}  // namespace mica

#endif  // HERD_MICA_INDEX_HASH_H_
