#include "mica/flags.h"

#include "absl/strings/str_cat.h"
#include "gflags/gflags.h"

DEFINE_string(store_mode, "cache",
              "cache: MICA's lossy cache (a PUT may evict other keys; a GET may miss a key nobody "
              "deleted). store: keys stay until deleted, items in a slab pool "
              "(--mica_pool_bytes), NO_MEMORY when the pool or the index is full.");
DEFINE_uint64(mica_log_bytes, uint64_t{64} << 20,
              "Cache mode: circular log bytes per partition (rounded up to a power of two).");
DEFINE_uint64(mica_pool_bytes, uint64_t{64} << 20,
              "Store mode: slab pool bytes per partition, which hold the items (about 0.8% goes to "
              "the allocator's page descriptors).");
DEFINE_uint64(mica_extra_buckets, 0,
              "Store mode: extra buckets per partition that full buckets chain to; 0 derives half "
              "the bucket count. When they run out, a new key in a full chain is NO_MEMORY.");
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

absl::StatusOr<PartitionConfig> PartitionConfigFromFlags() {
  PartitionConfig config;
  absl::StatusOr<StoreMode> mode = ParseStoreMode(FLAGS_store_mode);
  if (!mode.ok())
    return absl::InvalidArgumentError(absl::StrCat("--store_mode: ", mode.status().message()));
  config.mode = *mode;
  config.pool_bytes = FLAGS_mica_pool_bytes;
  config.extra_bucket_count = FLAGS_mica_extra_buckets;
  config.log_bytes = FLAGS_mica_log_bytes;
  config.bucket_count = FLAGS_mica_buckets;
  config.expected_items = FLAGS_mica_items;
  config.max_value_bytes = FLAGS_max_value_bytes;
  config.try_hugepages = FLAGS_mica_hugepages;
  return config;
}

}  // namespace mica
