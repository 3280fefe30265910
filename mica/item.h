// Layout of one item in the circular log: header, key, value, padded to 8 bytes.
#ifndef HERD_MICA_ITEM_H_
#define HERD_MICA_ITEM_H_

#include <cstdint>

namespace mica {

struct ItemHeader {
  uint64_t keyhash;
  uint64_t version;
  uint32_t value_bytes;
  uint16_t key_bytes;
  uint16_t reserved;  // zero; room for flags (e.g. an out-of-line value)
};
static_assert(sizeof(ItemHeader) == 24, "ItemHeader is part of the log format");

inline constexpr uint64_t kItemAlignment = 8;

// Log bytes one item takes.
inline constexpr uint64_t ItemBytes(uint64_t key_bytes, uint64_t value_bytes) {
  return (sizeof(ItemHeader) + key_bytes + value_bytes + kItemAlignment - 1) &
         ~(kItemAlignment - 1);
}

inline const char* ItemKey(const ItemHeader* item) {
  return reinterpret_cast<const char*>(item) + sizeof(ItemHeader);
}
inline const char* ItemValue(const ItemHeader* item) { return ItemKey(item) + item->key_bytes; }

}  // namespace mica

#endif  // HERD_MICA_ITEM_H_
