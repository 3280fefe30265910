#include "transport/shared_memory.h"

#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
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
    // The raw system call, not fstat(3): this probes descriptors other threads may be opening
    // or closing right now (a probe of one that is not the memfd decides nothing, and the memfd
    // stays open while its memory is mapped), and ThreadSanitizer would take each probe for a
    // use of that thread's descriptor racing with its close.
    struct stat st;
    if (syscall(SYS_fstat, static_cast<int>(fd), &st) == 0 && st.st_dev == device &&
        st.st_ino == inode) {
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

namespace {

// One line of /proc/self/maps: [lo, hi) maps `offset` onwards of the file (device, inode); inode
// 0 for anonymous memory.
struct MapsLine {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
  bool shared = false;
  uint64_t offset = 0;
  dev_t device = 0;
  ino_t inode = 0;
};

bool ParseMapsLine(const char* text, MapsLine* line) {
  char perms[8];
  unsigned major, minor;
  unsigned long inode;
  if (std::sscanf(text, "%" SCNxPTR "-%" SCNxPTR " %7s %" SCNx64 " %x:%x %lu", &line->lo, &line->hi,
                  perms, &line->offset, &major, &minor, &inode) != 7) {
    return false;
  }
  line->shared = perms[3] == 's';
  line->device = makedev(major, minor);
  line->inode = static_cast<ino_t>(inode);
  return true;
}

// The extents found so far, with the file of the last one (to merge a line that continues it).
struct Extents {
  std::vector<Backing> backings;
  dev_t last_device = 0;
  ino_t last_inode = 0;
};

absl::Status NotShared(const void* addr, size_t length, uintptr_t at, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "memory at %p (+%d bytes) is not all shared memory: %s at %#x; the shm fabric can only "
      "register shared file mappings (allocate with transport::SharedMemory::Allocate)",
      addr, length, why, at));
}

// Adds [from, to) of the mapping `line` to `extents`: merged into the last extent when it
// continues the same file at the next offset, else a new extent.
absl::Status AddExtent(const MapsLine& line, uintptr_t from, uintptr_t to, const void* addr,
                       size_t length, Extents* extents) {
  if (!line.shared || line.inode == 0) {
    return NotShared(addr, length, from, "a private or anonymous mapping");
  }
  const uint64_t file_offset = line.offset + (from - line.lo);
  std::vector<Backing>& backings = extents->backings;
  if (!backings.empty() && extents->last_device == line.device &&
      extents->last_inode == line.inode &&
      backings.back().file_offset + backings.back().length == file_offset) {
    backings.back().length += to - from;
    return absl::OkStatus();
  }
  if (backings.size() == kMaxMrExtents) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "memory at %p (+%d bytes) spans more than %d file mappings (the next at %#x); register "
        "it in parts",
        addr, length, kMaxMrExtents, from));
  }
  const int fd = FindFdOf(line.device, line.inode);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the file mapped at %#x has no open descriptor in this process; keep it open while "
        "registered",
        from));
  }
  backings.push_back(Backing{fd, file_offset, to - from, line.device, line.inode});
  extents->last_device = line.device;
  extents->last_inode = line.inode;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Backing>> FindBackings(const void* addr, size_t length) {
  const auto begin = reinterpret_cast<uintptr_t>(addr);
  if (length == 0 || length > UINTPTR_MAX - begin) {
    return absl::InvalidArgumentError(
        absl::StrFormat("memory at %p (+%d bytes) is not a valid range", addr, length));
  }
  const uintptr_t end = begin + length;
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return Errno("open /proc/self/maps");
  // Lines come in address order: walk those that cover the range, from `covered` on.
  Extents extents;
  uintptr_t covered = begin;
  absl::Status status = absl::OkStatus();
  char* text = nullptr;  // getline: a line of any length (a mapped file's path may be long)
  size_t capacity = 0;
  while (covered < end && getline(&text, &capacity, maps) != -1) {
    MapsLine line;
    if (!ParseMapsLine(text, &line) || line.hi <= covered) continue;
    if (line.lo > covered) break;  // a hole: reported below
    const uintptr_t to = std::min<uintptr_t>(line.hi, end);
    status = AddExtent(line, covered, to, addr, length, &extents);
    if (!status.ok()) break;
    covered = to;
  }
  std::free(text);
  std::fclose(maps);
  if (!status.ok()) return status;
  if (covered < end) return NotShared(addr, length, covered, "nothing is mapped");
  return std::move(extents.backings);
}

}  // namespace transport
