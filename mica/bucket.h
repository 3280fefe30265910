// One index bucket: a cache line holding a version word and seven 64-bit slots.
// A slot is (16-bit tag << 48) | 48-bit log offset; slot value 0 (tag 0) means empty.
#ifndef HERD_MICA_BUCKET_H_
#define HERD_MICA_BUCKET_H_

#include <cstdint>

namespace mica {

inline constexpr int kSlotsPerBucket = 7;
inline constexpr int kSlotTagShift = 48;
inline constexpr uint64_t kSlotOffsetMask = (uint64_t{1} << kSlotTagShift) - 1;
inline constexpr uint64_t kCacheLineBytes = 64;

struct alignas(kCacheLineBytes) Bucket {
  // Bumped on every change of the bucket, so a reader outside the owning core (a one-sided
  // RDMA READ) can detect a bucket that changed while it read.
  uint32_t version;
  uint32_t reserved;
  uint64_t slots[kSlotsPerBucket];
};
static_assert(sizeof(Bucket) == kCacheLineBytes, "a bucket is one cache line");

inline constexpr uint64_t MakeSlot(uint16_t tag, uint64_t offset) {
  return (uint64_t{tag} << kSlotTagShift) | (offset & kSlotOffsetMask);
}
inline constexpr uint16_t SlotTag(uint64_t slot) {
  return static_cast<uint16_t>(slot >> kSlotTagShift);
}
inline constexpr uint64_t SlotOffset(uint64_t slot) { return slot & kSlotOffsetMask; }

}  // namespace mica

#endif  // HERD_MICA_BUCKET_H_
