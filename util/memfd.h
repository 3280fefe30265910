// memfd-backed memory, optionally on 2 MiB hugepages: what transport::SharedMemory and
// mica::MirroredRegion allocate from. Hugepages come from the kernel's pool
// (/proc/sys/vm/nr_hugepages); hugetlbfs reserves every page of a mapping when it is mapped, so
// a short pool is an error at allocation, never a SIGBUS later.
#ifndef HERD_UTIL_MEMFD_H_
#define HERD_UTIL_MEMFD_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace util {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;  // x86-64's default hugepage size

// The 2 MiB hugepage pool, as the kernel reports it (zeros where it reports nothing).
struct HugepagePool {
  uint64_t total = 0;
  uint64_t free = 0;
};
HugepagePool ReadHugepagePool();

// A new memfd of `bytes` (a multiple of page_bytes), on hugetlbfs when page_bytes is
// kHugePageBytes, sealed at that size (F_SEAL_SHRINK | F_SEAL_GROW: no one can truncate it
// under another's mapping; the shm fabric's peers map only such files). Returns its descriptor
// (close-on-exec); the caller maps and closes it.
absl::StatusOr<int> CreateMemfd(const char* name, size_t bytes, size_t page_bytes);

// Why `bytes` of hugepages for `name` could not be had (`why`: the failed call), with the pool's
// state and how to fill it: the error of a required allocation, the log line of a fallback.
std::string HugepageShortage(std::string_view name, size_t bytes, const absl::Status& why);

// Logs, at INFO, that `name` falls back to small pages, and why (HugepageShortage): the one
// fallback message of every memfd allocator here.
void LogSmallPageFallback(std::string_view name, size_t bytes, const absl::Status& why);

}  // namespace util

#endif  // HERD_UTIL_MEMFD_H_
