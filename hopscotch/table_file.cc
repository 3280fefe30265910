#include "hopscotch/table_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <bit>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "util/errno_status.h"
#include "util/round_up.h"

namespace hopscotch {
namespace {

// A sysfs attribute is one short line ("2097152\n").
constexpr size_t kMaxAttributeBytes = 64;

uint64_t PageBytes() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

// The unsigned decimal in sysfs file `path`.
absl::StatusOr<uint64_t> ReadAttribute(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return util::ErrnoStatus(absl::StatusCode::kFailedPrecondition, path);
  char text[kMaxAttributeBytes];
  const ssize_t n = read(fd, text, sizeof(text));
  if (n < 0) {
    const absl::Status error = util::ErrnoStatus(absl::StatusCode::kFailedPrecondition, path);
    close(fd);
    return error;
  }
  close(fd);
  uint64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(text, n)), &value)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: '%s' is not a byte count", path,
                        absl::StripAsciiWhitespace(absl::string_view(text, n))));
  }
  return value;
}

}  // namespace

absl::Status CheckTableFileType(mode_t mode) {
  if (S_ISREG(mode) || S_ISCHR(mode)) return absl::OkStatus();
  const char* what = S_ISDIR(mode)    ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO"
                     : S_ISSOCK(mode) ? "a socket"
                     : S_ISBLK(mode)  ? "a block device: mount a DAX file system on it (-o dax) "
                                        "and put the table in a file there, or use its "
                                        "device-DAX character device"
                                      : "a special file";
  return absl::FailedPreconditionError(
      absl::StrFormat("not a regular file or a device-DAX character device (%s)", what));
}

absl::StatusOr<DeviceGeometry> ReadDeviceGeometry(const struct stat& st,
                                                  const std::string& sysfs_root) {
  const std::string dir =
      absl::StrFormat("%s/dev/char/%u:%u/", sysfs_root, major(st.st_rdev), minor(st.st_rdev));
  DeviceGeometry geometry;
  absl::StatusOr<uint64_t> size = ReadAttribute(dir + "size");
  if (!size.ok()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("a character device without a readable size (%s): not a device-DAX device?",
                        size.status().message()));
  }
  geometry.bytes = *size;
  const std::string align_path = dir + "align";
  if (access(align_path.c_str(), F_OK) != 0) {
    geometry.align = PageBytes();  // no per-device attribute: an older kernel
  } else {
    absl::StatusOr<uint64_t> align = ReadAttribute(align_path);
    if (!align.ok()) return align.status();
    geometry.align = *align;
  }
  if (!std::has_single_bit(geometry.align)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%salign: %u is not a power of two", dir, geometry.align));
  }
  return geometry;
}

absl::StatusOr<Header> ReadDeviceHeader(int fd, const DeviceGeometry& geometry) {
  const uint64_t bytes = util::RoundUp(kHeaderBytes, geometry.align);
  if (bytes > geometry.bytes) {
    return absl::DataLossError(absl::StrFormat(
        "a device of %u bytes cannot hold the %u-byte header (mapped as %u bytes, its alignment)",
        geometry.bytes, kHeaderBytes, bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return util::ErrnoStatus(absl::StatusCode::kInternal,
                             absl::StrFormat("mmap of the header (%u bytes)", bytes));
  }
  Header h;
  std::memcpy(&h, p, sizeof(h));
  munmap(p, bytes);
  return h;
}

absl::Status SyncParentDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return util::ErrnoStatus(absl::StatusCode::kInternal, dir + ": open directory");
  absl::Status status;
  if (fsync(fd) != 0) status = util::ErrnoStatus(absl::StatusCode::kInternal, dir + ": fsync");
  close(fd);
  return status;
}

}  // namespace hopscotch
