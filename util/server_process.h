// What a long-running server binary does, shared by herd_server, hop_server and rmem_server.
#ifndef HERD_UTIL_SERVER_PROCESS_H_
#define HERD_UTIL_SERVER_PROCESS_H_

#include <signal.h>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"

namespace util {

// Blocks SIGINT and SIGTERM in the calling thread (and every thread it starts later), so the
// main thread takes them synchronously with sigtimedwait on the returned set, never a worker.
sigset_t BlockStopSignals();

// Every client holds a control connection, and unfinished handshakes wait in a set that can hold
// thousands: the default soft limit of 1,024 descriptors would cap both. Takes the hard limit
// (a failure is logged, not fatal).
void RaiseFileLimit();

// Calls step() until one of `stop_signals` (BlockStopSignals) is pending or, when `duration` is
// positive, until it has passed. step() should return within a bounded time (a serving step).
void ServeUntilStopped(const sigset_t& stop_signals, absl::Duration duration,
                       absl::FunctionRef<void()> step);

}  // namespace util

#endif  // HERD_UTIL_SERVER_PROCESS_H_
