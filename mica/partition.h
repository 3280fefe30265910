// One MICA partition, owned by exactly one thread (EREW: no locks, no atomics on the hot path),
// in one of two modes (config.h, StoreMode): a cache (a lossy index over a circular log) or a
// store (a lossless index with chained extra buckets over a slab pool).
//
// Contract:
// - GET returns the latest value and version of a key, or kNotFound. It never returns a stale
//   value or another key's bytes: every hit compares the full key (and, in cache mode, checks
//   that the item is still alive in the log).
// - Cache mode is lossy: the partition may forget a key (a full bucket evicts its OLDEST item;
//   the log overwrites its oldest bytes). Store mode is not: a key stays until DELETE; a write
//   that finds no block in the pool, or no slot in a full chain with the extra-bucket pool
//   empty, is refused with kNoMemory and changes nothing (the key keeps its old value).
// - Versions come from a per-partition clock: every successful PUT, CAS and DELETE takes the next
//   value, so a key's version strictly increases, even across DELETE and re-insert (no ABA).
// - GET copies the value into the caller's buffer: results never point into the log, so no
//   later operation can change bytes a caller holds. An item that carries a checksum is copied
//   only if it verifies (kCorrupt otherwise): damaged memory is reported, never delivered.
// - A write whose item (header, key, value) is longer than the whole log (cache mode) is refused
//   with kNoMemory before anything is stored or evicted.
// - Store mode writes in place when the new item needs the same block size (slab.h:
//   BlockBytesFor), else it moves: a new block, the slot swung, the old block freed. A one-sided
//   reader of a freed or rewritten block is caught by the item checksum and the version the GET
//   named (remote_item.h), exactly as for a log overwritten under it; docs/architecture.md argues
//   why freeing need not wait for readers.
// - Nothing on the operation path allocates, locks or makes a system call.
#ifndef HERD_MICA_PARTITION_H_
#define HERD_MICA_PARTITION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "mica/bucket.h"
#include "mica/config.h"
#include "mica/index_hash.h"
#include "mica/item.h"
#include "mica/keyhash.h"
#include "mica/mirrored_region.h"
#include "mica/slab.h"
#include "mica/stats.h"

namespace mica {

enum class OpCode : uint8_t { kGet = 0, kPut = 1, kDelete = 2, kCas = 3, kInsert = 4 };

// Outcome of one operation. A wire-friendly byte; ToStatus() gives the absl::Status equivalent.
enum class Result : uint8_t {
  kOk = 0,
  kNotFound = 1,        // no such key (never stored, deleted, or evicted)
  kCasFailed = 2,       // CAS: the key's version is not the expected one
  kKeyTooLong = 3,      // key empty or longer than kMaxKeyBytes
  kValueTooLong = 4,    // value longer than the partition's max_value_bytes
  kBufferTooSmall = 5,  // GET: the caller's buffer cannot hold the value (value_bytes says how big)
  kInvalidOp = 6,       // opcode is none of GET, PUT, DELETE, CAS, INSERT
  kExists = 7,          // INSERT: the key is present (version says which)
  kNoMemory = 8,        // PUT/CAS/INSERT: no room, nothing changed (cache mode: the item is
                        // longer than the whole log; store mode: no block, or no index slot)
  kCorrupt = 9,         // GET: the item fails its own checksum (the partition's memory is
                        // damaged: never the caller's fault); nothing was copied
};

absl::Status ToStatus(Result result);
std::string_view ResultName(Result result);

struct Request {
  OpCode op = OpCode::kGet;
  uint64_t keyhash = 0;  // KeyHash(key); the caller computes it (it also routes the key)
  std::string_view key;
  std::string_view value;         // PUT, CAS: the new value
  uint64_t expected_version = 0;  // CAS only
  char* value_out = nullptr;      // GET: where the value is copied
  uint32_t value_out_bytes = 0;   // GET: capacity of value_out
};

struct Response {
  Result result = Result::kOk;
  uint32_t value_bytes = 0;  // GET: the value's length (also when kBufferTooSmall)
  // GET: the value's version; PUT/CAS/DELETE/INSERT: the version they created; kCasFailed and
  // kExists: the key's current version.
  uint64_t version = 0;
  // GET that found the key (kOk or kBufferTooSmall): where its item lies in the region's ring
  // (cache mode: a byte position < log_bytes, the mirror making [position, position +
  // item_bytes) contiguous; store mode: its block's offset in the slab pool) and its length, for
  // a one-sided reader (remote_item.h). 0 otherwise.
  uint64_t item_position = 0;
  uint32_t item_bytes = 0;
};

// Sizes the partition ended up with (after rounding) and what they mean per item.
struct PartitionLayout {
  StoreMode mode = StoreMode::kCache;
  uint64_t bucket_count = 0;
  uint64_t extra_bucket_count = 0;  // store mode
  // Where the main buckets start in the region's head: 0, or after store mode's pool header;
  // the extra buckets follow the main ones.
  uint64_t buckets_offset = 0;
  uint64_t index_bytes = 0;
  // PartitionConfig::owner_area_bytes, at this offset in the head (after the buckets, cache-line
  // aligned; index_bytes includes it).
  uint64_t owner_area_offset = 0;
  uint64_t owner_area_bytes = 0;
  uint64_t log_bytes = 0;       // cache mode: ring size, a power of two
  uint64_t pool_bytes = 0;      // store mode: the slab pool (the ring), header included
  uint64_t mirror_bytes = 0;    // extra mapping of the ring's start (no extra memory)
  uint64_t max_item_bytes = 0;  // the longest item a write may store (cache: at most log_bytes)
  uint32_t max_value_bytes = 0;
  uint32_t checksum_from_value_bytes = kNoItemChecksums;
  bool hugepages = false;

  // Items of the given sizes the log (or pool) holds before it overwrites (or is full), and
  // memory (index + log or pool) each.
  uint64_t LogCapacityItems(uint32_t key_bytes, uint32_t value_bytes) const;
  uint64_t IndexSlots() const;  // main and extra buckets' slots
  double BytesPerItem(uint32_t key_bytes, uint32_t value_bytes) const;
  std::string Describe(uint32_t key_bytes, uint32_t value_bytes) const;
};

class Partition {
 public:
  static absl::StatusOr<std::unique_ptr<Partition>> Create(const PartitionConfig& config);

  Partition(const Partition&) = delete;
  Partition& operator=(const Partition&) = delete;

  // One file per operation: get.cc, put.cc, delete.cc, cas.cc, insert.cc.
  Response Get(std::string_view key, uint64_t keyhash, char* value_out, uint32_t value_out_bytes);
  Response Put(std::string_view key, uint64_t keyhash, std::string_view value);
  Response Delete(std::string_view key, uint64_t keyhash);
  Response Insert(std::string_view key, uint64_t keyhash, std::string_view value);
  Response Cas(std::string_view key, uint64_t keyhash, uint64_t expected_version,
               std::string_view value);
  Response Execute(const Request& request);
  // The hash this partition places `key`'s index entry by: bucket from its low bits, tag from
  // bits 32..47 (keyhash.h's layout), IndexHash of the key's bytes under the key in the
  // partition's header (a replica's: its primary's). Clients never learn it (index_hash.h).
  uint64_t IndexHash(std::string_view key) const { return mica::IndexHash(key, index_key()); }

  // A backup's GET (replica_read.cc), on a region a primary's WRITEs keep changing (RDMA, or
  // another process): reads only, never changes a byte (no stats either), and hands out a value
  // only from a whole copy of its item that verifies (checksum, keyhash, key). `scratch` holds
  // that copy (8-byte aligned); an item longer than it, or a value longer than value_out_bytes,
  // is kBufferTooSmall with the item's place and size as read (a caller that READs it verifies
  // its own copy). Every item must carry a checksum (checksum_from_value_bytes = 0: a
  // replicated partition's rule); one without cannot verify.
  // kOk: the value; kNotFound: no item of the key in a chain that did not change while read
  // (the caller confirms the miss against a moment no WRITE was landing, herd/replication/log.h:
  // LandingWords); kCorrupt: a torn read (a bucket changing, an item that fails its checksum):
  // read again.
  Response ReadReplica(std::string_view key, uint64_t keyhash, char* value_out,
                       uint32_t value_out_bytes, absl::Span<uint64_t> scratch) const;

  // The worker's hot path (batch.cc): prefetches every request's bucket, then each candidate
  // item's first cache lines, then (cache mode) the log's lines the writes will append to, then
  // executes the requests in order. responses.size() must be >= requests.size().
  void ExecuteBatch(absl::Span<const Request> requests, absl::Span<Response> responses);

  const PartitionStats& stats() const { return stats_; }
  const PartitionLayout& layout() const { return layout_; }
  // The partition's memory (index, log, mirror; or index, pool) for registration with a NIC,
  // and its memfd.
  const MirroredRegion& region() const { return region_; }
  // Store mode's allocator (nullptr in cache mode), for tests and reports. Owner thread only.
  const SlabAllocator* slab() const { return slab_ ? &*slab_ : nullptr; }
  // Records every later change of the region's bytes (items, bucket lines, the header, the
  // allocator's state) as offsets from region().base() in `changes` (nullptr: none, the
  // default). Copying those ranges from this region to a replica's region of the same layout
  // keeps the replica byte-identical (tests/mica/replication_test.cc); the caller clears it,
  // and sizes it for what it lets pile up (a PUT adds up to about 10 ranges).
  void set_change_recorder(DirtyRanges* changes);
  // The owner's area (PartitionConfig::owner_area_bytes; empty without one). The owner writes
  // it and reports each change with OwnerAreaChanged, so a change recorder sees it (replicas).
  absl::Span<uint8_t> owner_area() {
    return {region_.head() + layout_.owner_area_offset, layout_.owner_area_bytes};
  }
  absl::Span<const uint8_t> owner_area() const {
    return {region_.head() + layout_.owner_area_offset, layout_.owner_area_bytes};
  }
  void OwnerAreaChanged(uint64_t offset, uint64_t bytes) {
    Changed(region_.head() + layout_.owner_area_offset + offset, bytes);
  }
  // A replica's side, before it serves a single operation of its own (a promotion): takes over
  // the state a primary left in this partition's region. Checks the header (magic, mode, extra
  // pool sizes) against this partition's layout and, in store mode, attaches the allocator to
  // the pool and checks the index and allocator agree (O(region)); republishes the gauges.
  absl::Status ResumeFromRegion();
  // The newest version handed out (every write so far carries a version at most this).
  uint64_t version_clock() const { return header_->version_clock; }
  // A promoted replica's clock jumps `gap` ahead: versions a dead primary handed out for writes
  // this replica never received are never handed out again (a CAS naming one fails).
  void AdvanceVersionClock(uint64_t gap) {
    Changed(header_);
    header_->version_clock += gap;
  }

  // Store mode: walks the index and the allocator and checks that they agree (every slot names
  // a live block holding an intact item of its key's bucket and tag, no block is named twice,
  // the live blocks are exactly the slots' items, chains end, the extra pool's counts match).
  // False with the reason in `why`. O(index + pool); tests and debug checks.
  bool CheckStoreInvariants(std::string* why) const;

 private:
  Partition(MirroredRegion region, const PartitionLayout& layout,
            std::optional<SlabAllocator> slab);

  bool store_mode() const { return slab_.has_value(); }
  // The change recorder's view (set_change_recorder): `bytes` at `p` in the region changed.
  void Changed(const void* p, uint64_t bytes) {
    if (changes_ != nullptr) [[unlikely]] {
      changes_->Add(static_cast<uint64_t>(static_cast<const uint8_t*>(p) - region_.base()), bytes);
    }
  }
  void Changed(const Bucket* bucket) { Changed(bucket, sizeof(Bucket)); }
  void Changed(const PartitionHeader* header) { Changed(header, sizeof(PartitionHeader)); }
  // The bucket line holding `slot` changed (buckets are cache-line aligned).
  void SlotChanged(const uint64_t* slot) {
    Changed(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(slot) &
                                          ~uintptr_t{kCacheLineBytes - 1}),
            kCacheLineBytes);
  }
  uint64_t NextVersion() {
    Changed(header_);
    return ++header_->version_clock;
  }
  // Where `key`'s index entry lives: its chain's main bucket and its tag (IndexHash), found once
  // per operation.
  struct Spot {
    Bucket* bucket;
    uint16_t tag;
  };
  Spot SpotOf(std::string_view key) const { return SpotOf(key, index_key()); }
  Spot SpotOf(std::string_view key, const IndexKey& secret) const {
    const uint64_t h = mica::IndexHash(key, secret);
    return Spot{&buckets_[h & bucket_mask_], TagOf(h)};
  }
  // The IndexHash key in the header. Relaxed atomic loads: a replica's header line is rewritten
  // (with the same key) by its primary's WRITEs while readers use it.
  IndexKey index_key() const {
    return IndexKey{
        std::atomic_ref<uint64_t>(header_->index_key[0]).load(std::memory_order_relaxed),
        std::atomic_ref<uint64_t>(header_->index_key[1]).load(std::memory_order_relaxed)};
  }
  // ExecuteBatch for one mode, chosen once per batch (batch.cc).
  template <StoreMode kMode>
  void ExecuteBatchIn(absl::Span<const Request> requests, absl::Span<Response> responses);
  // Prefetches the first lines of every item the spot's bucket holds under its tag (batch.cc).
  template <StoreMode kMode>
  void PrefetchCandidates(const Spot& spot) const;
  // Cache mode: prefetches the log's lines from its tail on, as many as `bytes` of appends will
  // write (at most kTailPrefetchLines; batch.cc).
  void PrefetchLogTail(uint64_t bytes) const;
  // The operations at a spot SpotOf found (ExecuteBatch finds every spot before executing).
  Response ExecuteAt(const Request& request, const Spot& spot);
  Response GetAt(const Spot& spot, std::string_view key, uint64_t keyhash, char* value_out,
                 uint32_t value_out_bytes);
  Response PutAt(const Spot& spot, std::string_view key, uint64_t keyhash, std::string_view value);
  Response DeleteAt(const Spot& spot, std::string_view key, uint64_t keyhash);
  Response InsertAt(const Spot& spot, std::string_view key, uint64_t keyhash,
                    std::string_view value);
  Response CasAt(const Spot& spot, std::string_view key, uint64_t keyhash,
                 uint64_t expected_version, std::string_view value);
  // The next bucket of a chain, or nullptr (always in cache mode; also for a link out of range,
  // which only damaged memory could hold).
  Bucket* NextInChain(const Bucket* bucket) const {
    const uint32_t next = bucket->next_extra;
    return next == 0 || next > layout_.extra_bucket_count ? nullptr : &extra_buckets_[next - 1];
  }
  // Cache mode: the log has not overwritten the item. Store mode: the offset lies where an item's
  // header can (only damaged memory holds another; such a slot is skipped, never followed; the
  // rest of the item is bounded by InBounds before its key is compared).
  bool IsAlive(uint64_t slot_offset) const {
    return store_mode() ? IsAliveIn<StoreMode::kStore>(slot_offset)
                        : IsAliveIn<StoreMode::kCache>(slot_offset);
  }
  template <StoreMode kMode>
  bool IsAliveIn(uint64_t slot_offset) const {
    if constexpr (kMode == StoreMode::kStore) {
      return slot_offset >= pool_first_item_ && slot_offset <= pool_last_item_;
    } else {
      return ((header_->log_tail - slot_offset) & kSlotOffsetMask) <= log_mask_ + 1;
    }
  }
  const ItemHeader* ItemAt(uint64_t slot_offset) const {
    return reinterpret_cast<const ItemHeader*>(items_ + (slot_offset & item_mask_));
  }
  ItemHeader* MutableItemAt(uint64_t slot_offset) {
    return reinterpret_cast<ItemHeader*>(items_ + (slot_offset & item_mask_));
  }
  // The slot in the chain of `head` that indexes a live item holding exactly `key`, or
  // nullptr. Cache mode clears slots with this tag whose item died, so a long-dead slot can
  // never alias a live offset once the 48-bit offsets wrap.
  // The mode is chosen once per lookup: FindSlotIn is the loop for one mode.
  uint64_t* FindSlot(Bucket* head, uint16_t tag, std::string_view key, uint64_t keyhash);
  template <StoreMode kMode>
  uint64_t* FindSlotIn(Bucket* head, uint16_t tag, std::string_view key, uint64_t keyhash);
  // A slot for a new key. Cache mode: an empty or dead one, else the one of the bucket's oldest
  // item (evicted). Store mode: an empty one anywhere in the chain, else the first of an extra
  // bucket linked at the chain's end; nullptr when the extra pool is empty (nothing changed).
  uint64_t* ClaimSlot(Bucket* head);
  // Store mode: whether ClaimSlot would find a slot (an empty one, or an extra bucket), with no
  // side effect: a new key is refused before anything is allocated.
  bool CanClaimSlot(Bucket* head) const;
  // Store mode: empties `slot` (in the chain of `head`) and returns an extra bucket left empty
  // to the pool. The caller frees the item's block.
  void ReleaseSlot(Bucket* head, uint64_t* slot);
  // The bytes an item in place takes (header, key, value, padding, checksum word if flagged).
  static uint64_t StoredItemBytes(const ItemHeader* item) {
    return ItemBytes(item->key_bytes, item->value_bytes, (item->flags & kItemHasChecksum) != 0);
  }
  // Writes an item's header, key, value (and checksum) at `item`; `block_code` goes into its
  // flags (item.h: store mode's block size code; 0 in cache mode).
  void FillItem(ItemHeader* item, std::string_view key, uint64_t keyhash, std::string_view value,
                uint64_t version, uint16_t block_code = 0);
  // Appends an item and returns its log offset.
  uint64_t Append(std::string_view key, uint64_t keyhash, std::string_view value, uint64_t version);
  // Validates sizes for a write; kOk when they fit.
  Result CheckWrite(std::string_view key, std::string_view value);
  // Whether an item of this value length carries a checksum word.
  bool Checksummed(uint64_t value_bytes) const {
    return value_bytes >= layout_.checksum_from_value_bytes;
  }
  // Whether a found item's lengths are ones a write could have stored, within the log's mirror or
  // the pool: a GET may name it to a one-sided reader (whose READ must stay in the region).
  // Inline, as Intact's common case: both run on every GET that finds its key.
  bool InBounds(const ItemHeader* item) const {
    const uint64_t item_bytes = StoredItemBytes(item);
    // Lengths no write could have stored would read past the mirror: damaged.
    if (item_bytes > layout_.max_item_bytes) return false;
    if (!store_mode()) return true;
    // Store mode: nor past the pool's end (a block holds its item; lengths past it are damage).
    const auto offset = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(item) - items_);
    return offset <= layout_.pool_bytes && item_bytes <= layout_.pool_bytes - offset;
  }
  // Whether an item InBounds found may be handed out: a checksummed one must verify.
  bool IntactInBounds(const ItemHeader* item) const {
    const bool flagged = (item->flags & kItemHasChecksum) != 0;
    if (!flagged && !Checksummed(item->value_bytes)) return true;  // nothing to verify it by
    // An item of a checksummed length without the flag lost it: damaged as well.
    return flagged && ChecksumVerifies(item);
  }
  // Whether a found item may be handed out: in bounds, and a checksummed one must verify.
  bool Intact(const ItemHeader* item) const { return InBounds(item) && IntactInBounds(item); }
  // Whether a flagged item's checksum word matches its bytes.
  bool ChecksumVerifies(const ItemHeader* item) const;
  // Makes the key's slot (`slot`, found by FindSlot; nullptr for a key the index does not hold:
  // one is claimed) index an item holding key/value under the next version, stored in `*version`.
  // kOk, or kNoMemory with nothing changed (store mode: no block, or no slot).
  Result WriteItem(Bucket* head, uint64_t* slot, uint16_t tag, std::string_view key,
                   uint64_t keyhash, std::string_view value, uint64_t* version);
  Result WriteCached(Bucket* head, uint64_t* slot, uint16_t tag, std::string_view key,
                     uint64_t keyhash, std::string_view value, uint64_t* version);
  Result WriteStored(Bucket* head, uint64_t* slot, uint16_t tag, std::string_view key,
                     uint64_t keyhash, std::string_view value, uint64_t* version);
  // Store mode: the block size code an item of `item_bytes` carries (item.h).
  static uint16_t BlockCodeFor(uint64_t item_bytes);
  // Store mode: whether an item of `item_bytes` (code `block_code`) may overwrite `old` in its
  // block at `old_block`.
  bool FitsInPlace(const ItemHeader* old, uint64_t old_block, uint64_t item_bytes,
                   uint16_t block_code) const;
  // Store mode: frees a block and republishes the gauges it changed.
  void FreeBlock(uint64_t offset);
  // Store mode: sets stats_.store's levels for the class of `block_bytes` and the page heap.
  void PublishStoreGauges(uint64_t block_bytes);

  MirroredRegion region_;
  PartitionLayout layout_;
  std::optional<SlabAllocator> slab_;  // store mode
  PartitionHeader* header_;            // at the region's start: clock, tail, extra pool
  Bucket* buckets_;
  uint64_t bucket_mask_;
  Bucket* extra_buckets_ = nullptr;  // store mode
  uint8_t* log_;                     // the ring: the log, or the slab pool
  uint64_t log_mask_;                // cache mode
  uint8_t* items_;                   // where slot offsets point: log_ in both modes
  uint64_t item_mask_;               // log_mask_, or all ones (a pool offset is exact)
  // Store mode: the first and last pool offsets where an item's header fits.
  uint64_t pool_first_item_ = 0;
  uint64_t pool_last_item_ = 0;
  // Store mode: the most buckets a chain walk visits (a longer one is a cycle in damaged memory).
  uint64_t max_chain_ = 1;
  DirtyRanges* changes_ = nullptr;  // set_change_recorder
  PartitionStats stats_;
};

}  // namespace mica

#endif  // HERD_MICA_PARTITION_H_
