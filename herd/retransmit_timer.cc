#include "herd/retransmit_timer.h"

#include <algorithm>
#include <cmath>

namespace herd {

void RetransmitTimer::Sample(std::chrono::nanoseconds rtt) {
  const auto sample = static_cast<double>(rtt.count());
  tail_ns_ = std::max(sample, tail_ns_ * kTailDecayPerSample);
  if (srtt_ns_ == 0) {
    srtt_ns_ = sample;
    rttvar_ns_ = sample / 2;
    return;
  }
  rttvar_ns_ += kRttVarGain * (std::abs(srtt_ns_ - sample) - rttvar_ns_);
  srtt_ns_ += kRttGain * (sample - srtt_ns_);
}

std::chrono::nanoseconds RetransmitTimer::TimeoutFor(uint32_t sends) const {
  if (!policy_.adaptive) return policy_.initial;
  const std::chrono::nanoseconds floor = policy_.floor;
  const std::chrono::nanoseconds ceiling = policy_.ceiling;
  std::chrono::nanoseconds base =
      srtt_ns_ == 0
          ? policy_.initial
          : std::chrono::nanoseconds(static_cast<int64_t>(
                std::max(srtt_ns_ + kRttVarWeight * rttvar_ns_, kTailFactor * tail_ns_)));
  base = std::clamp(base, floor, std::max(floor, ceiling));
  const uint32_t shift = std::min(sends > 0 ? sends - 1 : 0, kMaxBackoffShift);
  return std::min(base * (int64_t{1} << shift), std::max(base, ceiling));
}

}  // namespace herd
