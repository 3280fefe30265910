// What a table path may be, for Table::Create and Table::Open: a regular file (sized with
// ftruncate, its size from fstat) or a device-DAX character device such as /dev/dax0.0 (a fixed
// size and a mapping alignment, both read from sysfs). Internal to hopscotch/.
#ifndef HERD_HOPSCOTCH_TABLE_FILE_H_
#define HERD_HOPSCOTCH_TABLE_FILE_H_

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hopscotch/format.h"

namespace hopscotch {

// OK for a regular file or a character device; otherwise FailedPrecondition saying what the
// path is ("not a regular file or a device-DAX character device (a directory)"). A block device
// is refused too: its mapping goes through the page cache, not DAX; use a DAX file system on it
// or its device-DAX character device.
absl::Status CheckTableFileType(mode_t mode);

struct DeviceGeometry {
  uint64_t bytes = 0;  // the device's size
  uint64_t align = 0;  // every mapping's length (and address) is a multiple of it
};

// The geometry of the character device `st` describes, from
// SYSFS_ROOT/dev/char/MAJOR:MINOR/size and .../align. A missing `align` (kernels before 5.10
// do not export it per device) reads as the page size; a missing or malformed `size` is an
// error naming the sysfs file.
absl::StatusOr<DeviceGeometry> ReadDeviceGeometry(const struct stat& st,
                                                  const std::string& sysfs_root);

// The header of the table on device `fd`, read through a read-only mapping of its first
// `align` bytes (device-DAX has no read(2)).
absl::StatusOr<Header> ReadDeviceHeader(int fd, const DeviceGeometry& geometry);

// fsync of the directory holding `path`: a new file's name survives power failure.
absl::Status SyncParentDirectory(const std::string& path);

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_TABLE_FILE_H_
