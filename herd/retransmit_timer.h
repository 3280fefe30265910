// The client's retransmission timeout for one worker: TCP's estimator (RFC 6298) over the round
// trips measured to it, never below twice the recent tail of them, clamped to [floor, ceiling],
// doubled per retransmission of a request. Pure arithmetic, no clock of its own: the caller times
// answers, says when, and asks for a timeout.
//
//   RetransmitTimer timer(policy);
//   timer.Sample(rtt, now);                   // an answer (now: any monotonic clock's reading)
//   deadline = sent_at + timer.TimeoutFor(sends);
//
// Why the tail: srtt + 4 rttvar follows the mean of a loaded server's round trips, whose
// distribution has a long queueing tail, and a VM's or a busy host's scheduling stalls add rare
// round trips of several milliseconds; requests in that tail were retransmitted though nothing
// was lost (measured on a 16-core VM: 8 workers, 1,024 clients, no loss, 28,784 retransmissions
// in 2 s, p99 2.7 ms). The tail is the largest round trip of the last one to two windows of
// kTailWindow (a windowed maximum: it does not depend on how many answers arrive), and a timeout
// is at least kTailFactor times it: it fires only when a round trip takes twice as long as any in
// the last half second or more, or after a loss.
#ifndef HERD_HERD_RETRANSMIT_TIMER_H_
#define HERD_HERD_RETRANSMIT_TIMER_H_

#include <algorithm>
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
  // The recent tail: the largest round trip of the current and the previous window of this
  // length, and the timeout is at least kTailFactor times it.
  static constexpr std::chrono::nanoseconds kTailWindow{500'000'000};
  static constexpr double kTailFactor = 2;

  explicit RetransmitTimer(const RetransmitPolicy& policy) : policy_(policy) {}

  // One measured round trip (an answer timed from its request's first send), answered at `now`
  // (never earlier than the previous sample's). The first sample sets srtt to it and rttvar to
  // half of it (RFC 6298 2.2). The answer of a request that was `resent` feeds the mean and the
  // deviation but not the tail: its wait holds at least one timeout, and a tail raised by it
  // would double the timeout with every loss, to the ceiling under steady loss.
  void Sample(std::chrono::nanoseconds rtt, std::chrono::nanoseconds now, bool resent = false);
  // The timeout of a request's `sends`-th send (1 = the first): the base (initial before any
  // sample, else the larger of srtt + 4 rttvar and kTailFactor x the recent tail, clamped to
  // [floor, ceiling]) times 2^(sends - 1), at most the
  // ceiling (or the base, when the floor is above the ceiling). Not adaptive: always initial.
  std::chrono::nanoseconds TimeoutFor(uint32_t sends) const;

  bool has_sample() const { return srtt_ns_ != 0; }
  double srtt_ns() const { return srtt_ns_; }
  double rttvar_ns() const { return rttvar_ns_; }
  // The largest round trip of the current and the previous tail window.
  double tail_ns() const { return std::max(window_max_ns_, previous_max_ns_); }

 private:
  RetransmitPolicy policy_;
  double srtt_ns_ = 0, rttvar_ns_ = 0;  // no sample yet while srtt_ns_ == 0
  // The windowed maximum: the current window's start and largest sample, and the previous one's.
  std::chrono::nanoseconds window_start_{0};
  double window_max_ns_ = 0, previous_max_ns_ = 0;
};

}  // namespace herd

#endif  // HERD_HERD_RETRANSMIT_TIMER_H_
