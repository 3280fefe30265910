// What every benchmark result records about where it ran, and the process's CPU time.
#ifndef HERD_BENCH_MACHINE_H_
#define HERD_BENCH_MACHINE_H_

#include <string>

namespace bench {

// /proc/cpuinfo's first "model name", with quotes and backslashes blanked (safe inside JSON).
std::string CpuModel();
int OnlineCores();
// User + system CPU seconds this process has used so far.
double ProcessCpuSeconds();

}  // namespace bench

#endif  // HERD_BENCH_MACHINE_H_
