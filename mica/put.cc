// PUT: insert a key or overwrite it; the new item always goes to the log's tail.
#include "mica/keyhash.h"
#include "mica/partition.h"

namespace mica {

Response Partition::Put(std::string_view key, uint64_t keyhash, std::string_view value) {
  if (const Result check = CheckWrite(key, value); check != Result::kOk) {
    return Response{check, 0, 0};
  }
  Bucket* bucket = BucketFor(keyhash);
  const uint16_t tag = TagOf(keyhash);
  uint64_t* slot = FindSlot(bucket, tag, key, keyhash);
  if (slot != nullptr) {
    stats_.overwrites.Add();
  } else {
    slot = ClaimSlot(bucket);
    stats_.inserts.Add();
  }
  const uint64_t version = WriteItem(bucket, slot, tag, key, keyhash, value);
  return Response{Result::kOk, 0, version};
}

}  // namespace mica
