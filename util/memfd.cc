#include "util/memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "util/errno_status.h"

namespace util {

HugepagePool ReadHugepagePool() {
  // The sysfs directory of the 2 MiB size (the pool /proc/sys/vm/nr_hugepages fills).
  constexpr const char* kPoolDir = "/sys/kernel/mm/hugepages/hugepages-2048kB/";
  auto read = [&](const char* file) {
    uint64_t value = 0;
    std::ifstream(std::string(kPoolDir) + file) >> value;
    return value;
  };
  return HugepagePool{read("nr_hugepages"), read("free_hugepages")};
}

absl::StatusOr<int> CreateMemfd(const char* name, size_t bytes, size_t page_bytes) {
  const unsigned flags =
      MFD_CLOEXEC | MFD_ALLOW_SEALING | (page_bytes == kHugePageBytes ? MFD_HUGETLB : 0u);
  const int fd = memfd_create(name, flags);
  if (fd < 0) return ErrnoStatus(absl::StatusCode::kInternal, "memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const absl::Status status = ErrnoStatus(absl::StatusCode::kInternal, "ftruncate memfd");
    close(fd);
    return status;
  }
  // Sealed at its size: no one can truncate it under a process that maps it (the shm fabric maps
  // a registered region's file into every peer that reaches it); a file that could shrink would
  // SIGBUS that process on its next touch past the new end, and such peers refuse it.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    const absl::Status status = ErrnoStatus(absl::StatusCode::kInternal, "seal memfd");
    close(fd);
    return status;
  }
  return fd;
}

std::string HugepageShortage(std::string_view name, size_t bytes, const absl::Status& why) {
  const HugepagePool pool = ReadHugepagePool();
  return absl::StrFormat(
      "%s: %d bytes of 2 MiB hugepages: %s (pool: %d free of %d; fill it with "
      "echo N > /proc/sys/vm/nr_hugepages)",
      name, bytes, why.message(), pool.free, pool.total);
}

void LogSmallPageFallback(std::string_view name, size_t bytes, const absl::Status& why) {
  // Every 1,000th: a server that tries hugepages for each session's buffers said it at every
  // join (a million lines, and a read of /proc/meminfo each, in a million-session soak).
  LOG_EVERY_N(INFO, 1000) << HugepageShortage(name, bytes, why) << "; using small pages ("
                          << google::COUNTER << " such fallbacks so far)";
}

}  // namespace util
