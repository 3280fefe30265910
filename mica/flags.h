// Command-line mode and sizing of a MICA partition (gflags), shared by every binary that hosts
// one: --store_mode --mica_log_bytes --mica_pool_bytes --mica_buckets --mica_extra_buckets
// --mica_items --max_value_bytes --mica_hugepages
#ifndef HERD_MICA_FLAGS_H_
#define HERD_MICA_FLAGS_H_

#include "absl/status/statusor.h"
#include "mica/config.h"

namespace mica {

// The partition config the flags describe (sizes are validated when the partition is created);
// an unknown --store_mode is an error.
absl::StatusOr<PartitionConfig> PartitionConfigFromFlags();

}  // namespace mica

#endif  // HERD_MICA_FLAGS_H_
