// Where a new table is built (hop_build, issue 36): never as a partial table at its path.
//
// A regular file is built in a temporary file beside it (same directory, so same file system)
// and renamed over it only once the table is complete and durable: a build that fails, or dies,
// leaves the table that was there untouched and nothing servable in its place (a killed build
// leaves its temporary, ".NAME.tmp-*", which is not a table until published). A device-DAX
// character device cannot be renamed: it is written in place, with its header left unmade
// (TableOptions::defer_header) until the build succeeds, so a failed build leaves "not a
// hopscotch table" there rather than a partial one (the table it held is gone either way).
//
// A path another process holds (table_lock.h: a hop_server serving it) is refused when the
// output is prepared, before any work, and again just before the rename, so that a server that
// started meanwhile does not have its file replaced under it.
#ifndef HERD_HOPSCOTCH_TABLE_OUTPUT_H_
#define HERD_HOPSCOTCH_TABLE_OUTPUT_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hopscotch {

class TableOutput {
 public:
  // Resolves `path` (a symbolic link: its target is what gets replaced) and checks it is not in
  // use; for a regular file (or a path that does not exist yet) creates the temporary. `lock`:
  // TableOptions::lock (false, tests only: no lock is checked, here or at Commit).
  static absl::StatusOr<TableOutput> Prepare(const std::string& path, bool lock = true);

  TableOutput(TableOutput&& other) noexcept;
  TableOutput& operator=(TableOutput&& other) noexcept;
  TableOutput(const TableOutput&) = delete;
  TableOutput& operator=(const TableOutput&) = delete;
  ~TableOutput();  // not committed: removes the temporary

  // Where Table::Create builds the table (with TableOptions::defer_header): the temporary, or
  // the device itself.
  const std::string& build_path() const { return in_place_ ? target_ : temporary_; }
  // A device-DAX device, written in place.
  bool in_place() const { return in_place_; }

  // Once the table at build_path() is published and closed (Table::Publish): makes the
  // temporary durable (fsync), takes the path's lock (refused if another process holds it),
  // renames the temporary over it and makes the rename durable (fsync of the directory). In
  // place: nothing left to do.
  absl::Status Commit();

 private:
  TableOutput() = default;
  void RemoveTemporary();

  std::string target_;     // the path, symbolic links resolved
  std::string temporary_;  // empty in place, or once renamed or removed
  bool in_place_ = false;
  bool lock_ = true;
  std::optional<mode_t> replaced_mode_;  // the permissions of the file the table replaces
};

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_TABLE_OUTPUT_H_
