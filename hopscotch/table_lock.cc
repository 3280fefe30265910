#include "hopscotch/table_lock.h"

#include <sys/file.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "util/errno_status.h"

namespace hopscotch {

absl::Status LockTableFile(int fd, const std::string& path, LockMode mode) {
  const int operation = (mode == LockMode::kExclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
  if (flock(fd, operation) == 0) return absl::OkStatus();
  if (errno == EWOULDBLOCK) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: in use: another process holds this table's lock (%s); stop it first, or write the "
        "table to another path",
        path,
        mode == LockMode::kExclusive
            ? "a hop_server serving it, or a hop_build writing it"
            : "a hop_server serving it writable, or a hop_build writing it"));
  }
  if (errno == ENOLCK || errno == EOPNOTSUPP || errno == EINVAL) {
    // Some network and virtual file systems have no flock: the table still works, unguarded.
    LOG(WARNING) << path << ": cannot lock the table file (" << std::strerror(errno)
                 << "): nothing stops a second writer or a hop_build from replacing it";
    return absl::OkStatus();
  }
  return util::ErrnoStatus(absl::StatusCode::kInternal, path + ": flock");
}

}  // namespace hopscotch
