// Issue 36: a table file in use is locked. A writer (hop_server, hop_build) holds it exclusively,
// readers (a --read_only hop_server) share it: a second writer, a reader beside a writer, and
// hop_build onto a served path are refused with an error naming the path, before anything in the
// file changes. Before, hop_build truncated a served file (its clients died of SIGBUS, the server
// on its next upsert) and two writers raced each other's header count.
//
// flock conflicts between two opens of one process as between two processes, so one process
// stands for both sides here; service_hostile_test has two servers.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "hopscotch/build.h"
#include "hopscotch/hash.h"
#include "hopscotch/table.h"
#include "hopscotch/table_lock.h"
#include "tests/hopscotch/fake_sysfs.h"

namespace hopscotch {
namespace {

using Kind = LookupResult::Kind;

constexpr uint64_t kHomeBuckets = 256;
constexpr int kKeys = 100;
constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }
std::string TmpPath(const std::string& name) { return TmpDir() + "/" + name; }

std::string KeyOf(int i) { return absl::StrFormat("user%d", i); }

// A closed table of kKeys keys.
std::string MakeTable(const std::string& name) {
  const std::string path = TmpPath(name);
  absl::StatusOr<Table> t = Table::Create(path, kHomeBuckets);
  EXPECT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < kKeys; ++i) EXPECT_TRUE(t->Insert(KeyOf(i), ExpectedValue(KeyOf(i))).ok());
  EXPECT_TRUE(t->Close().ok());
  return path;
}

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A YCSB trace inserting `records` keys.
std::string MakeTrace(const std::string& name, int records) {
  const std::string path = TmpPath(name);
  std::ofstream out(path);
  for (int i = 0; i < records; ++i) out << "INSERT usertable " << KeyOf(i) << " [ <all fields>]\n";
  return path;
}

// Names in TEST_TMPDIR starting with `prefix` (hop_build's temporaries: ".NAME.tmp-").
std::vector<std::string> FilesStartingWith(const std::string& prefix) {
  std::vector<std::string> found;
  DIR* dir = opendir(TmpDir().c_str());
  if (dir == nullptr) return found;
  while (const dirent* entry = readdir(dir)) {
    if (absl::StartsWith(entry->d_name, prefix)) found.push_back(entry->d_name);
  }
  closedir(dir);
  return found;
}

// Refused as in use, naming `path`.
void ExpectInUse(const absl::Status& status, const std::string& path) {
  ASSERT_FALSE(status.ok()) << path << " was not refused";
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "another process holds this table's lock"))
      << status;
}

void ExpectEveryKey(const Table& t) {
  EXPECT_EQ(t.items(), static_cast<uint64_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) {
    const LookupResult r = t.Lookup(KeyOf(i));
    ASSERT_EQ(r.kind, Kind::kFound) << KeyOf(i);
    EXPECT_EQ(r.value, ExpectedValue(KeyOf(i)));
  }
}

TEST(Lock, AWriterExcludesEveryOtherOpenAndCreate) {
  const std::string path = MakeTable("writer.hop");
  const std::string before = Contents(path);
  absl::StatusOr<Table> writer = Table::Open(path, /*writable=*/true);  // a serving hop_server
  ASSERT_TRUE(writer.ok()) << writer.status();
  ExpectInUse(Table::Open(path, /*writable=*/true).status(), path);
  ExpectInUse(Table::Open(path, /*writable=*/false).status(), path);
  ExpectInUse(Table::Create(path, kHomeBuckets).status(), path);  // would truncate it
  // Untouched: same size (no truncation: the writer's mapping and its readers' pages are
  // whole), and the writer goes on inserting and closes with the right count.
  ExpectEveryKey(*writer);
  ASSERT_TRUE(writer->Insert("late", ExpectedValue("late")).ok());
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(Contents(path).size(), before.size());
  absl::StatusOr<Table> reopened = Table::Open(path, /*writable=*/true);  // the lock went with it
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(reopened->items(), static_cast<uint64_t>(kKeys) + 1);
  EXPECT_EQ(reopened->Lookup("late").kind, Kind::kFound);
}

TEST(Lock, ReadersShareTheFileButExcludeWriters) {
  const std::string path = MakeTable("readers.hop");
  const std::string before = Contents(path);
  absl::StatusOr<Table> a = Table::Open(path, /*writable=*/false);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Table> b = Table::Open(path, /*writable=*/false);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectInUse(Table::Open(path, /*writable=*/true).status(), path);
  ExpectInUse(Table::Create(path, kHomeBuckets).status(), path);
  ExpectEveryKey(*a);
  ExpectEveryKey(*b);
  EXPECT_TRUE(Contents(path) == before) << "a refused writer changed the file";
}

// The audit's mistake: hop_build --out onto the path a hop_server serves. Refused, naming the
// path, before anything is built or written; the server's table is whole and still works.
TEST(Lock, BuildOntoAServedTableIsRefused) {
  const std::string trace = MakeTrace("served.txt", 50);
  for (bool writable : {true, false}) {
    SCOPED_TRACE(writable ? "a writable server" : "a read-only server");
    const std::string path = MakeTable(writable ? "served_rw.hop" : "served_ro.hop");
    const std::string before = Contents(path);
    absl::StatusOr<Table> served = Table::Open(path, writable);
    ASSERT_TRUE(served.ok()) << served.status();
    BuildOptions build;
    build.traces = {trace};
    build.out = path;
    ExpectInUse(BuildTable(build).status(), path);
    ExpectEveryKey(*served);
    ASSERT_TRUE(served->Close().ok());
    // Closed clean with the count it had: byte for byte the file it was.
    EXPECT_TRUE(Contents(path) == before) << "the served file changed";
    EXPECT_TRUE(FilesStartingWith("." + std::string(writable ? "served_rw" : "served_ro")).empty())
        << "a temporary was left behind";
  }
}

// A device-DAX device is locked like a file (its node's inode). /dev/zero stands in for one; it
// is one inode for every process, so a lock another process holds skips the test.
// A file replaced at its path between an open and the lock (hop_build renames a new table over
// the path just after a hop_server opened it) is not locked and served: LockTableFile sees the
// path naming another file and says so, and Table::Open opens the path again, so the table
// served is the new one. Before, the server held and served the unlinked old file.
TEST(Lock, AFileReplacedBetweenOpenAndLockIsLetGo) {
  const std::string path = MakeTable("replaced");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  // The rename hop_build does, between our open and our lock.
  const std::string fresh = TmpPath("replaced.new");
  {
    absl::StatusOr<Table> t = Table::Create(fresh, kHomeBuckets);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(t->Insert("only-in-the-new-table", ExpectedValue("x")).ok());
    ASSERT_TRUE(t->Close().ok());
  }
  ASSERT_EQ(rename(fresh.c_str(), path.c_str()), 0);
  const absl::Status locked = LockTableFile(fd, path, LockMode::kShared);
  EXPECT_TRUE(absl::IsAborted(locked)) << locked;
  EXPECT_TRUE(absl::StrContains(locked.message(), "replaced while being opened")) << locked;
  // Let go: the old file's lock is not held (an exclusive lock on it succeeds).
  const int again = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(again, 0);
  close(fd);
  // The path itself: opened and locked as the file it names now.
  EXPECT_TRUE(LockTableFile(again, path, LockMode::kShared).ok());
  close(again);
  absl::StatusOr<Table> t = Table::Open(path, /*writable=*/false);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Lookup("only-in-the-new-table").kind, Kind::kFound);
}

TEST(Lock, ADeviceIsLockedToo) {
  if (!DevZeroUsable()) GTEST_SKIP() << "no /dev/zero character device here";
  TableOptions options;
  options.sysfs_root = FakeSysfs("sys_lock", std::to_string(8 * kMiB), std::to_string(4096));
  absl::StatusOr<Table> first = Table::Create(kDevZero, 64, 0, {}, options);
  if (!first.ok() && absl::StrContains(first.status().message(), "another process holds")) {
    GTEST_SKIP() << "another process holds /dev/zero's lock: " << first.status();
  }
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectInUse(Table::Create(kDevZero, 64, 0, {}, options).status(), kDevZero);
  ExpectInUse(Table::Open(kDevZero, /*writable=*/false, options).status(), kDevZero);
  ASSERT_TRUE(first->Close().ok());
  // Released with the table: /dev/zero holds no table (its mapping is fresh anonymous memory),
  // so the next open gets past the lock to the header.
  absl::StatusOr<Table> next = Table::Open(kDevZero, /*writable=*/false, options);
  ASSERT_FALSE(next.ok());
  EXPECT_TRUE(absl::StrContains(next.status().message(), "not a hopscotch table")) << next.status();
}

}  // namespace
}  // namespace hopscotch
