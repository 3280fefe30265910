#include "herd/retransmit_timer.h"

#include <algorithm>
#include <cmath>

namespace herd {

void RetransmitTimer::Sample(std::chrono::nanoseconds rtt, std::chrono::nanoseconds now,
                             bool resent) {
  const auto sample = static_cast<double>(rtt.count());
  if (now - window_start_ >= kTailWindow) {
    // The window that ended becomes the previous one only if it ended just now: a gap of a whole
    // window with no answers leaves nothing recent to remember.
    previous_max_ns_ = now - window_start_ < 2 * kTailWindow ? window_max_ns_ : 0;
    window_max_ns_ = 0;
    window_start_ = now;
  }
  if (!resent) window_max_ns_ = std::max(window_max_ns_, sample);
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
      srtt_ns_ == 0 ? policy_.initial
                    : std::chrono::nanoseconds(static_cast<int64_t>(std::max(
                          srtt_ns_ + kRttVarWeight * rttvar_ns_, kTailFactor * tail_ns())));
  base = std::clamp(base, floor, std::max(floor, ceiling));
  const uint32_t shift = std::min(sends > 0 ? sends - 1 : 0, kMaxBackoffShift);
  return std::min(base * (int64_t{1} << shift), std::max(base, ceiling));
}

}  // namespace herd
