// INSERT: store a key only if the index does not hold it; otherwise kExists with its version.
// (In the lossy cache mode a key the index forgot, evicted or overwritten in the log, counts as
// absent: the insert succeeds. Store mode forgets nothing.)
#include "mica/keyhash.h"
#include "mica/partition.h"

namespace mica {

Response Partition::Insert(std::string_view key, uint64_t keyhash, std::string_view value) {
  return InsertAt(SpotOf(key), key, keyhash, value);
}

Response Partition::InsertAt(const Spot& spot, std::string_view key, uint64_t keyhash,
                             std::string_view value) {
  if (const Result check = CheckWrite(key, value); check != Result::kOk) {
    return Response{check, 0, 0};
  }
  Bucket* bucket = spot.bucket;
  const uint16_t tag = spot.tag;
  if (const uint64_t* existing = FindSlot(bucket, tag, key, keyhash); existing != nullptr) {
    stats_.insert_exists.Add();
    return Response{Result::kExists, 0, ItemAt(SlotOffset(*existing))->version};
  }
  uint64_t version = 0;
  if (const Result result = WriteItem(bucket, nullptr, tag, key, keyhash, value, &version);
      result != Result::kOk) {
    return Response{result, 0, 0};
  }
  stats_.inserts.Add();
  return Response{Result::kOk, 0, version};
}

}  // namespace mica
