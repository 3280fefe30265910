// Command-line sizing of a MICA partition (gflags), shared by every binary that hosts one.
//   --mica_log_bytes --mica_buckets --mica_items --max_value_bytes --mica_hugepages
#ifndef HERD_MICA_FLAGS_H_
#define HERD_MICA_FLAGS_H_

#include "mica/config.h"

namespace mica {

// The partition config the flags describe (validated when the partition is created).
PartitionConfig PartitionConfigFromFlags();

}  // namespace mica

#endif  // HERD_MICA_FLAGS_H_
