// DELETE: drop a key from the index. Cache mode: its log bytes stay until the log overwrites
// them, but no slot points at them any more. Store mode: its block is freed.
#include "mica/keyhash.h"
#include "mica/partition.h"

namespace mica {

Response Partition::Delete(std::string_view key, uint64_t keyhash) {
  return DeleteAt(SpotOf(key), key, keyhash);
}

Response Partition::DeleteAt(const Spot& spot, std::string_view key, uint64_t keyhash) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    stats_.rejected.Add();
    return Response{Result::kKeyTooLong, 0, 0};
  }
  Bucket* bucket = spot.bucket;
  uint64_t* slot = FindSlot(bucket, spot.tag, key, keyhash);
  if (slot == nullptr) {
    stats_.delete_misses.Add();
    return Response{Result::kNotFound, 0, 0};
  }
  if (store_mode()) {
    const uint64_t block = SlotOffset(*slot);
    ReleaseSlot(bucket, slot);
    FreeBlock(block);  // after the slot no longer names it
  } else {
    BeginBucketWrite(bucket);
    SetSlot(slot, 0);
    EndBucketWrite(bucket);
    Changed(bucket);
  }
  stats_.deletes.Add();
  return Response{Result::kOk, 0, NextVersion()};
}

}  // namespace mica
