// Partition creation, sizing, and the helpers every operation shares.
#include "mica/partition.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>

#include "absl/strings/str_format.h"
#include "mica/index_hash.h"
#include "mica/keyhash.h"
#include "mica/remote_item.h"

namespace mica {
namespace {

// The log keeps 48-bit offsets in index slots; an offset distance must never wrap.
constexpr uint64_t kMaxLogBytes = uint64_t{1} << 46;
// Store mode's slots hold pool offsets exactly: the same bound keeps them in 48 bits.
constexpr uint64_t kMaxPoolBytes = kMaxLogBytes;
// The owner's area is metadata beside the index (herd's: max_clients x window outcomes); a
// bound keeps a mistyped size from mapping terabytes.
constexpr uint64_t kMaxOwnerAreaBytes = uint64_t{1} << 30;
// Extra buckets are linked by index + 1 in a 32-bit field (0 ends a chain).
constexpr uint64_t kMaxExtraBuckets = UINT32_MAX - 1;

uint64_t ExtraBucketCount(const PartitionConfig& config, uint64_t bucket_count) {
  if (config.extra_bucket_count != 0) return config.extra_bucket_count;
  return std::max<uint64_t>(1, bucket_count / kExtraBucketsPerBucketDivisor);
}

uint64_t DerivedBucketCount(uint64_t expected_items) {
  const double slots = static_cast<double>(expected_items) / kTargetSlotLoad;
  const auto buckets = static_cast<uint64_t>(slots / kSlotsPerBucket) + 1;
  return std::bit_ceil(buckets);
}

}  // namespace

absl::Status ValidateConfig(const PartitionConfig& config) {
  if (config.log_bytes == 0 || config.log_bytes > kMaxLogBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("log_bytes must be in 1..%d, got %d", kMaxLogBytes, config.log_bytes));
  }
  if (config.owner_area_bytes > kMaxOwnerAreaBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("owner_area_bytes must be at most %d, got %d",
                                                      kMaxOwnerAreaBytes, config.owner_area_bytes));
  }
  if (config.bucket_count != 0 && !std::has_single_bit(config.bucket_count)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bucket_count must be a power of two, got %d", config.bucket_count));
  }
  const uint64_t buckets =
      config.bucket_count != 0 ? config.bucket_count : DerivedBucketCount(config.expected_items);
  if (buckets > (uint64_t{1} << kMaxBucketBits)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d buckets exceed the 2^%d that the key hash can address", buckets, kMaxBucketBits));
  }
  // A log shorter than the largest item is not an error: writes of items longer than the log
  // are refused (kNoMemory), the rest work.
  if (config.mode == StoreMode::kStore) {
    if (config.pool_bytes == 0 || config.pool_bytes > kMaxPoolBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pool_bytes must be in 1..%d, got %d", kMaxPoolBytes, config.pool_bytes));
    }
    if (ExtraBucketCount(config, buckets) > kMaxExtraBuckets) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%d extra buckets exceed the %d a chain link can name",
                          ExtraBucketCount(config, buckets), kMaxExtraBuckets));
    }
  }
  return absl::OkStatus();
}

std::string_view StoreModeName(StoreMode mode) {
  return mode == StoreMode::kStore ? "store" : "cache";
}

absl::StatusOr<StoreMode> ParseStoreMode(std::string_view name) {
  if (name == "cache") return StoreMode::kCache;
  if (name == "store") return StoreMode::kStore;
  return absl::InvalidArgumentError(absl::StrFormat(
      "store mode \"%s\" is neither \"cache\" (lossy index over a circular log) nor \"store\" "
      "(keys kept until deleted, slab pool, NO_MEMORY when full)",
      name));
}

absl::StatusOr<std::unique_ptr<Partition>> Partition::Create(const PartitionConfig& config) {
  if (absl::Status status = ValidateConfig(config); !status.ok()) return status;
  const bool store = config.mode == StoreMode::kStore;
  PartitionLayout layout;
  layout.mode = config.mode;
  layout.buckets_offset = sizeof(PartitionHeader);
  layout.bucket_count =
      config.bucket_count != 0 ? config.bucket_count : DerivedBucketCount(config.expected_items);
  layout.max_value_bytes = config.max_value_bytes;
  layout.checksum_from_value_bytes = config.checksum_from_value_bytes;
  RegionRequest request;
  request.try_hugepages = config.try_hugepages;
  if (store) {
    // [ header | main buckets | extra buckets ] then the slab pool; no mirror (a block is
    // contiguous). An item may be as long as a write allows: whether a block that long exists is
    // the allocator's answer (kNoMemory if not).
    layout.extra_bucket_count = ExtraBucketCount(config, layout.bucket_count);
    layout.max_item_bytes = ItemBytes(kMaxKeyBytes, config.max_value_bytes, /*checksum=*/true);
    layout.owner_area_offset =
        layout.buckets_offset + (layout.bucket_count + layout.extra_bucket_count) * sizeof(Bucket);
    request.ring_bytes = config.pool_bytes;
    request.mirror_bytes = 0;
  } else {
    layout.log_bytes = std::bit_ceil(std::max<uint64_t>(config.log_bytes, 4096));
    // Room for a checksum word whatever the threshold: the mirror must hold any item. An item
    // may take the whole log (CheckWrite), never more: it would overwrite its own first bytes.
    layout.max_item_bytes = std::min(
        ItemBytes(kMaxKeyBytes, config.max_value_bytes, /*checksum=*/true), layout.log_bytes);
    layout.owner_area_offset = layout.buckets_offset + layout.bucket_count * sizeof(Bucket);
    request.ring_bytes = layout.log_bytes;
    request.mirror_bytes = layout.max_item_bytes;
  }
  // Buckets are cache lines, so the owner's area starts on one.
  layout.owner_area_bytes = config.owner_area_bytes;
  request.head_bytes = layout.owner_area_offset + layout.owner_area_bytes;
  absl::StatusOr<MirroredRegion> region = MirroredRegion::Create(request);
  if (!region.ok()) return region.status();
  // The ring is a power of two >= 4 KiB (cache mode), so page rounding kept it as is.
  layout.index_bytes = region->head_bytes();
  layout.mirror_bytes = region->mirror_bytes();
  layout.hugepages = region->hugepages();
  std::optional<SlabAllocator> slab;
  if (store) {
    layout.pool_bytes = region->ring_bytes();
    absl::StatusOr<SlabAllocator> formatted =
        SlabAllocator::Format(absl::MakeSpan(region->ring(), region->ring_bytes()), SlabConfig{});
    if (!formatted.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("store mode's slab pool of %d bytes: %s",
                                                        layout.pool_bytes,
                                                        formatted.status().message()));
    }
    slab.emplace(*std::move(formatted));
  }
  return std::unique_ptr<Partition>(new Partition(*std::move(region), layout, std::move(slab)));
}

Partition::Partition(MirroredRegion region, const PartitionLayout& layout,
                     std::optional<SlabAllocator> slab)
    : region_(std::move(region)),
      layout_(layout),
      slab_(std::move(slab)),
      header_(reinterpret_cast<PartitionHeader*>(region_.head())),
      buckets_(reinterpret_cast<Bucket*>(region_.head() + layout.buckets_offset)),
      bucket_mask_(layout.bucket_count - 1),
      log_(region_.ring()),
      log_mask_(store_mode() ? 0 : layout.log_bytes - 1),
      items_(region_.ring()),
      item_mask_(store_mode() ? ~uint64_t{0} : layout.log_bytes - 1) {
  // A fresh, zero-filled region: empty buckets, chains of one, an empty log or pool. Format's
  // writes are not recorded (a replica starts from a full copy, or from its own Create: the
  // primary's first write replaces the header line, and with it this random index key).
  header_->magic = kPartitionMagic;
  header_->mode = static_cast<uint32_t>(layout_.mode);
  const IndexKey key = RandomIndexKey();
  header_->index_key[0] = key.k0;
  header_->index_key[1] = key.k1;
  header_->extra_capacity = static_cast<uint32_t>(layout_.extra_bucket_count);
  if (store_mode()) {
    pool_first_item_ = slab_->data_offset();
    pool_last_item_ = layout_.pool_bytes - sizeof(ItemHeader);
    max_chain_ = layout_.extra_bucket_count + 1;
    extra_buckets_ = buckets_ + layout_.bucket_count;
    StoreGauges& g = stats_.store;
    g.extra_buckets_capacity.Set(layout_.extra_bucket_count);
    g.pool_pages.Set(slab_->page_count());
    g.page_bytes.Set(slab_->page_bytes());
    for (int c = 0; c < kSlabClassCount; ++c) {
      const SlabAllocator::ClassUsage usage = slab_->ClassUsageOf(c);
      g.class_block_bytes[c].Set(usage.block_bytes);
      g.class_span_blocks[c].Set(usage.blocks_per_span);
    }
    PublishStoreGauges(0);
  }
}

uint64_t* Partition::FindSlot(Bucket* head, uint16_t tag, std::string_view key, uint64_t keyhash) {
  return store_mode() ? FindSlotIn<StoreMode::kStore>(head, tag, key, keyhash)
                      : FindSlotIn<StoreMode::kCache>(head, tag, key, keyhash);
}

template <StoreMode kMode>
uint64_t* Partition::FindSlotIn(Bucket* head, uint16_t tag, std::string_view key,
                                uint64_t keyhash) {
  uint64_t hops = 0;
  for (Bucket* bucket = head; bucket != nullptr && hops < max_chain_;
       bucket = kMode == StoreMode::kStore ? NextInChain(bucket) : nullptr, ++hops) {
    for (uint32_t candidates = SlotsTagged(*bucket, tag); candidates != 0;
         candidates &= candidates - 1) {
      uint64_t& slot = bucket->slots[std::countr_zero(candidates)];
      if (!IsAliveIn<kMode>(SlotOffset(slot))) {
        if constexpr (kMode == StoreMode::kStore) {
          continue;  // damaged: skipped, not freed (it names no block we know)
        } else {
          BeginBucketWrite(head);
          SetSlot(&slot, 0);
          EndBucketWrite(head);
          Changed(head);
          continue;
        }
      }
      const ItemHeader* item = ItemAt(SlotOffset(slot));
      if (item->keyhash != keyhash || item->key_bytes != key.size()) continue;
      // Store mode bounds the item before reading its key (cache mode's mirror holds any item):
      // lengths past the pool are damage, counted and skipped (a miss, never a read past it).
      if (kMode == StoreMode::kStore && !InBounds(item)) {
        stats_.corrupt.Add();
        continue;
      }
      if (ItemKeyIs(item, key)) return &slot;
    }
  }
  return nullptr;
}

uint64_t* Partition::ClaimSlot(Bucket* head) {
  if (store_mode()) {
    Bucket* last = head;
    uint64_t hops = 0;
    for (Bucket* bucket = head; bucket != nullptr && hops < max_chain_;
         bucket = NextInChain(bucket), ++hops) {
      for (uint64_t& slot : bucket->slots) {
        if (slot == 0) return &slot;
      }
      last = bucket;
    }
    if (hops >= max_chain_ && NextInChain(last) != nullptr) return nullptr;  // a cyclic chain
    // A full chain: link an extra bucket at its end, a returned one first, else a fresh one.
    // Capacities come from the layout, not the region, which only the owner writes but which
    // damaged memory could change.
    const uint64_t capacity = layout_.extra_bucket_count;
    uint32_t index;  // the extra bucket's index + 1
    if (header_->extra_free_head != 0 && header_->extra_free_head <= capacity) {
      index = header_->extra_free_head;
      header_->extra_free_head = extra_buckets_[index - 1].next_extra;
    } else if (header_->extra_carved < capacity) {
      index = ++header_->extra_carved;
    } else {
      return nullptr;
    }
    ++header_->extra_in_use;
    Changed(header_);
    stats_.store.extra_buckets_in_use.Set(header_->extra_in_use);
    Bucket* extra = &extra_buckets_[index - 1];
    BeginBucketWrite(head);
    extra->next_extra = 0;
    for (uint64_t& slot : extra->slots) SetSlot(&slot, 0);
    last->next_extra = index;
    EndBucketWrite(head);
    Changed(head);
    Changed(last);
    Changed(extra);
    return &extra->slots[0];
  }
  uint64_t* oldest = nullptr;
  uint64_t oldest_age = 0;
  for (uint64_t& slot : head->slots) {
    if (slot == 0 || !IsAlive(SlotOffset(slot))) return &slot;
    const uint64_t age = (header_->log_tail - SlotOffset(slot)) & kSlotOffsetMask;
    if (oldest == nullptr || age > oldest_age) {
      oldest = &slot;
      oldest_age = age;
    }
  }
  stats_.evictions.Add();
  return oldest;
}

void Partition::FillItem(ItemHeader* item, std::string_view key, uint64_t keyhash,
                         std::string_view value, uint64_t version, uint16_t block_code) {
  item->keyhash = keyhash;
  item->version = version;
  item->value_bytes = static_cast<uint32_t>(value.size());
  item->key_bytes = static_cast<uint16_t>(key.size());
  const bool checksum = Checksummed(value.size());
  item->flags = static_cast<uint16_t>((checksum ? kItemHasChecksum : 0) |
                                      (block_code << kItemBlockCodeShift));
  char* bytes = reinterpret_cast<char*>(item) + sizeof(ItemHeader);
  std::memcpy(bytes, key.data(), key.size());
  if (!value.empty()) std::memcpy(bytes + key.size(), value.data(), value.size());
  if (checksum) {
    // The padding is part of what the checksum covers: zero it, not a previous item's bytes.
    const uint64_t body_bytes = ItemBodyBytes(key.size(), value.size());
    const uint64_t used = sizeof(ItemHeader) + key.size() + value.size();
    std::memset(reinterpret_cast<uint8_t*>(item) + used, 0, body_bytes - used);
    const uint64_t sum = ItemChecksum(item);
    std::memcpy(reinterpret_cast<uint8_t*>(item) + body_bytes, &sum, sizeof(sum));
  }
  Changed(item, StoredItemBytes(item));
}

uint64_t Partition::Append(std::string_view key, uint64_t keyhash, std::string_view value,
                           uint64_t version) {
  const uint64_t offset = header_->log_tail;
  const uint64_t position = offset & log_mask_;
  // The mirror makes [position, position + bytes) contiguous even past the ring's end.
  FillItem(reinterpret_cast<ItemHeader*>(log_ + position), key, keyhash, value, version);
  const uint64_t item_bytes = ItemBytes(key.size(), value.size(), Checksummed(value.size()));
  if (position + item_bytes >= layout_.log_bytes) stats_.log_wraps.Add();
  header_->log_tail += item_bytes;
  Changed(header_);
  return offset;
}

Result Partition::CheckWrite(std::string_view key, std::string_view value) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    stats_.rejected.Add();
    return Result::kKeyTooLong;
  }
  if (value.size() > layout_.max_value_bytes) {
    stats_.rejected.Add();
    return Result::kValueTooLong;
  }
  // The share of the log one item may take is all of it: writing such an item evicts every
  // other one, which is what a cache asked to hold it must do; a smaller cap (say half) would
  // refuse values that a log this size can hold, and that configurations always accepted. Only
  // an item longer than the log, which would overwrite its own first bytes, is refused; before
  // any slot is claimed, so nothing is stored and nothing evicted.
  if (ItemBytes(key.size(), value.size(), Checksummed(value.size())) > layout_.max_item_bytes) {
    stats_.no_memory.Add();
    return Result::kNoMemory;
  }
  return Result::kOk;
}

bool Partition::ChecksumVerifies(const ItemHeader* item) const {
  uint64_t stored;
  std::memcpy(
      &stored,
      reinterpret_cast<const uint8_t*>(item) + ItemBodyBytes(item->key_bytes, item->value_bytes),
      sizeof(stored));
  return stored == ItemChecksum(item);
}

Result Partition::WriteItem(Bucket* head, uint64_t* slot, uint16_t tag, std::string_view key,
                            uint64_t keyhash, std::string_view value, uint64_t* version) {
  return store_mode() ? WriteStored(head, slot, tag, key, keyhash, value, version)
                      : WriteCached(head, slot, tag, key, keyhash, value, version);
}

Result Partition::WriteCached(Bucket* head, uint64_t* slot, uint16_t tag, std::string_view key,
                              uint64_t keyhash, std::string_view value, uint64_t* version) {
  if (slot == nullptr) slot = ClaimSlot(head);  // evicts from a full bucket
  *version = NextVersion();
  const uint64_t offset = Append(key, keyhash, value, *version);
  BeginBucketWrite(head);
  SetSlot(slot, MakeSlot(tag, offset));
  EndBucketWrite(head);
  Changed(head);
  return Result::kOk;
}

Response Partition::Execute(const Request& request) {
  return ExecuteAt(request, SpotOf(request.key));
}

Response Partition::ExecuteAt(const Request& request, const Spot& spot) {
  switch (request.op) {
    case OpCode::kGet:
      return GetAt(spot, request.key, request.keyhash, request.value_out, request.value_out_bytes);
    case OpCode::kPut:
      return PutAt(spot, request.key, request.keyhash, request.value);
    case OpCode::kDelete:
      return DeleteAt(spot, request.key, request.keyhash);
    case OpCode::kCas:
      return CasAt(spot, request.key, request.keyhash, request.expected_version, request.value);
    case OpCode::kInsert:
      return InsertAt(spot, request.key, request.keyhash, request.value);
  }
  // An OpCode cast from untrusted bytes.
  stats_.rejected.Add();
  return Response{Result::kInvalidOp, 0, 0};
}

absl::Status ToStatus(Result result) {
  switch (result) {
    case Result::kOk:
      return absl::OkStatus();
    case Result::kNotFound:
      return absl::NotFoundError("key not found");
    case Result::kCasFailed:
      return absl::FailedPreconditionError("CAS failed: version mismatch");
    case Result::kKeyTooLong:
      return absl::InvalidArgumentError("key empty or longer than 256 bytes");
    case Result::kValueTooLong:
      return absl::OutOfRangeError("value longer than the partition's limit");
    case Result::kBufferTooSmall:
      return absl::ResourceExhaustedError("value does not fit the caller's buffer");
    case Result::kInvalidOp:
      return absl::InvalidArgumentError("opcode is none of GET, PUT, DELETE, CAS, INSERT");
    case Result::kExists:
      return absl::AlreadyExistsError("INSERT: the key is present");
    case Result::kNoMemory:
      return absl::ResourceExhaustedError(
          "no room: the item is longer than the whole log (cache mode), or the store's pool or "
          "index is full (store mode)");
    case Result::kCorrupt:
      return absl::DataLossError(
          "the item fails its own checksum: the partition's memory is damaged");
  }
  return absl::InternalError("unknown mica::Result");
}

std::string_view ResultName(Result result) {
  switch (result) {
    case Result::kOk:
      return "OK";
    case Result::kNotFound:
      return "NOT_FOUND";
    case Result::kCasFailed:
      return "CAS_FAILED";
    case Result::kKeyTooLong:
      return "KEY_TOO_LONG";
    case Result::kValueTooLong:
      return "VALUE_TOO_LONG";
    case Result::kBufferTooSmall:
      return "BUFFER_TOO_SMALL";
    case Result::kInvalidOp:
      return "INVALID_OP";
    case Result::kExists:
      return "EXISTS";
    case Result::kNoMemory:
      return "NO_MEMORY";
    case Result::kCorrupt:
      return "CORRUPT";
  }
  return "UNKNOWN";
}

uint64_t PartitionLayout::LogCapacityItems(uint32_t key_bytes, uint32_t value_bytes) const {
  const uint64_t item = ItemBytes(key_bytes, value_bytes, value_bytes >= checksum_from_value_bytes);
  if (mode == StoreMode::kCache) return log_bytes / item;
  // The pool's pages after the allocator's header and one 32-byte descriptor per page, in
  // blocks of the item's class (span tails ignored: under 1% for every class, slab.cc).
  const uint64_t page = kSlabDefaultPageBytes;
  const uint64_t pages = pool_bytes / (page + sizeof(SlabPage));
  const uint64_t block = SlabBlockBytesFor(item, page);
  return pages * page / block;
}

uint64_t PartitionLayout::IndexSlots() const {
  return (bucket_count + extra_bucket_count) * kSlotsPerBucket;
}

double PartitionLayout::BytesPerItem(uint32_t key_bytes, uint32_t value_bytes) const {
  const uint64_t items = std::min<uint64_t>(LogCapacityItems(key_bytes, value_bytes), IndexSlots());
  return items == 0 ? 0.0 : static_cast<double>(index_bytes + log_bytes + pool_bytes) / items;
}

std::string PartitionLayout::Describe(uint32_t key_bytes, uint32_t value_bytes) const {
  if (mode == StoreMode::kStore) {
    return absl::StrFormat(
        "store mode: %d buckets + %d extra (%.1f MiB index, %d slots), %.1f MiB slab pool holding "
        "about %d items of %d+%d bytes, %.1f bytes/item, %s pages",
        bucket_count, extra_bucket_count, index_bytes / 1048576.0, IndexSlots(),
        pool_bytes / 1048576.0, LogCapacityItems(key_bytes, value_bytes), key_bytes, value_bytes,
        BytesPerItem(key_bytes, value_bytes), hugepages ? "2 MiB" : "4 KiB");
  }
  return absl::StrFormat(
      "cache mode: %d buckets (%.1f MiB index, %d slots), %.1f MiB log holding %d items of %d+%d "
      "bytes, %.1f bytes/item, %s pages",
      bucket_count, index_bytes / 1048576.0, IndexSlots(), log_bytes / 1048576.0,
      LogCapacityItems(key_bytes, value_bytes), key_bytes, value_bytes,
      BytesPerItem(key_bytes, value_bytes), hugepages ? "2 MiB" : "4 KiB");
}

}  // namespace mica
