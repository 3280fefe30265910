#include "transport/shared_memory.h"

#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "util/errno_status.h"
#include "util/memfd.h"
#include "util/round_up.h"

namespace transport {
namespace {

absl::Status Errno(const char* what) {
  return util::ErrnoStatus(absl::StatusCode::kInternal, what);
}

// A descriptor of this process that refers to the file with this device and inode, or -1.
int FindFdOf(dev_t device, ino_t inode) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) == 0 && st.st_dev == device && st.st_ino == inode) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

}  // namespace

absl::StatusOr<PagePolicy> ParsePagePolicy(std::string_view name) {
  for (PagePolicy policy :
       {PagePolicy::kSmall, PagePolicy::kHugeIfAvailable, PagePolicy::kHugeRequired}) {
    if (name == Name(policy)) return policy;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--hugepages=%s: use off, auto or required", name));
}

std::string_view Name(PagePolicy policy) {
  switch (policy) {
    case PagePolicy::kSmall:
      return "off";
    case PagePolicy::kHugeIfAvailable:
      return "auto";
    case PagePolicy::kHugeRequired:
      return "required";
  }
  return "off";
}

namespace {

// Maps `size` bytes (a multiple of `page`) of a new memfd; hugetlb when page is 2 MiB, in which
// case the kernel reserves every page now (ENOMEM when the pool is short).
absl::Status MapMemfd(const char* name, size_t size, size_t page, int* fd_out, void** data_out) {
  absl::StatusOr<int> fd = util::CreateMemfd(name, size, page);
  if (!fd.ok()) return fd.status();
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (data == MAP_FAILED) {
    const absl::Status status = Errno("memfd mapping");
    close(*fd);
    return status;
  }
  *fd_out = *fd;
  *data_out = data;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SharedMemory> SharedMemory::Allocate(size_t bytes, const char* name,
                                                    PagePolicy pages) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot allocate 0 bytes of shared memory");
  SharedMemory memory;
  void* data = nullptr;
  const bool huge = pages == PagePolicy::kHugeRequired ||
                    (pages == PagePolicy::kHugeIfAvailable && bytes >= kHugePageBytes);
  if (huge) {
    const size_t size = util::RoundUp(bytes, kHugePageBytes);
    const absl::Status mapped = MapMemfd(name, size, kHugePageBytes, &memory.fd_, &data);
    if (mapped.ok()) {
      memory.data_ = static_cast<uint8_t*>(data);
      memory.size_ = size;
      memory.page_bytes_ = kHugePageBytes;
      return memory;
    }
    if (pages == PagePolicy::kHugeRequired) {
      return absl::ResourceExhaustedError(util::HugepageShortage(name, size, mapped));
    }
    util::LogSmallPageFallback(name, size, mapped);
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = util::RoundUp(bytes, page);
  if (absl::Status s = MapMemfd(name, size, page, &memory.fd_, &data); !s.ok()) return s;
  memory.data_ = static_cast<uint8_t*>(data);
  memory.size_ = size;
  memory.page_bytes_ = page;
  return memory;
}

SharedMemory::SharedMemory(SharedMemory&& other) noexcept { *this = std::move(other); }

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    Release();  // not ~SharedMemory(): ending a live object's lifetime and using it again is UB
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    page_bytes_ = std::exchange(other.page_bytes_, 0);
  }
  return *this;
}

SharedMemory::~SharedMemory() { Release(); }

void SharedMemory::Release() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
  page_bytes_ = 0;
}

absl::StatusOr<Backing> FindBacking(const void* addr, size_t length) {
  const auto begin = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t end = begin + length;
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return Errno("open /proc/self/maps");
  char line[4096];
  absl::StatusOr<Backing> result = absl::InvalidArgumentError(absl::StrFormat(
      "memory at %p (+%d bytes) is not shared memory; the shm fabric can only register "
      "memfd or /dev/shm mappings (allocate with transport::SharedMemory::Allocate)",
      addr, length));
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    uintptr_t lo, hi;
    char perms[8];
    uint64_t offset;
    unsigned major, minor;
    unsigned long inode;
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s %" SCNx64 " %x:%x %lu", &lo, &hi, perms,
                    &offset, &major, &minor, &inode) != 7) {
      continue;
    }
    if (begin < lo || begin >= hi) continue;
    if (end > hi) {
      result = absl::InvalidArgumentError(absl::StrFormat(
          "range %p (+%d bytes) spans more than one mapping; register each part", addr, length));
      break;
    }
    if (perms[3] != 's' || inode == 0) break;  // private or anonymous: not shareable
    const int fd = FindFdOf(makedev(major, minor), inode);
    if (fd < 0) {
      result = absl::FailedPreconditionError(absl::StrFormat(
          "the file mapped at %p has no open descriptor in this process; keep it open while "
          "registered",
          addr));
      break;
    }
    result = Backing{fd, offset + (begin - lo)};
    break;
  }
  std::fclose(maps);
  return result;
}

}  // namespace transport
