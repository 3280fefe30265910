// Keys and their hashes for the hopscotch table.
//
// The hash is Bob Jenkins' lookup3 `hashlittle2` (2006, public domain), implemented here from
// the published algorithm: 12-byte blocks through mix(), the 0..12-byte tail read byte-wise
// (little-endian, so equal to the word-at-a-time path), then final(). It yields two 32-bit
// hashes, c and b; Jenkins documents b as good as a second independent hash.
//
//   JenkinsHash64(key, seed) = b << 32 | c, with *pc = seed's low and *pb = its high 32 bits.
//   home bucket  = low 32 bits (c) of JenkinsHash64(key, table seed) & (home_buckets - 1)
//   server       = high 32 bits (b) of JenkinsHash64(key, 0), multiply-shift onto [0, servers)
// The two never read the same output bits, so a server's keys still spread over all of its
// home buckets (with seed 0 they are the two outputs of one computation).
#ifndef HERD_HOPSCOTCH_HASH_H_
#define HERD_HOPSCOTCH_HASH_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "hopscotch/format.h"

namespace hopscotch {

// lookup3 hashlittle2: *pc and *pb are the seeds on entry and the two hashes on return.
void HashLittle2(const void* key, size_t length, uint32_t* pc, uint32_t* pb);
// lookup3 hashlittle: the c output of HashLittle2 with *pc = initval, *pb = 0.
uint32_t HashLittle(const void* key, size_t length, uint32_t initval);

inline uint64_t JenkinsHash64(std::string_view key, uint64_t seed) {
  uint32_t c = static_cast<uint32_t>(seed);
  uint32_t b = static_cast<uint32_t>(seed >> 32);
  HashLittle2(key.data(), key.size(), &c, &b);
  return (uint64_t{b} << 32) | c;
}

// Home bucket of `key` in a table of `home_buckets` (a power of two <= 2^32).
inline uint64_t HomeBucket(std::string_view key, uint64_t seed, uint64_t home_buckets) {
  return (JenkinsHash64(key, seed) & 0xffffffffULL) & (home_buckets - 1);
}

// Which of `servers` (>= 1) holds `key`: bits independent of the home bucket's (see above).
inline uint32_t ServerOf(std::string_view key, uint32_t servers) {
  return static_cast<uint32_t>(((JenkinsHash64(key, 0) >> 32) * servers) >> 32);
}

// A storable key: 1..32 bytes, no NUL byte (keys are zero-padded in the bucket).
absl::Status ValidateKey(std::string_view key);
// The key's 32 bucket bytes. Requires ValidateKey(key).ok().
PaddedKey PadKey(std::string_view key);

// The value hop_build stores for `key` when its trace line carries no field data, and the one
// bench's trace generator writes as field0: 27 characters of [A-Za-z0-9_-] taken 6 bits at a
// time from lookup3 of the key under three fixed seeds. A client checks every value it finds.
Value ExpectedValue(std::string_view key);

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_HASH_H_
