// One index bucket: a cache line holding a version word, a chain link and seven 64-bit slots.
// A slot is (16-bit tag << 48) | 48-bit item offset (cache mode: a virtual log offset; store
// mode: the item's block in the slab pool); slot value 0 (tag 0) means empty.
//
// Chains (store mode only): a full bucket links to an extra bucket from the partition's pool
// (next_extra), which may link to another. The main bucket's version guards its whole chain:
// every change of any slot or link in a chain happens between BeginBucketWrite and
// EndBucketWrite on the chain's main bucket, so a reader outside the owning core reads the main
// bucket's version, walks the chain, and re-checks that version. In cache mode next_extra is
// always 0 and a chain is one bucket.
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
  // The chain's next extra bucket: its index in the extra pool plus one; 0 ends the chain. A
  // free extra bucket links the pool's free list the same way.
  uint32_t next_extra;
  uint64_t slots[kSlotsPerBucket];
};
static_assert(sizeof(Bucket) == kCacheLineBytes, "a bucket is one cache line");

// Store mode: the extra-bucket pool's state, one cache line at the start of the index region,
// before the main buckets (so a byte copy of the region, a backup's, is the same pool). Extra
// buckets [0, carved) were handed out at least once; a returned one goes on the free list.
struct alignas(kCacheLineBytes) ExtraPoolHeader {
  uint32_t capacity;   // extra buckets in the pool
  uint32_t carved;     // extra buckets ever handed out (the rest were never touched)
  uint32_t free_head;  // a returned extra bucket (index + 1) linking the next by next_extra; 0
  uint32_t reserved0;
  uint64_t in_use;  // extra buckets linked into chains now
  uint64_t reserved[5];
};
static_assert(sizeof(ExtraPoolHeader) == kCacheLineBytes, "the pool header is one cache line");

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
