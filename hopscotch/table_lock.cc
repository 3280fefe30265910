#include "hopscotch/table_lock.h"

#include <sys/file.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "util/errno_status.h"

namespace hopscotch {

absl::Status LockTableFile(int fd, const std::string& path, LockMode mode) {
  const int operation = (mode == LockMode::kExclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
  if (flock(fd, operation) == 0) {
    // The lock guards the file the path names now, or nothing: a hop_build that renamed a new
    // table over the path after our open left us holding the unlinked old file, which we would
    // serve (and it would not stop the next writer of the path).
    struct stat held, named;
    if (fstat(fd, &held) != 0) return util::ErrnoStatus(absl::StatusCode::kInternal, path);
    const bool gone = stat(path.c_str(), &named) != 0;
    if (gone && errno != ENOENT) {  // cannot tell (EACCES, ELOOP, ...): said as it is
      const absl::Status error = util::ErrnoStatus(absl::StatusCode::kInternal, path + ": stat");
      flock(fd, LOCK_UN);
      return error;
    }
    const bool replaced = gone || held.st_dev != named.st_dev || held.st_ino != named.st_ino;
    if (!replaced) return absl::OkStatus();
    flock(fd, LOCK_UN);
    return absl::AbortedError(absl::StrFormat(
        "%s: replaced while being opened (a hop_build renamed a new table over it, or it was "
        "removed): open it again",
        path));
  }
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
