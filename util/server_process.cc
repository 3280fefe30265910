#include "util/server_process.h"

#include <pthread.h>
#include <sys/resource.h>

#include "absl/time/clock.h"
#include "glog/logging.h"

namespace util {

sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

void RaiseFileLimit() {
  if (rlimit files; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &files) != 0) PLOG(WARNING) << "raising RLIMIT_NOFILE";
  }
}

void ServeUntilStopped(const sigset_t& stop_signals, absl::Duration duration,
                       absl::FunctionRef<void()> step) {
  const absl::Time stop_at =
      duration > absl::ZeroDuration() ? absl::Now() + duration : absl::InfiniteFuture();
  const timespec no_wait{0, 0};
  while (absl::Now() < stop_at) {
    step();
    if (sigtimedwait(&stop_signals, nullptr, &no_wait) > 0) return;
  }
}

}  // namespace util
