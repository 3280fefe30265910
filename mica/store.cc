// Store mode's write path and bookkeeping: items in slab blocks, chains of extra buckets,
// NO_MEMORY instead of eviction (partition.h states the contract).
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "mica/keyhash.h"
#include "mica/partition.h"

namespace mica {

Result Partition::WriteStored(Bucket* head, uint64_t* slot, uint16_t tag, std::string_view key,
                              uint64_t keyhash, std::string_view value, uint64_t* version) {
  const uint64_t item_bytes = ItemBytes(key.size(), value.size(), Checksummed(value.size()));
  const uint16_t block_code = BlockCodeFor(item_bytes);
  const uint64_t old_block = slot != nullptr ? SlotOffset(*slot) : 0;
  if (slot != nullptr && FitsInPlace(ItemAt(old_block), old_block, item_bytes, block_code)) {
    // The same block size: rewrite in place, so an overwrite at a full pool still succeeds. A
    // reader outside this core sees the chain's version change around it; a one-sided reader's
    // copy fails its checksum or names the new version (remote_item.h).
    *version = NextVersion();
    BeginBucketWrite(head);
    FillItem(MutableItemAt(old_block), key, keyhash, value, *version, block_code);
    EndBucketWrite(head);
    Changed(head);
    return Result::kOk;
  }
  // A new key, or a size change: the item moves to a new block. A new key's slot is checked for
  // first and the block taken before the slot is claimed, so a refusal changes nothing.
  if (slot == nullptr && !CanClaimSlot(head)) {
    stats_.no_memory.Add();
    stats_.no_memory_index.Add();
    return Result::kNoMemory;
  }
  const uint64_t block = slab_->Allocate(item_bytes);
  if (block == kNoBlock) {
    stats_.no_memory.Add();
    stats_.no_memory_pool.Add();
    return Result::kNoMemory;
  }
  uint64_t* target = slot != nullptr ? slot : ClaimSlot(head);
  if (target == nullptr) {  // CanClaimSlot said yes: only damaged memory gets here
    slab_->Free(block);
    stats_.no_memory.Add();
    stats_.no_memory_index.Add();
    return Result::kNoMemory;
  }
  *version = NextVersion();
  // No slot names the block yet: readers cannot reach these bytes until the swing below.
  FillItem(MutableItemAt(block), key, keyhash, value, *version, block_code);
  BeginBucketWrite(head);
  SetSlot(target, MakeSlot(tag, block));
  EndBucketWrite(head);
  Changed(head);
  SlotChanged(target);
  PublishStoreGauges(slab_->BlockBytes(block));
  if (slot != nullptr) {
    stats_.moves.Add();
    FreeBlock(old_block);
  }
  return Result::kOk;
}

uint16_t Partition::BlockCodeFor(uint64_t item_bytes) {
  return item_bytes <= kSlabMaxSmallBytes ? static_cast<uint16_t>(SlabClassOf(item_bytes) + 1) : 0;
}

bool Partition::FitsInPlace(const ItemHeader* old, uint64_t old_block, uint64_t item_bytes,
                            uint16_t block_code) const {
  const uint16_t old_code = ItemBlockCode(old->flags);
  if (block_code != 0) {
    // A small block: the code in the old item's flags and the class of the old item's own
    // lengths must both be the new item's (a field damaged alone cannot pass).
    return old_code == block_code && BlockCodeFor(StoredItemBytes(old)) == block_code;
  }
  // A large block: its pages from the allocator (the descriptor read costs little next to a
  // copy of more than 8 KiB).
  return old_code == 0 && slab_->BlockBytes(old_block) == slab_->BlockBytesFor(item_bytes);
}

bool Partition::CanClaimSlot(Bucket* head) const {
  const Bucket* bucket = head;
  for (uint64_t hops = 0; bucket != nullptr && hops < max_chain_; ++hops) {
    for (const uint64_t slot : bucket->slots) {
      if (slot == 0) return true;
    }
    bucket = NextInChain(bucket);
  }
  if (bucket != nullptr) return false;  // a cyclic chain (damaged memory)
  const uint32_t free_head = header_->extra_free_head;
  return (free_head != 0 && free_head <= layout_.extra_bucket_count) ||
         header_->extra_carved < layout_.extra_bucket_count;
}

void Partition::ReleaseSlot(Bucket* head, uint64_t* slot) {
  // The bucket holding `slot` (FindSlot found it in this chain) and the one before it.
  const auto holds = [slot](const Bucket* bucket) {
    const auto distance = reinterpret_cast<uintptr_t>(slot) - reinterpret_cast<uintptr_t>(bucket);
    return distance < sizeof(Bucket);
  };
  Bucket* prev = nullptr;
  Bucket* bucket = head;
  for (uint64_t hops = 0; bucket != nullptr && !holds(bucket); ++hops) {
    if (hops >= max_chain_) {
      bucket = nullptr;  // a cyclic chain: empty the slot, unlink nothing
      break;
    }
    prev = bucket;
    bucket = NextInChain(bucket);
  }
  BeginBucketWrite(head);
  SetSlot(slot, 0);
  SlotChanged(slot);
  if (bucket != nullptr && prev != nullptr) {  // an extra bucket: return it once it is empty
    bool empty = true;
    for (const uint64_t s : bucket->slots) empty = empty && s == 0;
    if (empty) {
      prev->next_extra = bucket->next_extra;
      bucket->next_extra = header_->extra_free_head;
      header_->extra_free_head = static_cast<uint32_t>(bucket - extra_buckets_) + 1;
      --header_->extra_in_use;
      Changed(prev);
      Changed(bucket);
      Changed(header_);
      stats_.store.extra_buckets_in_use.Set(header_->extra_in_use);
    }
  }
  EndBucketWrite(head);
  Changed(head);
}

void Partition::FreeBlock(uint64_t offset) {
  const uint64_t bytes = slab_->BlockBytes(offset);
  // A slot names only live blocks; one that does not is damaged memory, counted, never fatal.
  if (!slab_->TryFree(offset)) {
    stats_.corrupt.Add();
    return;
  }
  PublishStoreGauges(bytes);
}

void Partition::PublishStoreGauges(uint64_t block_bytes) {
  StoreGauges& g = stats_.store;
  if (block_bytes != 0 && block_bytes <= kSlabMaxSmallBytes) {
    const int size_class = SlabClassOf(block_bytes);
    const SlabAllocator::ClassUsage usage = slab_->ClassUsageOf(size_class);
    g.class_used_blocks[size_class].Set(usage.used_blocks);
    g.class_spans[size_class].Set(usage.spans);
  }
  const SlabAllocator::PageUsage pages = slab_->PageUsageNow();
  g.free_pages.Set(pages.free_pages);
  g.large_blocks.Set(pages.large_blocks);
  g.large_pages.Set(pages.large_pages);
}

void Partition::set_change_recorder(DirtyRanges* changes) {
  changes_ = changes;
  if (store_mode()) {
    // The allocator reports offsets in its pool: bias them to the region's.
    slab_->set_dirty_ranges(changes, static_cast<uint64_t>(region_.ring() - region_.base()));
  }
}

absl::Status Partition::ResumeFromRegion() {
  if (header_->magic != kPartitionMagic || header_->mode != static_cast<uint32_t>(layout_.mode) ||
      header_->extra_capacity != layout_.extra_bucket_count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the region's partition header (magic ", header_->magic, ", mode ", header_->mode, ", ",
        header_->extra_capacity, " extra buckets) is not this partition's (",
        std::string(StoreModeName(layout_.mode)), " mode, ", layout_.extra_bucket_count,
        " extra buckets)"));
  }
  if (!store_mode()) return absl::OkStatus();
  // A fresh handle on the pool as the primary left it (the allocator's state is all in it).
  absl::StatusOr<SlabAllocator> attached =
      SlabAllocator::Attach(absl::MakeSpan(region_.ring(), layout_.pool_bytes));
  if (!attached.ok()) return attached.status();
  slab_.emplace(*std::move(attached));
  set_change_recorder(changes_);
  std::string why;
  if (!CheckStoreInvariants(&why)) {
    return absl::DataLossError(absl::StrCat("the replicated store is inconsistent: ", why));
  }
  for (int c = 0; c < kSlabClassCount; ++c) PublishStoreGauges(SlabClassBytes(c));
  stats_.store.extra_buckets_in_use.Set(header_->extra_in_use);
  return absl::OkStatus();
}

bool Partition::CheckStoreInvariants(std::string* why) const {
  if (!store_mode()) {
    *why = "not a store-mode partition";
    return false;
  }
  if (!slab_->CheckInvariants(why)) {
    *why = absl::StrCat("allocator: ", *why);
    return false;
  }
  absl::flat_hash_set<uint64_t> blocks;
  absl::flat_hash_set<const Bucket*> linked;
  const uint64_t max_hops = layout_.extra_bucket_count + 1;
  for (uint64_t b = 0; b < layout_.bucket_count; ++b) {
    const Bucket* head = &buckets_[b];
    if (head->version % 2 != 0) {
      *why = absl::StrCat("bucket ", b, " is left mid-write (odd version)");
      return false;
    }
    uint64_t hops = 0;
    for (const Bucket* bucket = head; bucket != nullptr; bucket = NextInChain(bucket)) {
      if (bucket != head && !linked.insert(bucket).second) {
        *why = absl::StrCat("extra bucket ", bucket - extra_buckets_, " is linked twice");
        return false;
      }
      if (++hops > max_hops) {
        *why = absl::StrCat("bucket ", b, "'s chain does not end");
        return false;
      }
      for (const uint64_t slot : bucket->slots) {
        if (slot == 0) continue;
        const uint64_t offset = SlotOffset(slot);
        const uint64_t block_bytes = slab_->BlockBytes(offset);
        if (block_bytes == 0) {
          *why = absl::StrCat("bucket ", b, " names offset ", offset, ": no live block");
          return false;
        }
        if (!blocks.insert(offset).second) {
          *why = absl::StrCat("block ", offset, " is named by two slots");
          return false;
        }
        const ItemHeader* item = ItemAt(offset);
        if (slab_->BlockBytesFor(StoredItemBytes(item)) != block_bytes || !Intact(item) ||
            ItemBlockCode(item->flags) != BlockCodeFor(StoredItemBytes(item))) {
          *why = absl::StrCat("the item at ", offset,
                              " is not of its block's size (BlockBytesFor, its block code) or is "
                              "damaged");
          return false;
        }
        if (bucket != head &&
            static_cast<uint64_t>(bucket - extra_buckets_) >= header_->extra_carved) {
          *why = absl::StrCat("bucket ", b, " links extra bucket ", bucket - extra_buckets_,
                              " that was never carved");
          return false;
        }
        const uint64_t index_hash = IndexHash(std::string_view(ItemKey(item), item->key_bytes));
        if ((index_hash & bucket_mask_) != b || TagOf(index_hash) != SlotTag(slot)) {
          *why =
              absl::StrCat("the item at ", offset, " is in the wrong bucket or has the wrong tag");
          return false;
        }
      }
    }
  }
  const SlabStats stats = slab_->Stats();
  uint64_t live_blocks = stats.large_blocks;
  for (const SlabClassStats& c : stats.classes) live_blocks += c.used_blocks;
  if (live_blocks != blocks.size()) {
    *why = absl::StrCat(live_blocks, " live blocks but ", blocks.size(),
                        " slots: a block was leaked or freed while named");
    return false;
  }
  if (linked.size() != header_->extra_in_use) {
    *why = absl::StrCat(linked.size(), " extra buckets in chains, the pool says ",
                        header_->extra_in_use);
    return false;
  }
  uint64_t free_listed = 0;
  for (uint32_t next = header_->extra_free_head; next != 0;
       next = extra_buckets_[next - 1].next_extra) {
    if (next > header_->extra_carved || linked.contains(&extra_buckets_[next - 1]) ||
        ++free_listed > header_->extra_carved) {
      *why = "the extra pool's free list is out of range, cyclic, or holds a linked bucket";
      return false;
    }
  }
  if (free_listed + header_->extra_in_use != header_->extra_carved) {
    *why = absl::StrCat("extra buckets: ", free_listed, " free + ", header_->extra_in_use,
                        " in use != ", header_->extra_carved, " carved");
    return false;
  }
  return true;
}

}  // namespace mica
