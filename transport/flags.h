// Command-line choice of fabric and device (gflags), shared by every binary that opens one:
//   --fabric=shm|verbs --device --shm_fabric_name --mtu --ib_port --gid_index
//   --inject_ud_loss --inject_uc_loss --inject_delay_us --inject_delay_jitter_us
//   --inject_write_disorder --inject_slow_read_us --shm_partition_file (shm fault injection)
//   --shm_async
//   --hugepages (the pages of the large registered regions)
//   --connect=tcp|cm (how clients join servers)
#ifndef HERD_TRANSPORT_FLAGS_H_
#define HERD_TRANSPORT_FLAGS_H_

#include "absl/status/statusor.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

namespace transport {

absl::StatusOr<DeviceOptions> DeviceOptionsFromFlags();
absl::StatusOr<PagePolicy> PagePolicyFromFlags();
absl::StatusOr<ConnectMode> ConnectModeFromFlags();

}  // namespace transport

#endif  // HERD_TRANSPORT_FLAGS_H_
