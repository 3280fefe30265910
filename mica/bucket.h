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

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// One cache line at the start of every partition's region, before the main buckets: the state
// the partition keeps besides buckets and items (its version clock, cache mode's log tail,
// store mode's extra-bucket pool), so that a byte copy of the region (a backup's, written by
// RDMA at the same offsets) is the same partition, and a promoted backup continues from it.
// Extra buckets [0, extra_carved) were handed out at least once; a returned one goes on the
// free list (linked by next_extra).
inline constexpr uint64_t kPartitionMagic = 0x5452415044524548ULL;  // "HERDPART"
struct alignas(kCacheLineBytes) PartitionHeader {
  uint64_t magic;            // kPartitionMagic
  uint32_t mode;             // StoreMode
  uint32_t extra_capacity;   // store mode: extra buckets in the pool
  uint64_t version_clock;    // the last version handed out
  uint64_t log_tail;         // cache mode: the virtual log offset of the next append
  uint32_t extra_carved;     // store mode: extra buckets ever handed out
  uint32_t extra_free_head;  // a returned extra bucket (index + 1); 0: none
  uint64_t extra_in_use;     // store mode: extra buckets linked into chains now
  // The secret IndexHash key that places entries in buckets (index_hash.h): random at creation,
  // and a replica's is its primary's (a byte copy of this line), so both index alike.
  uint64_t index_key[2];
};
static_assert(sizeof(PartitionHeader) == kCacheLineBytes, "the partition header is one cache line");

inline constexpr uint64_t MakeSlot(uint16_t tag, uint64_t offset) {
  return (uint64_t{tag} << kSlotTagShift) | (offset & kSlotOffsetMask);
}
inline constexpr uint16_t SlotTag(uint64_t slot) {
  return static_cast<uint16_t>(slot >> kSlotTagShift);
}
inline constexpr uint64_t SlotOffset(uint64_t slot) { return slot & kSlotOffsetMask; }

// The slots of `bucket` whose tag is `tag`, as a mask (bit i: slots[i]). `tag` is never 0 (TagOf),
// so an empty slot never matches. Branch-free over the seven slots: a lookup pays no mispredicted
// branch per slot, only one per candidate, and nearly every bucket holds at most one candidate
// for a 16-bit tag. Every lookup computes it twice (prefetch, then find), so it is vector code
// where the build allows (AVX2, as --config=opt targets: ~12 instructions against ~33 slot by
// slot, which GCC 12 does not vectorize).
inline uint32_t SlotsTagged(const Bucket& bucket, uint16_t tag);

// Slot by slot: the definition, and the code where AVX2 is not available.
inline uint32_t SlotsTaggedEach(const Bucket& bucket, uint16_t tag) {
  uint32_t mask = 0;
  for (int i = 0; i < kSlotsPerBucket; ++i) {
    mask |= static_cast<uint32_t>(SlotTag(bucket.slots[i]) == tag) << i;
  }
  return mask;
}

#if defined(__x86_64__)
// Four slots at a time: slots 0..3 and 3..6 (two loads inside the bucket's line, never its
// version and link word), each 64-bit lane's tag bits compared whole. Compiled for AVX2 whatever
// the build targets, so that tests/mica:bucket_test checks it in every configuration; called
// only where the build targets AVX2 (SlotsTagged) or the CPU was asked (the test).
[[gnu::target("avx2")]] inline uint32_t SlotsTaggedAvx2(const Bucket& bucket, uint16_t tag) {
  static_assert(kSlotsPerBucket == 7, "two overlapping loads of four slots");
  const __m256i tag_bits = _mm256_set1_epi64x(static_cast<int64_t>(~kSlotOffsetMask));
  const __m256i wanted = _mm256_set1_epi64x(static_cast<int64_t>(uint64_t{tag} << kSlotTagShift));
  const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&bucket.slots[0]));
  const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&bucket.slots[3]));
  const auto low_mask = static_cast<uint32_t>(_mm256_movemask_pd(
      _mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(low, tag_bits), wanted))));
  const auto high_mask = static_cast<uint32_t>(_mm256_movemask_pd(
      _mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(high, tag_bits), wanted))));
  return low_mask | high_mask << 3;
}
#endif

inline uint32_t SlotsTagged(const Bucket& bucket, uint16_t tag) {
#if defined(__AVX2__)
  return SlotsTaggedAvx2(bucket, tag);
#else
  return SlotsTaggedEach(bucket, tag);
#endif
}

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
