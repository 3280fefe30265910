#include "hopscotch/neighbourhood.h"

#include <atomic>
#include <cstring>

#include "hopscotch/hash.h"

namespace hopscotch {
namespace {

// A stored key field is the key's bytes then zeros; anything else (a NUL then a non-NUL, or all
// zero) was never written by Insert.
bool WellFormedKey(const uint8_t* field) {
  if (field[0] == 0) return false;
  uint32_t i = 1;
  while (i < kKeyBytes && field[i] != 0) ++i;
  for (; i < kKeyBytes; ++i) {
    if (field[i] != 0) return false;
  }
  return true;
}

// Checks bucket `i` of the snapshot for `key`: true on a hit (filled into *result).
bool Probe(const uint8_t* base, uint32_t i, const PaddedKey& key, bool* busy,
           LookupResult* result) {
  const uint8_t* bucket = base + i * kBucketBytes;
  const uint8_t info = InfoOf(bucket);
  if (IsBusy(info)) {
    *busy = true;
    return false;
  }
  if (!IsOccupied(info)) return false;
  if (std::memcmp(bucket + kKeyOffset, key.data(), kKeyBytes) != 0) {
    if (!WellFormedKey(bucket + kKeyOffset)) ++result->malformed;
    return false;
  }
  result->kind = LookupResult::Kind::kFound;
  result->offset = static_cast<int>(i);
  std::memcpy(result->value.data(), bucket + kValueOffset, kValueBytes);
  return true;
}

}  // namespace

LookupResult FindInNeighbourhood(Snapshot snapshot, const PaddedKey& key) {
  LookupResult result;
  const uint8_t* base = snapshot.data();
  bool busy = false;
  // The fast path: the home bucket (hop bit 0 or not: a key homed here is checked here first),
  // then every bucket its hop info names.
  const uint32_t hop = HopOf(base) | 1u;
  for (uint32_t bits = hop; bits != 0; bits &= bits - 1) {
    const uint32_t i = static_cast<uint32_t>(std::countr_zero(bits));
    if (Probe(base, i, key, &busy, &result)) return result;
    const uint8_t info = InfoOf(base + i * kBucketBytes);
    if (i != 0 && !IsBusy(info) && !IsOccupied(info)) ++result.dangling;
  }
  // The scan: a key the hop info of this snapshot does not (yet, or any more) point at.
  for (uint32_t i = 0; i < kNeighbourhood; ++i) {
    if ((hop >> i) & 1u) continue;
    if (Probe(base, i, key, &busy, &result)) {
      result.via_hop = false;
      return result;
    }
  }
  result.kind = busy ? LookupResult::Kind::kTorn : LookupResult::Kind::kMiss;
  return result;
}

LookupResult FindInNeighbourhood(Snapshot snapshot, std::string_view key) {
  if (!ValidateKey(key).ok()) return LookupResult{};
  return FindInNeighbourhood(snapshot, PadKey(key));
}

void CopyLines(const uint8_t* first, uint64_t buckets, uint8_t* out) {
  constexpr int kWords = kBucketBytes / sizeof(uint64_t);
  for (uint64_t line = 0; line < buckets; ++line) {
    auto* words = reinterpret_cast<uint64_t*>(const_cast<uint8_t*>(first + line * kBucketBytes));
    uint64_t copy[kWords];
    for (;;) {
      copy[0] = std::atomic_ref<uint64_t>(words[0]).load(std::memory_order_acquire);
      for (int w = 1; w < kWords; ++w) {
        copy[w] = std::atomic_ref<uint64_t>(words[w]).load(std::memory_order_relaxed);
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      if (std::atomic_ref<uint64_t>(words[0]).load(std::memory_order_relaxed) == copy[0]) break;
    }
    std::memcpy(out + line * kBucketBytes, copy, kBucketBytes);
  }
}

}  // namespace hopscotch
