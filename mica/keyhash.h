// The one 64-bit key hash of herd, and how its bits are spent.
//
// Client routing and the worker partition read bits 48..63 of this hash (multiply-shift: any
// partition count up to 2^16, no modulo bias). Inside a partition, the index bucket and tag come
// from IndexHash(key) under the partition's secret key (index_hash.h), laid out the same way:
//   bits 32..47  index tag  (0 marks an empty slot, so a real tag of 0 is stored as 1)
//   bits  0..31  bucket     (bucket count is a power of two, at most 2^32)
//
// The hash is fast for 1..256-byte keys and well distributed (see keyhash_test.cc); it is not
// designed to resist adversarially chosen keys, and clients know it: that is why buckets are not
// chosen by it directly.
#ifndef HERD_MICA_KEYHASH_H_
#define HERD_MICA_KEYHASH_H_

#include <cstdint>
#include <string_view>

namespace mica {

// Hash of a key of any length (herd's keys are 1..256 bytes).
uint64_t KeyHash(std::string_view key);

inline constexpr int kPartitionShift = 48;  // bits 48..63 pick the partition
inline constexpr int kTagShift = 32;        // bits 32..47 are the index tag
inline constexpr int kMaxBucketBits = 32;   // bits 0..31 pick the bucket

// Partition (0..partitions-1) that owns `keyhash`; partitions in 1..65536.
inline uint32_t PartitionOf(uint64_t keyhash, uint32_t partitions) {
  return static_cast<uint32_t>(((keyhash >> kPartitionShift) * partitions) >> 16);
}

// Index tag of an index hash (Partition::IndexHash), never 0.
inline uint16_t TagOf(uint64_t keyhash) {
  const auto tag = static_cast<uint16_t>(keyhash >> kTagShift);
  return tag == 0 ? 1 : tag;
}

// Bucket of an index hash in an index of (bucket_mask + 1) buckets, a power of two <= 2^32.
inline uint64_t BucketOf(uint64_t keyhash, uint64_t bucket_mask) { return keyhash & bucket_mask; }

}  // namespace mica

#endif  // HERD_MICA_KEYHASH_H_
