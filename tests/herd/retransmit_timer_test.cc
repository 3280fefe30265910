// herd::RetransmitTimer: RFC 6298's estimator, the clamp and the backoff, case by case.
#include "herd/retransmit_timer.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace herd {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

struct Case {
  std::string name;
  RetransmitPolicy policy;
  std::vector<nanoseconds> samples;
  uint32_t sends;
  nanoseconds want;
};

const RetransmitPolicy kDefault{};  // 20 ms initial, [5 ms, 1 s], adaptive

RetransmitPolicy With(nanoseconds initial, nanoseconds floor, nanoseconds ceiling,
                      bool adaptive = true) {
  return RetransmitPolicy{
      .initial = initial, .adaptive = adaptive, .floor = floor, .ceiling = ceiling};
}

TEST(RetransmitTimerTest, TimeoutsFollowTheEstimatorClampAndBackoff) {
  const std::vector<Case> cases = {
      {"no sample: the initial timeout", kDefault, {}, 1, milliseconds(20)},
      {"no sample, second send: doubled", kDefault, {}, 2, milliseconds(40)},
      {"no sample, third send: doubled twice", kDefault, {}, 3, milliseconds(80)},
      {"sends 0 counts as the first", kDefault, {}, 0, milliseconds(20)},
      {"an initial below the floor is raised to it",
       With(milliseconds(1), milliseconds(5), seconds(1)),
       {},
       1,
       milliseconds(5)},
      {"first sample: srtt = rtt, rttvar = rtt/2, timeout srtt + 4 rttvar",
       kDefault,
       {milliseconds(10)},
       1,
       milliseconds(30)},
      {"second equal sample: rttvar decays by 1/4",
       kDefault,
       {milliseconds(10), milliseconds(10)},
       1,
       microseconds(25'000)},
      {"a larger sample moves srtt by 1/8 and rttvar by 1/4 of the gap",
       kDefault,
       {milliseconds(10), milliseconds(14)},
       1,
       // rttvar = 5 + (4 - 5)/4 = 4.75; srtt = 10 + 4/8 = 10.5; 10.5 + 19 = 29.5 ms (the
       // tail's 2 x 14 = 28 ms is below it)
       microseconds(29'500)},
      {"twice the largest recent round trip when the estimator is below it",
       kDefault,
       {milliseconds(10), milliseconds(18)},
       1,
       // srtt + 4 rttvar = 11 + 23 = 34 ms; the tail: 2 x 18 = 36 ms
       milliseconds(36)},
      {"a tiny round trip is clamped up to the floor",
       kDefault,
       {microseconds(100)},
       1,
       milliseconds(5)},
      {"a huge round trip is clamped down to the ceiling", kDefault, {seconds(3)}, 1, seconds(1)},
      {"backoff stops at the ceiling", kDefault, {milliseconds(10)}, 10, seconds(1)},
      {"a thousand sends do not overflow the shift",
       kDefault,
       {milliseconds(10)},
       1000,
       seconds(1)},
      {"a floor above the ceiling wins, with no backoff past it",
       With(milliseconds(20), seconds(2), seconds(1)),
       {milliseconds(10)},
       5,
       seconds(2)},
      {"not adaptive: always the initial timeout, samples ignored",
       With(milliseconds(7), milliseconds(5), seconds(1), /*adaptive=*/false),
       {milliseconds(100), milliseconds(300)},
       4,
       milliseconds(7)},
  };
  for (const Case& c : cases) {
    RetransmitTimer timer(c.policy);
    // One answer a millisecond: all in one tail window.
    for (size_t i = 0; i < c.samples.size(); ++i) timer.Sample(c.samples[i], milliseconds(i));
    EXPECT_EQ(timer.TimeoutFor(c.sends).count(), c.want.count()) << c.name;
  }
}

TEST(RetransmitTimerTest, TheEstimatorConvergesOnASteadyRoundTrip) {
  RetransmitTimer timer(kDefault);
  EXPECT_FALSE(timer.has_sample());
  for (int i = 0; i < 200; ++i) timer.Sample(milliseconds(8), milliseconds(i));
  EXPECT_TRUE(timer.has_sample());
  EXPECT_NEAR(timer.srtt_ns(), 8e6, 1);
  EXPECT_LT(timer.rttvar_ns(), 1e3);  // the deviation decays to nothing
  // Then the tail decides: twice the round trip, never a timeout the round trip itself reaches.
  EXPECT_NEAR(timer.tail_ns(), 8e6, 1);
  EXPECT_NEAR(static_cast<double>(timer.TimeoutFor(1).count()), 16e6, 4e3);
}

// A loaded server's round trips: mostly fast, now and then one in the queueing tail (or a
// scheduling stall). The mean's estimator forgets the slow one within a hundred samples and would
// retransmit the next such request though nothing was lost; the tail keeps the timeout above it
// for a window or two, however many answers arrive meanwhile.
TEST(RetransmitTimerTest, ASlowRoundTripAmongFastOnesKeepsTheTimeoutAboveIt) {
  RetransmitTimer timer(kDefault);
  nanoseconds now{0};
  auto sample = [&](nanoseconds rtt, nanoseconds gap) {
    now += gap;
    timer.Sample(rtt, now);
  };
  for (int i = 0; i < 20000; ++i) sample(milliseconds(1), microseconds(10));
  sample(milliseconds(20), microseconds(10));
  for (int i = 0; i < 20000; ++i) sample(milliseconds(1), microseconds(10));
  EXPECT_LT(timer.srtt_ns() + RetransmitTimer::kRttVarWeight * timer.rttvar_ns(), 5e6)
      << "the mean's estimator alone would be at the floor";
  EXPECT_GT(timer.TimeoutFor(1), milliseconds(20));
  // Two windows later the slow one is forgotten: back to the floor.
  for (int i = 0; i < 1100; ++i) sample(milliseconds(1), milliseconds(1));
  EXPECT_EQ(timer.TimeoutFor(1), milliseconds(5));
}

// The tail is a window's maximum, not an average: one slow answer in the previous window still
// counts in this one; after a whole window without answers it no longer does.
TEST(RetransmitTimerTest, TheTailIsTheLargestRoundTripOfTheLastWindowOrTwo) {
  const nanoseconds window = RetransmitTimer::kTailWindow;
  RetransmitTimer timer(kDefault);
  timer.Sample(milliseconds(30), nanoseconds(0));
  timer.Sample(milliseconds(1), window / 2);
  EXPECT_EQ(timer.tail_ns(), 30e6) << "same window";
  timer.Sample(milliseconds(1), window + window / 2);
  EXPECT_EQ(timer.tail_ns(), 30e6) << "the previous window's";
  timer.Sample(milliseconds(2), 2 * window + window / 2);
  EXPECT_EQ(timer.tail_ns(), 2e6) << "two windows on: only the new window's and the last one's";
  timer.Sample(milliseconds(3), 5 * window);
  EXPECT_EQ(timer.tail_ns(), 3e6) << "after a window with no answers, nothing before it";
}

// Steady loss: every tenth request of a 1 ms round trip is lost and answered after its resend,
// one timeout later. Its wait is no round trip of the path: were it the tail, the next timeout
// would be twice it, the next loss's wait longer still, to the ceiling.
TEST(RetransmitTimerTest, AResentRequestsWaitDoesNotRaiseTheTail) {
  RetransmitTimer timer(kDefault);
  nanoseconds now{0};
  for (int i = 0; i < 100000; ++i) {
    now += microseconds(10);
    const bool lost = i % 10 == 9;
    timer.Sample(lost ? timer.TimeoutFor(1) + milliseconds(1) : milliseconds(1), now, lost);
  }
  EXPECT_EQ(timer.tail_ns(), 1e6);
  EXPECT_LT(timer.TimeoutFor(1), 4 * kDefault.floor) << "the loss's waits fed back into it";
}

}  // namespace
}  // namespace herd
