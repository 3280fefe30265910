// One index bucket: a cache line holding a version word and seven 64-bit slots.
// A slot is (16-bit tag << 48) | 48-bit log offset; slot value 0 (tag 0) means empty.
#ifndef HERD_MICA_BUCKET_H_
#define HERD_MICA_BUCKET_H_

#include <atomic>
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

// The owner's side of the sequence lock: every change of a bucket's slots happens between
// BeginBucketWrite and EndBucketWrite, through SetSlot.
inline void BeginBucketWrite(Bucket* bucket) {
  std::atomic_ref<uint32_t> version(bucket->version);
  version.store(version.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // odd before any slot store
}
inline void SetSlot(uint64_t* slot, uint64_t value) {
  std::atomic_ref<uint64_t>(*slot).store(value, std::memory_order_relaxed);
}
inline void EndBucketWrite(Bucket* bucket) {
  std::atomic_ref<uint32_t> version(bucket->version);
  // The slot stores before the even version.
  version.store(version.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

// A reader's side (another thread here; a remote reader does the same with what its READ
// returned): copies the bucket; false if it changed meanwhile or was being changed.
inline bool ReadBucketConsistently(const Bucket& bucket, Bucket* copy) {
  const uint32_t before = std::atomic_ref<uint32_t>(const_cast<uint32_t&>(bucket.version))
                              .load(std::memory_order_acquire);
  if (before % 2 != 0) return false;
  for (int i = 0; i < kSlotsPerBucket; ++i) {
    copy->slots[i] = std::atomic_ref<uint64_t>(const_cast<uint64_t&>(bucket.slots[i]))
                         .load(std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_acquire);  // the slot loads before the re-check
  copy->version = before;
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(bucket.version))
             .load(std::memory_order_relaxed) == before;
}

}  // namespace mica

#endif  // HERD_MICA_BUCKET_H_
