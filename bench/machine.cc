#include "bench/machine.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>

namespace bench {

std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    std::string model = colon == std::string::npos ? line : line.substr(colon + 2);
    for (char& ch : model) {
      if (ch == '"' || ch == '\\') ch = ' ';
    }
    return model;
  }
  return "unknown";
}

int OnlineCores() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

double ProcessCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

int64_t ThreadCpuNs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace bench
