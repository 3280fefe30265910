// The client's retransmission timeout for one worker: TCP's estimator (RFC 6298) over the round
// trips measured to it, never below twice the tail of the recent ones, clamped to [floor,
// ceiling], doubled per retransmission of a request. Pure arithmetic, no clock: the caller times
// answers and asks for a timeout.
//
// Why the tail: srtt + 4 rttvar follows the mean of a loaded server's round trips, whose
// distribution has a long queueing tail; requests in that tail (a worker's batch behind a
// client's, a thread descheduled) were retransmitted though nothing was lost (measured: 8
// workers, 1,024 clients, no loss, ~26,000 retransmissions a second with a 5 ms floor and a p99
// of 2.75 ms). A timeout at twice the largest recent round trip fires only when a round trip
// takes twice as long as any seen lately.
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
  // The recent tail: the largest round trip, decayed by this factor per sample (it is forgotten
  // over a few thousand samples: milliseconds at a loaded client's rate), and the timeout is at
  // least kTailFactor times it.
  static constexpr double kTailDecayPerSample = 1.0 - 1.0 / 1024;
  static constexpr double kTailFactor = 2;

  explicit RetransmitTimer(const RetransmitPolicy& policy) : policy_(policy) {}

  // One measured round trip (an answer timed from its request's first send). The first sample
  // sets srtt to it and rttvar to half of it (RFC 6298 2.2).
  void Sample(std::chrono::nanoseconds rtt);
  // The timeout of a request's `sends`-th send (1 = the first): the base (initial before any
  // sample, else the larger of srtt + 4 rttvar and kTailFactor x the recent tail, clamped to
  // [floor, ceiling]) times 2^(sends - 1), at most the
  // ceiling (or the base, when the floor is above the ceiling). Not adaptive: always initial.
  std::chrono::nanoseconds TimeoutFor(uint32_t sends) const;

  bool has_sample() const { return srtt_ns_ != 0; }
  double srtt_ns() const { return srtt_ns_; }
  double rttvar_ns() const { return rttvar_ns_; }
  double tail_ns() const { return tail_ns_; }

 private:
  RetransmitPolicy policy_;
  double srtt_ns_ = 0, rttvar_ns_ = 0;  // no sample yet while srtt_ns_ == 0
  double tail_ns_ = 0;                  // the decaying maximum of the samples
};

}  // namespace herd

#endif  // HERD_HERD_RETRANSMIT_TIMER_H_
