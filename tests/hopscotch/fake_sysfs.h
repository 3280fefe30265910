// Device tables in tests: a real character device that supports shared mappings, /dev/zero
// (MAP_SHARED of it is shared anonymous memory: nothing persists across mappings, so no test
// reopens a table there), and a fake sysfs giving it a device-DAX size and alignment. /dev/zero
// is one inode for every process: tests open tables there with TableOptions::lock off, or test
// binaries running at once would refuse each other (only lock_test locks it, and skips if it
// cannot).
#ifndef HERD_TESTS_HOPSCOTCH_FAKE_SYSFS_H_
#define HERD_TESTS_HOPSCOTCH_FAKE_SYSFS_H_

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"

namespace hopscotch {

inline constexpr char kDevZero[] = "/dev/zero";

// Whether /dev/zero is a character device here (a sandbox might lack it).
inline bool DevZeroUsable() {
  struct stat st;
  return stat(kDevZero, &st) == 0 && S_ISCHR(st.st_mode);
}

// A sysfs root under TEST_TMPDIR/NAME whose dev/char/MAJOR:MINOR/ of /dev/zero holds `size` and
// `align` (each left out when nullopt). Returns the root, for TableOptions::sysfs_root.
inline std::string FakeSysfs(const std::string& name, std::optional<std::string> size,
                             std::optional<std::string> align) {
  struct stat st;
  stat(kDevZero, &st);
  const std::string root = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  const std::string dir =
      absl::StrFormat("%s/dev/char/%u:%u", root, major(st.st_rdev), minor(st.st_rdev));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(dir);
  if (size) std::ofstream(dir + "/size") << *size << "\n";
  if (align) std::ofstream(dir + "/align") << *align << "\n";
  return root;
}

}  // namespace hopscotch

#endif  // HERD_TESTS_HOPSCOTCH_FAKE_SYSFS_H_
