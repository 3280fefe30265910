// Table: the writer (Insert with displacement, updates) and the local reader (Lookup), in the
// store order table.h argues from, and CheckInvariants.
#include <atomic>
#include <bit>
#include <cstring>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "hopscotch/hash.h"
#include "hopscotch/line.h"
#include "hopscotch/table.h"

namespace hopscotch {
namespace {

constexpr int kWords = kBucketBytes / sizeof(uint64_t);
constexpr uint64_t kKeyHeadMask = ~((uint64_t{1} << 40) - 1);  // word 0's key bytes 0..2

uint8_t NextVersion(uint8_t info, int step) {
  return static_cast<uint8_t>((info + step) & kVersionMask);
}

bool HoldsKey(const uint8_t* bucket, const PaddedKey& key) {
  return IsOccupied(InfoOf(bucket)) && std::memcmp(bucket + kKeyOffset, key.data(), kKeyBytes) == 0;
}

// The line image of (key, value): bytes 0..4 are ignored by Fill.
void MakeImage(const PaddedKey& key, const Value& value, uint8_t* image) {
  std::memset(image, 0, kBucketBytes);
  std::memcpy(image + kKeyOffset, key.data(), kKeyBytes);
  std::memcpy(image + kValueOffset, value.data(), kValueBytes);
}

uint64_t ImageWord(const uint8_t* image, int w) {
  uint64_t word;
  std::memcpy(&word, image + w * sizeof(uint64_t), sizeof(word));
  return word;
}

}  // namespace

void Table::Store(uint8_t* bucket, int w, uint64_t value, std::memory_order order) {
  if (!persister_.active()) {
    StoreWord(bucket, w, value, order);
    return;
  }
  const uint64_t before = LoadWord(bucket, w);
  StoreWord(bucket, w, value, order);
  persister_.Stored(bucket + w * sizeof(uint64_t), before, value);
}

// Under kPowerFailure: every line stored since the last point is durable on return. Otherwise
// nothing was recorded and this returns at once.
absl::Status Table::Durable() {
  absl::Status s = persister_.Persist();
  if (!s.ok()) return absl::Status(s.code(), absl::StrFormat("%s: %s", path_, s.message()));
  return s;
}

void Table::Fill(uint64_t e, const uint8_t* image) {
  uint8_t* b = Bucket(e);
  uint64_t w0 = LoadWord(b, 0);
  const uint8_t info = WordInfo(w0);
  w0 = (w0 & ~kKeyHeadMask) | (ImageWord(image, 0) & kKeyHeadMask);
  Store(b, 0, WithInfo(w0, NextVersion(info, 1)));      // busy, still empty
  std::atomic_thread_fence(std::memory_order_release);  // busy before any data store
  for (int w = 1; w < kWords; ++w) Store(b, w, ImageWord(image, w));
  StoreWord0(b, WithInfo(w0, static_cast<uint8_t>(kOccupied | NextVersion(info, 2))));
}

absl::Status Table::Move(uint64_t s, uint64_t e, uint64_t home) {
  uint8_t image[kBucketBytes];
  std::memcpy(image, Bucket(s), kBucketBytes);  // the writer's own stores: no race
  Fill(e, image);
  if (absl::Status st = Durable(); !st.ok()) return st;  // the copy before the switch names it
  uint8_t* h = Bucket(home);
  const uint32_t hop = (HopOf(h) | (1u << (e - home))) & ~(1u << (s - home));
  StoreWord0(h, WithHop(LoadWord(h, 0), hop));           // the switch: one store
  if (absl::Status st = Durable(); !st.ok()) return st;  // the switch before the clear
  uint8_t* src = Bucket(s);
  const uint64_t w0 = LoadWord(src, 0);  // after the switch (s may be the home itself)
  StoreWord0(src, WithInfo(w0, NextVersion(WordInfo(w0), 2)));  // empty, version + 2
  ++stats_.moves;
  if (e - home > stats_.max_distance) stats_.max_distance = static_cast<uint32_t>(e - home);
  return absl::OkStatus();
}

absl::Status Table::Insert(std::string_view key, const Value& value) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  if (!writable_) return absl::FailedPreconditionError(path_ + ": opened read-only");
  const uint64_t home = HomeOf(key);
  const uint64_t total = total_buckets();
  const PaddedKey padded = PadKey(key);
  uint8_t image[kBucketBytes];
  MakeImage(padded, value, image);

  for (uint32_t bits = HopOf(Bucket(home)); bits != 0; bits &= bits - 1) {
    const uint64_t p = home + std::countr_zero(bits);
    if (!HoldsKey(Bucket(p), padded)) continue;
    ++stats_.updates;
    const uint64_t end = std::min(home + kNeighbourhood, total);
    for (uint64_t f = p + 1; f < end; ++f) {  // out of place, upwards: atomic for readers
      if (IsOccupied(InfoOf(Bucket(f)))) continue;
      Fill(f, image);
      if (absl::Status s = Durable(); !s.ok()) return s;  // the new copy before the switch
      uint8_t* h = Bucket(home);
      const uint32_t hop = (HopOf(h) | (1u << (f - home))) & ~(1u << (p - home));
      StoreWord0(h, WithHop(LoadWord(h, 0), hop));
      if (absl::Status s = Durable(); !s.ok()) return s;  // the switch before the clear
      uint8_t* b = Bucket(p);
      const uint64_t w0 = LoadWord(b, 0);  // after the switch (p may be the home itself)
      StoreWord0(b, WithInfo(w0, NextVersion(WordInfo(w0), 2)));
      if (f - home > stats_.max_distance) stats_.max_distance = static_cast<uint32_t>(f - home);
      return Durable();  // acknowledged once durable
    }
    // No free bucket above it: rewrite the value in place under the line's seqlock.
    ++stats_.updates_in_place;
    uint8_t* b = Bucket(p);
    const uint64_t w0 = LoadWord(b, 0);
    const uint8_t info = WordInfo(w0);
    // No ordering point inside: if power fails before the end, the media may hold any mix of
    // old and new value words with or without the busy mark, which recovery treats alike (the
    // key kept, the value possibly mixed, as after a kill -9 mid-update: never acknowledged).
    Store(b, 0, WithInfo(w0, static_cast<uint8_t>(kOccupied | NextVersion(info, 1))));
    std::atomic_thread_fence(std::memory_order_release);
    for (int w = kValueOffset / 8; w < kWords; ++w) Store(b, w, ImageWord(image, w));
    StoreWord0(b, WithInfo(w0, static_cast<uint8_t>(kOccupied | NextVersion(info, 2))));
    return Durable();
  }

  const uint64_t probe_end = std::min(home + kMaxProbe, total);
  uint64_t e = home;
  while (e < probe_end && IsOccupied(InfoOf(Bucket(e)))) ++e;
  const double load = static_cast<double>(items_) / static_cast<double>(total);
  if (e == probe_end) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "table full: no free bucket within %u buckets of home %u (%u items, load %.3f)", kMaxProbe,
        home, items_, load));
  }
  while (e - home >= kNeighbourhood) {  // bring the free bucket e down into reach
    bool moved = false;
    for (uint64_t g = e - (kNeighbourhood - 1); g < e && !moved; ++g) {
      const uint32_t hop = HopOf(Bucket(g));
      if (hop == 0) continue;
      const uint64_t s = g + std::countr_zero(hop);  // the lowest: the longest step down
      if (s >= e) continue;
      if (absl::Status st = Move(s, e, g); !st.ok()) return st;
      e = s;
      moved = true;
    }
    if (!moved) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "table full: no item can move to free bucket %u for home %u (%u items, load %.3f)", e,
          home, items_, load));
    }
  }
  Fill(e, image);
  if (absl::Status s = Durable(); !s.ok()) return s;  // the line before the bit naming it
  uint8_t* h = Bucket(home);
  StoreWord0(h, WithHop(LoadWord(h, 0), HopOf(h) | (1u << (e - home))));  // now it exists
  ++items_;
  ++stats_.inserts;
  if (e - home > stats_.max_distance) stats_.max_distance = static_cast<uint32_t>(e - home);
  return Durable();  // acknowledged once durable
}

LookupResult Table::Lookup(std::string_view key, int max_reads) const {
  if (!ValidateKey(key).ok()) return LookupResult{};
  const PaddedKey padded = PadKey(key);
  const uint8_t* first = Bucket(HomeOf(key));
  alignas(64) uint8_t copy[kNeighbourhoodBytes];
  LookupResult result;
  for (int read = 0; read < max_reads; ++read) {
    CopyLines(first, kNeighbourhood, copy);
    result = FindInNeighbourhood(Snapshot(copy, kNeighbourhoodBytes), padded);
    result.rereads = read;
    if (result.kind != LookupResult::Kind::kTorn) break;
  }
  return result;
}

absl::Status Table::CheckInvariants() const {
  const uint64_t total = total_buckets();
  absl::flat_hash_set<std::string> keys;
  for (uint64_t j = 0; j < total; ++j) {
    const uint8_t* b = Bucket(j);
    const uint8_t info = InfoOf(b);
    if (IsBusy(info)) return absl::InternalError(absl::StrFormat("bucket %u is busy", j));
    if (j >= home_buckets_ && HopOf(b) != 0) {
      return absl::InternalError(absl::StrFormat("tail bucket %u has hop bits", j));
    }
    for (uint32_t bits = j < home_buckets_ ? HopOf(b) : 0; bits != 0; bits &= bits - 1) {
      const int i = std::countr_zero(bits);
      const uint8_t* t = Bucket(j + i);
      const char* key = reinterpret_cast<const char*>(t + kKeyOffset);
      if (!IsOccupied(InfoOf(t)) || HomeOf(std::string_view(key, strnlen(key, kKeyBytes))) != j) {
        return absl::InternalError(absl::StrFormat(
            "hop bit %d of bucket %u names bucket %u, which holds no key of that home", i, j,
            j + i));
      }
    }
    if (!IsOccupied(info)) continue;
    const char* key = reinterpret_cast<const char*>(b + kKeyOffset);
    const std::string_view k(key, strnlen(key, kKeyBytes));
    if (!ValidateKey(k).ok() || PadKey(k) != *reinterpret_cast<const PaddedKey*>(b + kKeyOffset)) {
      return absl::InternalError(absl::StrFormat("bucket %u holds a malformed key", j));
    }
    const uint64_t home = HomeOf(k);
    if (home > j || j - home >= kNeighbourhood) {
      return absl::InternalError(
          absl::StrFormat("bucket %u holds key '%s' of home %u: not within H - 1 = %u", j, k, home,
                          kNeighbourhood - 1));
    }
    if (((HopOf(Bucket(home)) >> (j - home)) & 1u) == 0) {
      return absl::InternalError(
          absl::StrFormat("bucket %u holds key '%s' but its home %u has no hop bit", j, k, home));
    }
    if (!keys.insert(std::string(k)).second) {
      return absl::InternalError(absl::StrFormat("key '%s' is stored twice", k));
    }
  }
  if (keys.size() != items_) {
    return absl::InternalError(
        absl::StrFormat("%u keys stored, the table counts %u", keys.size(), items_));
  }
  return absl::OkStatus();
}

}  // namespace hopscotch
