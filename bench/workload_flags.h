// The workload flags every benchmark client shares (herd_client, memcached_bench), so the same
// command-line knobs give the same request stream against either server:
//   --workload --get_fraction --put_fraction --delete_fraction --cas_fraction --distribution
//   --zipf_theta --keys --key_bytes --value_bytes --seed
#ifndef HERD_BENCH_WORKLOAD_FLAGS_H_
#define HERD_BENCH_WORKLOAD_FLAGS_H_

#include "absl/status/statusor.h"
#include "bench/workload.h"

namespace bench {

// The flags' workload, resolved (a named mix sets the fractions) and validated.
absl::StatusOr<WorkloadConfig> WorkloadConfigFromFlags();

}  // namespace bench

#endif  // HERD_BENCH_WORKLOAD_FLAGS_H_
