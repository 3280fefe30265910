// GET: copy the latest value of a key into the caller's buffer.
#include <cstring>

#include "mica/keyhash.h"
#include "mica/partition.h"
#include "mica/remote_item.h"

namespace mica {

Response Partition::Get(std::string_view key, uint64_t keyhash, char* value_out,
                        uint32_t value_out_bytes) {
  return GetAt(SpotOf(key), key, keyhash, value_out, value_out_bytes);
}

Response Partition::GetAt(const Spot& spot, std::string_view key, uint64_t keyhash, char* value_out,
                          uint32_t value_out_bytes) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    stats_.rejected.Add();
    return Response{Result::kKeyTooLong, 0, 0};
  }
  const uint64_t* slot = FindSlot(spot.bucket, spot.tag, key, keyhash);
  if (slot == nullptr) {
    stats_.get_misses.Add();
    return Response{Result::kNotFound, 0, 0};
  }
  const ItemHeader* item = ItemAt(SlotOffset(*slot));
  const uint64_t position = SlotOffset(*slot) & item_mask_;
  const auto item_bytes = static_cast<uint32_t>(StoredItemBytes(item));
  if (!InBounds(item)) {
    // Lengths no write stored: a one-sided reader told of them would READ past the region.
    stats_.corrupt.Add();
    return Response{Result::kCorrupt, 0, 0};
  }
  if (item->value_bytes > value_out_bytes) {
    stats_.get_hits.Add();  // found: the caller fetches it itself (or learns its size)
    return Response{Result::kBufferTooSmall, item->value_bytes, item->version, position,
                    item_bytes};
  }
  // A copy is checked first: the value handed out is one the log holds intact. (A caller that
  // fetches the item itself, above, checks its own copy: remote_item.h.)
  if (!IntactInBounds(item)) {
    stats_.corrupt.Add();
    return Response{Result::kCorrupt, 0, 0};
  }
  if (item->value_bytes != 0) std::memcpy(value_out, ItemValue(item), item->value_bytes);
  stats_.get_hits.Add();
  return Response{Result::kOk, item->value_bytes, item->version, position, item_bytes};
}

}  // namespace mica
