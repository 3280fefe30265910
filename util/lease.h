// A lease: a deadline on the monotonic clock that one control thread extends and data-path
// threads check. Valid() is a vDSO clock read and one load: no system call, no lock.
//
// The holder's contract, which the party that waits a lease out relies on: a lease granted in
// answer to a request sent at T (the holder's clock) is extended to at most T + its length, so
// whoever received the request at R >= T knows it ends by R + length, give or take the two
// clocks' drift over one length (the waiter adds a margin for it).
#ifndef HERD_UTIL_LEASE_H_
#define HERD_UTIL_LEASE_H_

#include <time.h>

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace util {

class Lease {
 public:
  static int64_t NowNs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  }
  bool Valid() const { return NowNs() < until_ns_.load(std::memory_order_acquire); }
  // Extends the lease to `until_ns` (NowNs() terms); never shortens it (grants may arrive out
  // of order).
  void ExtendTo(int64_t until_ns) {
    int64_t now = until_ns_.load(std::memory_order_relaxed);
    while (now < until_ns &&
           !until_ns_.compare_exchange_weak(now, until_ns, std::memory_order_acq_rel)) {
    }
  }
  // Ends it now (fenced): every later Valid() is false until a later ExtendTo.
  void Revoke() { until_ns_.store(0, std::memory_order_release); }
  int64_t until_ns() const { return until_ns_.load(std::memory_order_acquire); }
  absl::Duration left() const {
    const int64_t left = until_ns() - NowNs();
    return left > 0 ? absl::Nanoseconds(left) : absl::ZeroDuration();
  }

 private:
  std::atomic<int64_t> until_ns_{0};
};

}  // namespace util

#endif  // HERD_UTIL_LEASE_H_
