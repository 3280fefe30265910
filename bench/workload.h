// Request streams for herd_client: which key, which operation, deterministic per seed.
// Workloads are YCSB's core mixes (A: 50% read / 50% update, B: 95/5, C: read only) or a custom
// GET/PUT/DELETE/CAS mix; keys are uniform or Zipf (YCSB's scrambled generator).
#ifndef HERD_BENCH_WORKLOAD_H_
#define HERD_BENCH_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "bench/zipf.h"

namespace bench {

enum class Operation : uint8_t { kGet, kPut, kDelete, kCas };

struct WorkloadConfig {
  std::string mix = "C";                      // A, B, C or custom
  double get = 1, put = 0, del = 0, cas = 0;  // custom: fractions, summing to 1
  std::string distribution = "uniform";       // uniform or zipf
  double zipf_theta = kYcsbZipfTheta;
  uint64_t keys = 1 << 20;
  uint32_t key_bytes = 16;
  uint32_t value_bytes = 32;
  uint64_t seed = 1;
  std::string ToJson() const;
};

// Validates and normalizes (a named mix sets the fractions).
absl::StatusOr<WorkloadConfig> Resolve(WorkloadConfig config);

class Workload {
 public:
  // `stream` separates threads: equal seeds and streams give equal sequences.
  Workload(const WorkloadConfig& config, uint64_t stream);
  uint64_t NextKey();
  Operation NextOp();

 private:
  WorkloadConfig config_;
  std::mt19937_64 rng_;
  std::unique_ptr<ZipfGenerator> zipf_;
  std::uniform_int_distribution<uint64_t> uniform_;
  std::uniform_real_distribution<double> unit_{0.0, 1.0};
};

}  // namespace bench

#endif  // HERD_BENCH_WORKLOAD_H_
