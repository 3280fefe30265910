// PUT: insert a key or overwrite it. Cache mode: the new item always goes to the log's tail;
// store mode: into its block, or a new one when its size changed.
#include "mica/keyhash.h"
#include "mica/partition.h"

namespace mica {

Response Partition::Put(std::string_view key, uint64_t keyhash, std::string_view value) {
  return PutAt(SpotOf(key), key, keyhash, value);
}

Response Partition::PutAt(const Spot& spot, std::string_view key, uint64_t keyhash,
                          std::string_view value) {
  if (const Result check = CheckWrite(key, value); check != Result::kOk) {
    return Response{check, 0, 0};
  }
  Bucket* bucket = spot.bucket;
  const uint16_t tag = spot.tag;
  uint64_t* slot = FindSlot(bucket, tag, key, keyhash);
  const bool overwrite = slot != nullptr;
  uint64_t version = 0;
  if (const Result result = WriteItem(bucket, slot, tag, key, keyhash, value, &version);
      result != Result::kOk) {
    return Response{result, 0, 0};  // store mode's kNoMemory: the old value stays
  }
  (overwrite ? stats_.overwrites : stats_.inserts).Add();
  return Response{Result::kOk, 0, version};
}

}  // namespace mica
