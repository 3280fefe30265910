// What a long-running server binary does first, shared by herd_server and hop_server.
#ifndef HERD_UTIL_SERVER_PROCESS_H_
#define HERD_UTIL_SERVER_PROCESS_H_

#include <signal.h>

namespace util {

// Blocks SIGINT and SIGTERM in the calling thread (and every thread it starts later), so the
// main thread takes them synchronously with sigtimedwait on the returned set, never a worker.
sigset_t BlockStopSignals();

// Every client holds a control connection, and unfinished handshakes wait in a set that can hold
// thousands: the default soft limit of 1,024 descriptors would cap both. Takes the hard limit
// (a failure is logged, not fatal).
void RaiseFileLimit();

}  // namespace util

#endif  // HERD_UTIL_SERVER_PROCESS_H_
