// CAS: replace a key's value only if its version is still the expected one.
#include "mica/keyhash.h"
#include "mica/partition.h"

namespace mica {

Response Partition::Cas(std::string_view key, uint64_t keyhash, uint64_t expected_version,
                        std::string_view value) {
  return CasAt(SpotOf(key), key, keyhash, expected_version, value);
}

Response Partition::CasAt(const Spot& spot, std::string_view key, uint64_t keyhash,
                          uint64_t expected_version, std::string_view value) {
  if (const Result check = CheckWrite(key, value); check != Result::kOk) {
    return Response{check, 0, 0};
  }
  Bucket* bucket = spot.bucket;
  const uint16_t tag = spot.tag;
  uint64_t* slot = FindSlot(bucket, tag, key, keyhash);
  if (slot == nullptr) {
    stats_.cas_misses.Add();
    return Response{Result::kNotFound, 0, 0};
  }
  const uint64_t current = ItemAt(SlotOffset(*slot))->version;
  if (current != expected_version) {
    stats_.cas_failed.Add();
    return Response{Result::kCasFailed, 0, current};
  }
  uint64_t version = 0;
  if (const Result result = WriteItem(bucket, slot, tag, key, keyhash, value, &version);
      result != Result::kOk) {
    return Response{result, 0, 0};
  }
  stats_.cas_ok.Add();
  return Response{Result::kOk, 0, version};
}

}  // namespace mica
