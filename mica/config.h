// Sizing and limits of one MICA partition.
#ifndef HERD_MICA_CONFIG_H_
#define HERD_MICA_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"

namespace mica {

inline constexpr uint32_t kMaxKeyBytes = 256;
inline constexpr uint32_t kDefaultMaxValueBytes = uint32_t{1} << 20;  // 1 MiB

// PartitionConfig::checksum_from_value_bytes that checksums nothing.
inline constexpr uint32_t kNoItemChecksums = UINT32_MAX;

// Index load the derived bucket count aims at: half-full buckets keep lossy evictions rare.
inline constexpr double kTargetSlotLoad = 0.5;

struct PartitionConfig {
  // Circular log capacity in bytes; rounded up to a power of two (offset -> position is a mask).
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
};

// Checks a config for contradictions (e.g. a bucket count that is not a power of two).
absl::Status ValidateConfig(const PartitionConfig& config);

}  // namespace mica

#endif  // HERD_MICA_CONFIG_H_
