#include "bench/workload.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace bench {

std::string WorkloadConfig::ToJson() const {
  return absl::StrFormat(
      "{\"mix\":\"%s\",\"get\":%g,\"put\":%g,\"delete\":%g,\"cas\":%g,\"distribution\":\"%s\","
      "\"zipf_theta\":%g,\"keys\":%d,\"key_bytes\":%d,\"value_bytes\":%d,\"seed\":%d}",
      mix, get, put, del, cas, distribution, zipf_theta, keys, key_bytes, value_bytes, seed);
}

absl::StatusOr<WorkloadConfig> Resolve(WorkloadConfig c) {
  if (c.mix == "A") {
    c.get = 0.5, c.put = 0.5, c.del = 0, c.cas = 0;
  } else if (c.mix == "B") {
    c.get = 0.95, c.put = 0.05, c.del = 0, c.cas = 0;
  } else if (c.mix == "C") {
    c.get = 1, c.put = 0, c.del = 0, c.cas = 0;
  } else if (c.mix != "custom") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--workload=%s: use A, B, C or custom", c.mix));
  }
  const double sum = c.get + c.put + c.del + c.cas;
  if (c.get < 0 || c.put < 0 || c.del < 0 || c.cas < 0 || std::abs(sum - 1) > 1e-9) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the GET/PUT/DELETE/CAS fractions must be >= 0 and sum to 1 (they sum to %g)", sum));
  }
  if (c.distribution != "uniform" && c.distribution != "zipf") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--distribution=%s: use uniform or zipf", c.distribution));
  }
  if (c.distribution == "zipf" && (c.zipf_theta <= 0 || c.zipf_theta >= 1)) {
    return absl::InvalidArgumentError("--zipf_theta must be in (0, 1)");
  }
  if (c.keys < 2) return absl::InvalidArgumentError("--keys must be at least 2");
  if (c.key_bytes < 8) {
    return absl::InvalidArgumentError("--key_bytes must be at least 8 (keys encode their index)");
  }
  return c;
}

Workload::Workload(const WorkloadConfig& config, uint64_t stream)
    : config_(config),
      rng_(config.seed * 0x9e3779b97f4a7c15ull + stream),
      uniform_(0, config.keys - 1) {
  if (config.distribution == "zipf") {
    zipf_ = std::make_unique<ZipfGenerator>(config.keys, config.zipf_theta, /*scrambled=*/true);
  }
}

uint64_t Workload::NextKey() { return zipf_ ? zipf_->Next(rng_) : uniform_(rng_); }

Operation Workload::NextOp() {
  const double u = unit_(rng_);
  if (u < config_.get) return Operation::kGet;
  if (u < config_.get + config_.put) return Operation::kPut;
  if (u < config_.get + config_.put + config_.del) return Operation::kDelete;
  return Operation::kCas;
}

}  // namespace bench
