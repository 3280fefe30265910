#include "hopscotch/table_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_format.h"
#include "hopscotch/table_file.h"
#include "hopscotch/table_lock.h"
#include "util/errno_status.h"

namespace hopscotch {
namespace {

// Random temporary names tried before giving up (a collision of 64 random bits is a sign of
// something else, not bad luck).
constexpr int kMaxTemporaryNames = 8;
// The temporary's mode while it is built when it replaces a file: writable by its builder
// whatever the old file's mode (Commit gives it that mode before the rename).
constexpr mode_t kBuildingMode = 0600;
// A new table file's mode when it replaces nothing (what open(2) with O_CREAT gave before: the
// umask applies).
constexpr mode_t kNewTableMode = 0644;

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseNameOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Refused when another process holds `path` (a hop_server serving it): the lock is taken and
// dropped at once, a check that the work is worth doing.
absl::Status CheckNotInUse(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return util::ErrnoStatus(absl::StatusCode::kFailedPrecondition, path + ": open");
  const absl::Status s = LockTableFile(fd, path, LockMode::kExclusive);
  close(fd);
  return s;
}

}  // namespace

absl::StatusOr<TableOutput> TableOutput::Prepare(const std::string& path, bool lock) {
  if (path.empty()) return absl::InvalidArgumentError("no output path");
  TableOutput out;
  out.lock_ = lock;
  // Replace what a symbolic link names, not the link (writing through it did the same).
  if (char* real = realpath(path.c_str(), nullptr); real != nullptr) {
    out.target_ = real;
    std::free(real);
  } else if (errno != ENOENT) {
    return util::ErrnoStatus(absl::StatusCode::kFailedPrecondition, path);
  } else {
    struct stat link;
    if (lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: a symbolic link to a missing file: give the path the table should have", path));
    }
    out.target_ = path;  // a new file
  }
  struct stat st;
  if (stat(out.target_.c_str(), &st) == 0) {
    if (absl::Status s = CheckTableFileType(st.st_mode); !s.ok()) {
      return absl::Status(s.code(), absl::StrFormat("%s: %s", path, s.message()));
    }
    if (lock) {
      if (absl::Status s = CheckNotInUse(out.target_); !s.ok()) return s;
    }
    if (S_ISCHR(st.st_mode)) {
      out.in_place_ = true;  // a device node cannot be renamed over
      return out;
    }
    out.replaced_mode_ = st.st_mode & 07777;  // the replacement keeps the file's permissions
  }
  // A random name beside the target, created exclusively (O_EXCL): taken names (a leftover of a
  // killed build, another build under way) are skipped, and the mode is what open(2) with
  // O_CREAT gives (the umask applies) until Commit gives it the replaced file's.
  absl::BitGen random;
  for (int attempt = 0; attempt < kMaxTemporaryNames; ++attempt) {
    const std::string name =
        absl::StrFormat("%s/.%s.tmp-%016x", DirectoryOf(out.target_), BaseNameOf(out.target_),
                        absl::Uniform<uint64_t>(random));
    const int fd = open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
                        out.replaced_mode_ ? kBuildingMode : kNewTableMode);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) {
      return util::ErrnoStatus(
          absl::StatusCode::kFailedPrecondition,
          absl::StrFormat("%s: cannot create the temporary file the table is built in, %s", path,
                          name));
    }
    close(fd);  // Table::Create opens it again
    out.temporary_ = name;
    return out;
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: %d random temporary names beside it were all taken", path, kMaxTemporaryNames));
}

TableOutput::TableOutput(TableOutput&& other) noexcept { *this = std::move(other); }

TableOutput& TableOutput::operator=(TableOutput&& other) noexcept {
  if (this != &other) {
    RemoveTemporary();
    target_ = std::move(other.target_);
    temporary_ = std::exchange(other.temporary_, std::string());
    in_place_ = other.in_place_;
    replaced_mode_ = other.replaced_mode_;
    lock_ = other.lock_;
  }
  return *this;
}

TableOutput::~TableOutput() { RemoveTemporary(); }

void TableOutput::RemoveTemporary() {
  if (!temporary_.empty()) unlink(temporary_.c_str());
  temporary_.clear();
}

absl::Status TableOutput::Commit() {
  if (in_place_) return absl::OkStatus();
  if (temporary_.empty()) return absl::FailedPreconditionError(target_ + ": already committed");
  // The replaced file's permissions, exactly (no umask: chmod, not open).
  if (replaced_mode_ && chmod(temporary_.c_str(), *replaced_mode_) != 0) {
    return util::ErrnoStatus(absl::StatusCode::kInternal,
                             absl::StrFormat("%s: chmod %o", temporary_, *replaced_mode_));
  }
  // The table's bytes durable before the name points at them: otherwise a power failure could
  // leave the new name on an empty or partial file, the old table gone.
  const int fd = open(temporary_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return util::ErrnoStatus(absl::StatusCode::kInternal, temporary_ + ": open");
  const bool synced = fsync(fd) == 0;
  const absl::Status sync_error =
      synced ? absl::OkStatus() : util::ErrnoStatus(absl::StatusCode::kInternal, temporary_);
  close(fd);
  if (!synced) return sync_error;
  // A server that started on the old file during the build still holds it: refuse rather than
  // swap its table. The lock is held across the rename, so a server that opened the old file
  // and locks it in between is refused. A server that opened the old path just before the
  // rename and locks it just after finds the path naming another file (LockTableFile) and opens
  // the new table instead.
  const int old = lock_ ? open(target_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
  if (lock_ && old < 0 && errno != ENOENT) {
    return util::ErrnoStatus(absl::StatusCode::kFailedPrecondition, target_ + ": open");
  }
  if (old >= 0) {
    if (absl::Status s = LockTableFile(old, target_, LockMode::kExclusive); !s.ok()) {
      close(old);
      return absl::Status(
          s.code(), absl::StrFormat("%s: the table just built was discarded, the file is as it was",
                                    s.message()));
    }
  }
  absl::Status status;
  if (rename(temporary_.c_str(), target_.c_str()) != 0) {
    status = util::ErrnoStatus(absl::StatusCode::kInternal,
                               absl::StrFormat("rename %s over %s", temporary_, target_));
  } else {
    temporary_.clear();
    status = SyncParentDirectory(target_);  // the rename itself durable
  }
  if (old >= 0) close(old);
  return status;
}

}  // namespace hopscotch
