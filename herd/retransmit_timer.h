// The client's retransmission timeout: TCP's estimator (RFC 6298) over round trips the client
// measured, clamped to [floor, ceiling], doubled per retransmission of a request. Pure
// arithmetic, no clock: the caller times answers and asks for a timeout.
//
//   RetransmitTimer timer(policy);
//   timer.Sample(rtt);                        // an answer to a request sent once
//   deadline = sent_at + timer.TimeoutFor(sends);
#ifndef HERD_HERD_RETRANSMIT_TIMER_H_
#define HERD_HERD_RETRANSMIT_TIMER_H_

#include <chrono>
#include <cstdint>

namespace herd {

struct RetransmitPolicy {
  // The timeout before any sample (and always, when adaptive is false).
  std::chrono::nanoseconds initial{20'000'000};
  bool adaptive = true;
  std::chrono::nanoseconds floor{5'000'000};        // adaptive: never below
  std::chrono::nanoseconds ceiling{1'000'000'000};  // adaptive: never above, backoff included
};

class RetransmitTimer {
 public:
  // TCP's gains: 1/8 for the mean, 1/4 for the deviation; a timeout of srtt + 4 rttvar.
  static constexpr double kRttGain = 0.125;
  static constexpr double kRttVarGain = 0.25;
  static constexpr double kRttVarWeight = 4;
  // Doublings of the timeout for a request sent many times (then it stays at the ceiling).
  static constexpr uint32_t kMaxBackoffShift = 16;

  explicit RetransmitTimer(const RetransmitPolicy& policy) : policy_(policy) {}

  // One measured round trip (an answer timed from its request's first send). The first sample
  // sets srtt to it and rttvar to half of it (RFC 6298 2.2).
  void Sample(std::chrono::nanoseconds rtt);
  // The timeout of a request's `sends`-th send (1 = the first): the base (initial before any
  // sample, else srtt + 4 rttvar, clamped to [floor, ceiling]) times 2^(sends - 1), at most the
  // ceiling (or the base, when the floor is above the ceiling). Not adaptive: always initial.
  std::chrono::nanoseconds TimeoutFor(uint32_t sends) const;

  bool has_sample() const { return srtt_ns_ != 0; }
  double srtt_ns() const { return srtt_ns_; }
  double rttvar_ns() const { return rttvar_ns_; }

 private:
  RetransmitPolicy policy_;
  double srtt_ns_ = 0, rttvar_ns_ = 0;  // no sample yet while srtt_ns_ == 0
};

}  // namespace herd

#endif  // HERD_HERD_RETRANSMIT_TIMER_H_
