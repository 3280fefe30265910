// What every benchmark result records about where it ran, and the process's CPU time.
#ifndef HERD_BENCH_MACHINE_H_
#define HERD_BENCH_MACHINE_H_

#include <time.h>

#include <cstdint>
#include <string>

namespace bench {

// /proc/cpuinfo's first "model name", with quotes and backslashes blanked (safe inside JSON).
std::string CpuModel();
int OnlineCores();
// User + system CPU seconds this process has used so far.
double ProcessCpuSeconds();
// The CPU time of the thread whose clock this is (pthread_getcpuclockid), in nanoseconds; with
// CLOCK_THREAD_CPUTIME_ID, the calling thread's. Time the thread spent descheduled (another
// process on its core) is not in it.
int64_t ThreadCpuNs(clockid_t clock = CLOCK_THREAD_CPUTIME_ID);

}  // namespace bench

#endif  // HERD_BENCH_MACHINE_H_
