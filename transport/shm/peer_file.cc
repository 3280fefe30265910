#include "transport/shm/peer_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/errno_status.h"

namespace transport::shm {
namespace {

// memfd_create's huge page size field (linux/memfd.h's MFD_HUGE_SHIFT, whose header clashes with
// glibc's): log2 of the page size, from this bit on.
constexpr unsigned kMemfdHugeShift = 26;
constexpr unsigned kMemfdHuge2Mib = 21u << kMemfdHugeShift;
constexpr unsigned kMemfdHuge1Gib = 30u << kMemfdHugeShift;

}  // namespace

MemfdDevices MemfdDevices::Probe() {
  MemfdDevices found;
  for (const unsigned flags : {0u, MFD_HUGETLB | kMemfdHuge2Mib, MFD_HUGETLB | kMemfdHuge1Gib}) {
    const int fd = memfd_create("herd-memfd-probe", MFD_CLOEXEC | flags);
    if (fd < 0) continue;  // no such huge page size here: no memfd can be on it either
    struct stat st;
    if (fstat(fd, &st) == 0 && !found.Contains(st.st_dev)) {
      found.devices_[found.count_++] = st.st_dev;
    }
    close(fd);
  }
  return found;
}

bool MemfdDevices::Contains(dev_t device) const {
  for (size_t i = 0; i < count_; ++i) {
    if (devices_[i] == device) return true;
  }
  return false;
}

absl::StatusOr<int> OpenPeerFile(int32_t pid, int32_t fd, const MemfdDevices& memfds,
                                 bool any_regular_file) {
  const std::string theirs = absl::StrFormat("/proc/%d/fd/%d", pid, fd);
  // O_PATH follows the magic link to the peer's open file and calls no open method of its file
  // system; the descriptor is ours, so what it names can no longer change.
  const int path_fd = open(theirs.c_str(), O_PATH | O_CLOEXEC);
  if (path_fd < 0) {
    return util::ErrnoStatus(absl::StatusCode::kUnavailable, absl::StrCat("open ", theirs));
  }
  struct statx stx;
  const bool identified =
      statx(path_fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &stx) == 0;
  const bool regular = identified && S_ISREG(stx.stx_mode);
  const bool memfd = regular && memfds.Contains(makedev(stx.stx_dev_major, stx.stx_dev_minor));
  if (!memfd && !(regular && any_regular_file)) {
    close(path_fd);
    return absl::FailedPreconditionError(absl::StrFormat("peer pid %d fd %d names %s", pid, fd,
                                                         !identified
                                                             ? "a file that cannot be identified"
                                                         : !regular ? "no regular file"
                                                                    : "a file that is no memfd"));
  }
  const std::string ours = absl::StrFormat("/proc/self/fd/%d", path_fd);
  const int opened = open(ours.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY);
  const int saved = errno;
  close(path_fd);
  if (opened < 0) {
    errno = saved;
    return util::ErrnoStatus(absl::StatusCode::kUnavailable,
                             absl::StrFormat("open %s (peer pid %d fd %d)", ours, pid, fd));
  }
  return opened;
}

}  // namespace transport::shm
