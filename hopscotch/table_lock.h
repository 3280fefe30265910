// Who may use a table file at once (issue 36): a writer (hop_server, hop_build) alone; readers
// (a --read_only hop_server) together but never beside a writer. A second writer would race the
// first's stores and header count, and hop_build's Create truncates the file under a server whose
// clients then die of SIGBUS on their READs' pages; so a table holds a flock(2) on its file for
// its whole life, exclusive when writable and shared when read-only, taken without waiting
// before anything is read, truncated or written. Internal to hopscotch/.
//
// flock is advisory and belongs to the open file description: it goes with the process (kill -9
// included, so no stale lock survives a crash) and also conflicts between two opens in ONE
// process. A device-DAX node is locked like a file (the lock is on its inode).
#ifndef HERD_HOPSCOTCH_TABLE_LOCK_H_
#define HERD_HOPSCOTCH_TABLE_LOCK_H_

#include <string>

#include "absl/status/status.h"

namespace hopscotch {

enum class LockMode {
  kShared,     // a reader: refused while a writer holds the file
  kExclusive,  // a writer: refused while anyone holds it
};

// Takes `mode`'s lock on `fd` (the table file at `path`) without waiting. FailedPrecondition
// naming the path when another process (or another open in this one) holds a conflicting lock;
// Aborted (lock released) when `path` no longer names `fd`'s file, which a rename over it
// between the caller's open and this lock does: open the path again; a file system without flock
// is logged and let through (nothing can be checked there).
absl::Status LockTableFile(int fd, const std::string& path, LockMode mode);

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_TABLE_LOCK_H_
