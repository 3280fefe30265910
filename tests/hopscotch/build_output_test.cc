// Issue 36: hop_build never leaves a partial table at --out. A regular file is built in a
// temporary beside it and renamed over it only on success: a failed build (a full table here)
// leaves the table that was there byte for byte, and a new path empty; a server that started on
// the old file during the build is not replaced under it. A device-DAX device is written in
// place with its header made last (TableOptions::defer_header): a table closed unpublished is
// not a table, and a failed device build says its header is left unmade.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "hopscotch/build.h"
#include "hopscotch/hash.h"
#include "hopscotch/table.h"
#include "hopscotch/table_output.h"
#include "tests/hopscotch/fake_sysfs.h"

namespace hopscotch {
namespace {

using Kind = LookupResult::Kind;

// 200 keys cannot fit 64 home buckets (at most 64 + 31 buckets): the build fails part way,
// with keys already inserted.
constexpr int kKeys = 200;
constexpr uint64_t kTooFewBuckets = 64;
constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }
std::string TmpPath(const std::string& name) { return TmpDir() + "/" + name; }

std::string KeyOf(int i) { return absl::StrFormat("user%d", i); }

std::string MakeTrace(const std::string& name, int records) {
  const std::string path = TmpPath(name);
  std::ofstream out(path);
  for (int i = 0; i < records; ++i) out << "INSERT usertable " << KeyOf(i) << " [ <all fields>]\n";
  return path;
}

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

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

BuildOptions Build(const std::string& trace, const std::string& out, uint64_t home_buckets = 0) {
  BuildOptions build;
  build.traces = {trace};
  build.out = out;
  build.home_buckets = home_buckets;
  return build;
}

TEST(BuildOutput, AFailedBuildKeepsTheTableThatWasThere) {
  const std::string out = TmpPath("kept.hop");
  const std::string good_trace = MakeTrace("good.txt", 50);
  ASSERT_TRUE(BuildTable(Build(good_trace, out)).ok());
  ASSERT_EQ(chmod(out.c_str(), 0640), 0);
  const std::string before = Contents(out);
  absl::StatusOr<BuildSummary> full =
      BuildTable(Build(MakeTrace("full.txt", kKeys), out, kTooFewBuckets));
  ASSERT_TRUE(absl::IsResourceExhausted(full.status())) << full.status();
  EXPECT_TRUE(Contents(out) == before) << "a failed build changed " << out;
  EXPECT_TRUE(FilesStartingWith(".kept.hop.tmp-").empty()) << "the temporary was left behind";
  absl::StatusOr<Table> t = Table::Open(out, /*writable=*/false);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->items(), 50u);
  EXPECT_EQ(t->Lookup(KeyOf(49)).kind, Kind::kFound);
  EXPECT_EQ(t->Lookup(KeyOf(150)).kind, Kind::kMiss);
  ASSERT_TRUE(t->Close().ok());
  // A successful build replaces it, keeping its permissions.
  ASSERT_TRUE(BuildTable(Build(MakeTrace("more.txt", 150), out)).ok());
  t = Table::Open(out, /*writable=*/false);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->items(), 150u);
  struct stat st;
  ASSERT_EQ(stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_TRUE(FilesStartingWith(".kept.hop.tmp-").empty());
}

TEST(BuildOutput, AFailedBuildLeavesNothingAtANewPath) {
  const std::string out = TmpPath("never.hop");
  absl::StatusOr<BuildSummary> full =
      BuildTable(Build(MakeTrace("never.txt", kKeys), out, kTooFewBuckets));
  ASSERT_TRUE(absl::IsResourceExhausted(full.status())) << full.status();
  EXPECT_FALSE(Exists(out)) << "a partial table was left at " << out;
  EXPECT_TRUE(FilesStartingWith(".never.hop.tmp-").empty()) << "the temporary was left behind";
}

// A hop_server that opened the old file while the build ran holds it: the rename is refused and
// the server's file stays as it was (the lock is checked again just before the rename).
TEST(BuildOutput, ServerThatStartedDuringTheBuildIsNotReplaced) {
  const std::string out = TmpPath("raced.hop");
  ASSERT_TRUE(BuildTable(Build(MakeTrace("raced.txt", 50), out)).ok());
  const std::string before = Contents(out);
  absl::StatusOr<TableOutput> output = TableOutput::Prepare(out);  // nobody serves it yet
  ASSERT_TRUE(output.ok()) << output.status();
  ASSERT_FALSE(output->in_place());
  TableOptions deferred;
  deferred.defer_header = true;
  absl::StatusOr<Table> built = Table::Create(output->build_path(), 64, 0, {}, deferred);
  ASSERT_TRUE(built.ok()) << built.status();
  ASSERT_TRUE(built->Insert("new", ExpectedValue("new")).ok());
  ASSERT_TRUE(built->Publish().ok());
  absl::StatusOr<Table> server = Table::Open(out, /*writable=*/false);  // starts now
  ASSERT_TRUE(server.ok()) << server.status();
  const absl::Status committed = output->Commit();
  ASSERT_FALSE(committed.ok()) << "a served file was replaced";
  EXPECT_TRUE(absl::StrContains(committed.message(), out)) << committed;
  EXPECT_TRUE(absl::StrContains(committed.message(), "another process holds")) << committed;
  EXPECT_EQ(server->Lookup(KeyOf(0)).kind, Kind::kFound);
  ASSERT_TRUE(server->Close().ok());
  output = absl::InternalError("dropped");  // removes the temporary
  EXPECT_TRUE(Contents(out) == before);
  EXPECT_TRUE(FilesStartingWith(".raced.hop.tmp-").empty()) << "the temporary was left behind";
}

// The mechanism a device build relies on: no table until Publish.
TEST(BuildOutput, ADeferredHeaderIsMadeOnlyByPublish) {
  const std::string path = TmpPath("deferred.hop");
  TableOptions deferred;
  deferred.defer_header = true;
  for (bool publish : {false, true}) {
    SCOPED_TRACE(publish ? "published" : "closed unpublished");
    absl::StatusOr<Table> t = Table::Create(path, 64, /*seed=*/9, Sharding{1, 3}, deferred);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; t->items() < 20; ++i) {
      if (!t->sharding().Holds(KeyOf(i))) continue;
      ASSERT_TRUE(t->Insert(KeyOf(i), ExpectedValue(KeyOf(i))).ok());
    }
    ASSERT_TRUE((publish ? t->Publish() : t->Close()).ok());
    absl::StatusOr<Table> opened = Table::Open(path, /*writable=*/false);
    if (!publish) {
      ASSERT_FALSE(opened.ok()) << "an unpublished table opened";
      EXPECT_TRUE(absl::StrContains(opened.status().message(), "not a hopscotch table"))
          << opened.status();
      continue;
    }
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(opened->items(), 20u);
    EXPECT_EQ(opened->seed(), 9u);
    EXPECT_EQ(opened->sharding().shard, 1u);
    EXPECT_EQ(opened->sharding().shards, 3u);
    EXPECT_TRUE(opened->CheckInvariants().ok()) << opened->CheckInvariants();
  }
}

// A device cannot be renamed: a failed build there says the device holds no table now (its
// header unmade) instead of leaving a partial table to serve. /dev/zero keeps nothing, so the
// error is what can be checked here.
TEST(BuildOutput, AFailedDeviceBuildSaysItsHeaderIsUnmade) {
  if (!DevZeroUsable()) GTEST_SKIP() << "no /dev/zero character device here";
  BuildOptions build = Build(MakeTrace("device.txt", kKeys), kDevZero, kTooFewBuckets);
  build.table.sysfs_root =
      FakeSysfs("sys_build", std::to_string(8 * kMiB), std::to_string(2 * kMiB));
  build.table.lock = false;  // /dev/zero is shared with other test processes (fake_sysfs.h)
  absl::StatusOr<BuildSummary> full = BuildTable(build);
  ASSERT_TRUE(absl::IsResourceExhausted(full.status())) << full.status();
  EXPECT_TRUE(absl::StrContains(full.status().message(), "/dev/zero now holds no table"))
      << full.status();
  EXPECT_TRUE(absl::StrContains(full.status().message(), "header is left unmade")) << full.status();
  // And a device build that succeeds is published.
  build.traces = {MakeTrace("device_ok.txt", 40)};
  absl::StatusOr<BuildSummary> ok = BuildTable(build);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->keys, 40u);
}

}  // namespace
}  // namespace hopscotch
