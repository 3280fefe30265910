#include "bench/workload_flags.h"

#include "gflags/gflags.h"

DEFINE_string(workload, "C", "YCSB core mix A (50/50), B (95/5), C (read only), or custom");
DEFINE_double(get_fraction, 1, "custom: fraction of GETs");
DEFINE_double(put_fraction, 0, "custom: fraction of PUTs");
DEFINE_double(delete_fraction, 0, "custom: fraction of DELETEs");
DEFINE_double(cas_fraction, 0, "custom: fraction of CASes");
DEFINE_string(distribution, "uniform", "Key popularity: uniform or zipf");
DEFINE_double(zipf_theta, bench::kYcsbZipfTheta, "Zipf skew (YCSB: 0.99)");
DEFINE_uint64(keys, 100000, "Distinct keys");
DEFINE_uint32(key_bytes, 16, "Key size");
DEFINE_uint32(value_bytes, 32, "Value size");
DEFINE_uint64(seed, 1, "Workload seed (threads derive their streams from it)");

namespace bench {

absl::StatusOr<WorkloadConfig> WorkloadConfigFromFlags() {
  WorkloadConfig c;
  c.mix = FLAGS_workload;
  c.get = FLAGS_get_fraction;
  c.put = FLAGS_put_fraction;
  c.del = FLAGS_delete_fraction;
  c.cas = FLAGS_cas_fraction;
  c.distribution = FLAGS_distribution;
  c.zipf_theta = FLAGS_zipf_theta;
  c.keys = FLAGS_keys;
  c.key_bytes = FLAGS_key_bytes;
  c.value_bytes = FLAGS_value_bytes;
  c.seed = FLAGS_seed;
  return Resolve(c);
}

}  // namespace bench
