#include "mica/flags.h"

#include "gflags/gflags.h"

DEFINE_uint64(mica_log_bytes, uint64_t{64} << 20,
              "Circular log bytes per partition (rounded up to a power of two).");
DEFINE_uint64(mica_buckets, 0,
              "Index buckets per partition (7 slots each, a power of two); 0 derives it from "
              "--mica_items at half load.");
DEFINE_uint64(mica_items, uint64_t{1} << 20,
              "Items each partition should index without evictions (sizes the index).");
DEFINE_uint32(max_value_bytes, mica::kDefaultMaxValueBytes,
              "Largest value a PUT or CAS accepts. A write whose item (value, key, 24-byte "
              "header) is longer than the whole log is answered NO_MEMORY.");
DEFINE_bool(mica_hugepages, true,
            "Back partitions with 2 MiB pages when the hugepage pool has them.");

namespace mica {

PartitionConfig PartitionConfigFromFlags() {
  PartitionConfig config;
  config.log_bytes = FLAGS_mica_log_bytes;
  config.bucket_count = FLAGS_mica_buckets;
  config.expected_items = FLAGS_mica_items;
  config.max_value_bytes = FLAGS_max_value_bytes;
  config.try_hugepages = FLAGS_mica_hugepages;
  return config;
}

}  // namespace mica
