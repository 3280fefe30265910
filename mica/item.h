// Layout of one item in the circular log: header, key, value, padded to 8 bytes, and for items a
// one-sided reader may fetch, a checksum word after them.
#ifndef HERD_MICA_ITEM_H_
#define HERD_MICA_ITEM_H_

#include <cstdint>
#include <cstring>
#include <string_view>

namespace mica {

struct ItemHeader {
  uint64_t keyhash;
  uint64_t version;
  uint32_t value_bytes;
  uint16_t key_bytes;
  uint16_t flags;  // kItemHasChecksum; store mode: the block's size code (kItemBlockCodeShift)
};
static_assert(sizeof(ItemHeader) == 24, "ItemHeader is part of the log format");

inline constexpr uint64_t kItemAlignment = 8;
// The item ends with a checksum word (ItemChecksum of everything before it): set on items whose
// value is at least PartitionConfig::checksum_from_value_bytes long, which a remote reader may
// fetch with a one-sided READ while the log overwrites them (remote_item.h).
inline constexpr uint16_t kItemHasChecksum = 1;
inline constexpr uint64_t kItemChecksumBytes = 8;
// Store mode: flags bits 8..12 hold the item's block's size class + 1 when it is a small-class
// block (mica/slab.h), 0 for a large block (and in cache mode). With the class its own lengths
// give, it tells the owner whether a new value fits the block in place without reading the
// allocator's descriptors (a cache miss per PUT at scale); both must agree, so damage to one
// field alone never widens a write past its block.
inline constexpr int kItemBlockCodeShift = 8;
inline constexpr uint16_t kItemBlockCodeMask = 0x1F << kItemBlockCodeShift;
inline constexpr uint16_t ItemBlockCode(uint16_t flags) {
  return static_cast<uint16_t>((flags & kItemBlockCodeMask) >> kItemBlockCodeShift);
}

// Log bytes of an item's header, key and value (padded): what its checksum covers.
inline constexpr uint64_t ItemBodyBytes(uint64_t key_bytes, uint64_t value_bytes) {
  return (sizeof(ItemHeader) + key_bytes + value_bytes + kItemAlignment - 1) &
         ~(kItemAlignment - 1);
}
// Log bytes one item takes.
inline constexpr uint64_t ItemBytes(uint64_t key_bytes, uint64_t value_bytes,
                                    bool checksum = false) {
  return ItemBodyBytes(key_bytes, value_bytes) + (checksum ? kItemChecksumBytes : 0);
}

inline const char* ItemKey(const ItemHeader* item) {
  return reinterpret_cast<const char*>(item) + sizeof(ItemHeader);
}
inline const char* ItemValue(const ItemHeader* item) { return ItemKey(item) + item->key_bytes; }

// Whether the item's key is exactly `key`, whose length the caller already matched against
// key_bytes. Keys of 8..16 bytes (HERD's 16-byte keys) compare as two overlapping words, no
// library call on the hot path; other lengths use memcmp.
inline bool ItemKeyIs(const ItemHeader* item, std::string_view key) {
  const char* stored = ItemKey(item);
  const size_t n = key.size();
  if (n >= 8 && n <= 16) {
    uint64_t stored_head, stored_tail, key_head, key_tail;
    std::memcpy(&stored_head, stored, sizeof(uint64_t));
    std::memcpy(&key_head, key.data(), sizeof(uint64_t));
    std::memcpy(&stored_tail, stored + n - sizeof(uint64_t), sizeof(uint64_t));
    std::memcpy(&key_tail, key.data() + n - sizeof(uint64_t), sizeof(uint64_t));
    return ((stored_head ^ key_head) | (stored_tail ^ key_tail)) == 0;
  }
  return std::memcmp(stored, key.data(), n) == 0;
}

}  // namespace mica

#endif  // HERD_MICA_ITEM_H_
