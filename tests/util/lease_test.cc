// util::Lease's contract (util/lease.h): valid exactly while the clock is before its deadline;
// grants never shorten it, whatever order they arrive in; a revocation ends it at once.
#include "util/lease.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace util {
namespace {

constexpr int64_t kHourNs = int64_t{3600} * 1'000'000'000;

TEST(LeaseTest, ValidOnlyBeforeItsDeadline) {
  Lease lease;
  EXPECT_FALSE(lease.Valid());  // never granted
  lease.ExtendTo(Lease::NowNs() + kHourNs);
  EXPECT_TRUE(lease.Valid());
  EXPECT_GT(lease.left(), absl::Minutes(59));
  Lease past;
  past.ExtendTo(Lease::NowNs() - 1);
  EXPECT_FALSE(past.Valid());
  EXPECT_EQ(past.left(), absl::ZeroDuration());
}

TEST(LeaseTest, AnOlderGrantNeverShortensIt) {
  Lease lease;
  const int64_t later = Lease::NowNs() + kHourNs;
  lease.ExtendTo(later);
  lease.ExtendTo(later - kHourNs / 2);  // a grant that arrived late
  EXPECT_EQ(lease.until_ns(), later);
  // Concurrent grants: the latest deadline wins.
  std::vector<std::thread> granters;
  for (int t = 0; t < 4; ++t) {
    granters.emplace_back([&lease, later, t] {
      for (int i = 0; i < 10000; ++i) lease.ExtendTo(later + t * 10000 + i);
    });
  }
  for (std::thread& t : granters) t.join();
  EXPECT_EQ(lease.until_ns(), later + 3 * 10000 + 9999);
}

TEST(LeaseTest, RevokeEndsItAtOnce) {
  Lease lease;
  lease.ExtendTo(Lease::NowNs() + kHourNs);
  lease.Revoke();
  EXPECT_FALSE(lease.Valid());
  lease.ExtendTo(Lease::NowNs() + kHourNs);  // a later grant starts a new lease
  EXPECT_TRUE(lease.Valid());
}

}  // namespace
}  // namespace util
