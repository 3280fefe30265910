// GET on a backup's replica: reads the region while a primary's WRITEs land in it, changes
// nothing, and hands out only a value it verified whole.
#include <atomic>
#include <cstring>

#include "mica/keyhash.h"
#include "mica/partition.h"
#include "mica/remote_item.h"

namespace mica {
namespace {

template <typename T>
T LoadRacy(const T& word, std::memory_order order = std::memory_order_relaxed) {
  return std::atomic_ref<T>(const_cast<T&>(word)).load(order);
}

// Copies bytes another writer may be changing; the copy is judged by its checksum, never trusted
// as read. The fence keeps the copy's loads before whatever re-check follows.
void CopyRacy(void* to, const void* from, uint64_t bytes) {
  std::memcpy(to, from, bytes);
  std::atomic_thread_fence(std::memory_order_acquire);
}

}  // namespace

Response Partition::ReadReplica(std::string_view key, uint64_t keyhash, char* value_out,
                                uint32_t value_out_bytes, absl::Span<uint64_t> scratch) const {
  if (key.empty() || key.size() > kMaxKeyBytes) return Response{Result::kKeyTooLong, 0, 0};
  const Response torn{Result::kCorrupt, 0, 0};
  const Spot spot = SpotOf(key);
  const Bucket* head = spot.bucket;
  const uint32_t before = LoadRacy(head->version, std::memory_order_acquire);
  if (before % 2 != 0) return torn;  // (a primary's WRITE never carries an odd version)
  const uint16_t tag = spot.tag;
  const uint64_t scratch_bytes = scratch.size() * sizeof(uint64_t);
  const Bucket* bucket = head;
  for (uint64_t hops = 0; bucket != nullptr && hops < max_chain_; ++hops) {
    for (const uint64_t& slot_word : bucket->slots) {
      const uint64_t slot = LoadRacy(slot_word);
      if (slot == 0 || SlotTag(slot) != tag) continue;
      const uint64_t offset = SlotOffset(slot);
      // Cache mode: alive within one log length behind the tail. Distance 0 (an item at the
      // tail) is alive to no one: a slot landed ahead of the header's new tail names an item
      // this reader's tail does not cover yet, and that place may still hold the item of one
      // lap before. Store mode: an offset an item's header can have.
      const uint64_t distance = (LoadRacy(header_->log_tail) - offset) & kSlotOffsetMask;
      if (store_mode() ? offset < pool_first_item_ || offset > pool_last_item_
                       : distance == 0 || distance > log_mask_ + 1) {
        continue;
      }
      ItemHeader header;
      CopyRacy(&header, ItemAt(offset), sizeof(header));
      if (header.keyhash != keyhash || header.key_bytes != key.size()) continue;
      const uint64_t item_bytes =
          ItemBytes(header.key_bytes, header.value_bytes, (header.flags & kItemHasChecksum) != 0);
      const uint64_t position = offset & item_mask_;
      // Lengths no write stored (a torn header): the read is retried, never followed.
      if (item_bytes > layout_.max_item_bytes ||
          (store_mode() &&
           (position > layout_.pool_bytes || item_bytes > layout_.pool_bytes - position))) {
        return torn;
      }
      if (header.value_bytes > value_out_bytes || item_bytes > scratch_bytes) {
        // The caller fetches it itself (a one-sided READ) and verifies its own copy.
        return Response{Result::kBufferTooSmall, header.value_bytes, header.version, position,
                        static_cast<uint32_t>(item_bytes)};
      }
      auto* copy = reinterpret_cast<ItemHeader*>(scratch.data());
      CopyRacy(copy, ItemAt(offset), item_bytes);
      // Whole only if checksummed (a replicated partition checksums every item) and it verifies.
      const uint64_t body = ItemBodyBytes(copy->key_bytes, copy->value_bytes);
      if ((copy->flags & kItemHasChecksum) == 0 || body + kItemChecksumBytes != item_bytes) {
        return torn;
      }
      uint64_t stored;
      std::memcpy(&stored, reinterpret_cast<const uint8_t*>(copy) + body, sizeof(stored));
      if (stored != ItemChecksum(copy)) return torn;
      if (copy->keyhash != keyhash || copy->key_bytes != key.size() ||
          std::memcmp(ItemKey(copy), key.data(), key.size()) != 0) {
        continue;  // whole, but another key's (a tag collision, or a block reused meanwhile)
      }
      // The header first read may have been torn: the verified copy's lengths rule.
      if (copy->value_bytes > value_out_bytes) return torn;
      if (copy->value_bytes != 0) std::memcpy(value_out, ItemValue(copy), copy->value_bytes);
      return Response{Result::kOk, copy->value_bytes, copy->version, position,
                      static_cast<uint32_t>(item_bytes)};
    }
    const uint32_t next = LoadRacy(bucket->next_extra);
    bucket = next == 0 || next > layout_.extra_bucket_count ? nullptr : &extra_buckets_[next - 1];
  }
  std::atomic_thread_fence(std::memory_order_acquire);  // the chain's loads before the re-check
  if (LoadRacy(head->version) != before) return torn;
  return Response{Result::kNotFound, 0, 0};
}

}  // namespace mica
