// Sizing and limits of one MICA partition.
#ifndef HERD_MICA_CONFIG_H_
#define HERD_MICA_CONFIG_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mica/limits.h"

namespace mica {

// Index load the derived bucket count aims at: half-full buckets keep lossy evictions rare.
inline constexpr double kTargetSlotLoad = 0.5;

// What a partition promises about the keys it was given (README: "Store modes").
enum class StoreMode : uint8_t {
  // MICA's cache mode: a lossy index over a circular log. A PUT may evict another key (a full
  // bucket drops its oldest item; the log overwrites its oldest bytes); nothing is ever refused
  // for lack of room except an item longer than the whole log.
  kCache = 0,
  // A store: a key stays until it is deleted. A full bucket chains to extra buckets from a
  // preallocated pool; items live in blocks of a slab allocator (mica/slab.h) and DELETE frees
  // them. A write that finds no block or no index slot is refused with kNoMemory, never evicts.
  kStore = 1,
};

// Store mode: extra buckets provisioned per main bucket when extra_bucket_count is 0. At the
// derived half load (3.5 keys per 7-slot bucket) 3% of buckets overflow; at full load (7 per
// bucket on average, Poisson) a bucket needs 0.40 extra buckets on average: one extra per two
// main buckets lets a store hold twice expected_items before the index (not the pool) says
// kNoMemory.
inline constexpr uint64_t kExtraBucketsPerBucketDivisor = 2;

struct PartitionConfig {
  StoreMode mode = StoreMode::kCache;
  // Cache mode: circular log capacity in bytes; rounded up to a power of two (offset -> position is
  // a mask).
  uint64_t log_bytes = uint64_t{64} << 20;
  // Index buckets, a power of two; 0 derives it from expected_items at kTargetSlotLoad.
  uint64_t bucket_count = 0;
  // Items the partition should index without evictions; sizes the index when bucket_count is 0.
  uint64_t expected_items = uint64_t{1} << 20;
  // Largest value a PUT or CAS accepts. A write whose item is longer than the whole log is
  // refused with kNoMemory, so a log smaller than the largest item is allowed (values up to
  // what it holds work).
  uint32_t max_value_bytes = kDefaultMaxValueBytes;
  // Items whose value is at least this long end with a checksum word (item.h), so a one-sided
  // reader can verify a copy (remote_item.h). The default: no item has one.
  uint32_t checksum_from_value_bytes = kNoItemChecksums;
  // Back the partition with 2 MiB pages when the hugepage pool has them.
  bool try_hugepages = true;
  // Store mode: bytes of the slab pool that holds the items (its header and page descriptors,
  // about 0.8% at 4 KiB pages, included); rounded up to the region's page size.
  uint64_t pool_bytes = uint64_t{64} << 20;
  // Store mode: extra buckets a full bucket chains to; 0 derives bucket_count /
  // kExtraBucketsPerBucketDivisor (at least 1).
  uint64_t extra_bucket_count = 0;
  // Bytes the partition's owner keeps in the region's head, after the index (herd: the outcomes
  // of its clients' last mutations, replicated with the partition so a retry after a failover
  // is answered, not applied twice). Zero-filled at Create; changes recorded as any other.
  uint64_t owner_area_bytes = 0;
};

std::string_view StoreModeName(StoreMode mode);
// "cache" or "store"; anything else is an error naming both.
absl::StatusOr<StoreMode> ParseStoreMode(std::string_view name);

// Checks a config for contradictions (e.g. a bucket count that is not a power of two).
absl::Status ValidateConfig(const PartitionConfig& config);

}  // namespace mica

#endif  // HERD_MICA_CONFIG_H_
