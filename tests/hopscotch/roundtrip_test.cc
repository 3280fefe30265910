// Trace -> table -> lookups: a generated YCSB trace (load and run phase) and a hand-written one in
// YCSB's own output style are built into a file; reopened, every key is looked up through the
// pure reader on its 2 KiB neighbourhood, exactly what a client does with a READ's bytes.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/ycsb_trace_gen.h"
#include "gtest/gtest.h"
#include "hopscotch/build.h"
#include "hopscotch/hash.h"
#include "hopscotch/table.h"
#include "hopscotch/ycsb_trace.h"

namespace hopscotch {
namespace {

using Kind = LookupResult::Kind;

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

LookupResult ReadLike(const Table& table, std::string_view key) {
  const uint8_t* span = table.NeighbourhoodOf(table.HomeOf(key));
  return FindInNeighbourhood(Snapshot(span, kNeighbourhoodBytes), key);
}

TEST(RoundTrip, GeneratedTraceBuildsAndEveryKeyIsFound) {
  for (bool zipfian : {false, true}) {
    const std::string trace = TmpPath(zipfian ? "zipf.txt" : "uniform.txt");
    bench::TraceOptions options;
    options.records = 20000;
    options.operations = 5000;
    options.zipfian = zipfian;
    options.read_proportion = 0.5;
    options.update_proportion = 0.3;
    options.insert_proportion = 0.2;
    bench::TraceCounts counts;
    {
      std::ofstream out(trace);
      ASSERT_TRUE(bench::WriteTrace(options, out, &counts).ok());
    }
    EXPECT_GT(counts.inserts, options.records);
    EXPECT_GT(counts.reads, 0u);
    EXPECT_GT(counts.updates, 0u);

    BuildOptions build;
    build.traces = {trace};
    build.out = TmpPath("roundtrip.hop");
    absl::StatusOr<BuildSummary> summary = BuildTable(build);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->keys, counts.inserts);  // YCSB's key names do not collide
    EXPECT_EQ(summary->home_buckets, 32768u);  // 21k keys at <= 80%
    EXPECT_LE(summary->load, 0.8);
    EXPECT_EQ(summary->bytes, FileBytes(32768));
    EXPECT_EQ(summary->lines, counts.inserts + counts.reads + counts.updates);

    absl::StatusOr<Table> table = Table::Open(build.out, /*writable=*/false);
    ASSERT_TRUE(table.ok()) << table.status();
    EXPECT_EQ(table->items(), counts.inserts);
    ASSERT_TRUE(table->CheckInvariants().ok()) << table->CheckInvariants();
    absl::StatusOr<TraceFile> file = TraceFile::Open(trace);
    ASSERT_TRUE(file.ok());
    TraceRecord record;
    uint64_t checked = 0;
    while (*file->Next(&record)) {  // load and run phase: INSERT, READ and UPDATE keys
      const LookupResult r = ReadLike(*table, record.key);
      ASSERT_EQ(r.kind, Kind::kFound) << record.key << " line " << file->line();
      EXPECT_EQ(r.value, ExpectedValue(record.key));
      ++checked;
    }
    EXPECT_EQ(checked, summary->lines);
    for (int i = 0; i < 2000; ++i) {
      EXPECT_EQ(ReadLike(*table, absl::StrFormat("user%d", i)).kind, Kind::kMiss);
    }
  }
}

// Sharded builds: each of three tables holds exactly the keys ServerOf routes to it, together
// every key once, and says which shard it is.
TEST(RoundTrip, ShardedBuildsPartitionTheKeys) {
  const std::string trace = TmpPath("sharded.txt");
  bench::TraceOptions options;
  options.records = 6000;
  options.operations = 0;
  bench::TraceCounts counts;
  {
    std::ofstream out(trace);
    ASSERT_TRUE(bench::WriteTrace(options, out, &counts).ok());
  }
  constexpr uint32_t kShards = 3;
  std::vector<Table> tables;
  uint64_t keys = 0;
  for (uint32_t shard = 0; shard < kShards; ++shard) {
    BuildOptions build;
    build.traces = {trace};
    build.out = TmpPath(absl::StrFormat("shard%u.hop", shard));
    build.shard = shard;
    build.shards = kShards;
    absl::StatusOr<BuildSummary> summary = BuildTable(build);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_GT(summary->keys, counts.inserts / kShards * 8 / 10);  // a fair share each
    keys += summary->keys;
    absl::StatusOr<Table> table = Table::Open(build.out, /*writable=*/false);
    ASSERT_TRUE(table.ok()) << table.status();
    EXPECT_EQ(table->sharding().shard, shard);
    EXPECT_EQ(table->sharding().shards, kShards);
    tables.push_back(*std::move(table));
  }
  EXPECT_EQ(keys, counts.inserts);
  absl::StatusOr<TraceFile> file = TraceFile::Open(trace);
  ASSERT_TRUE(file.ok());
  TraceRecord record;
  while (*file->Next(&record)) {
    const uint32_t owner = ServerOf(record.key, kShards);
    for (uint32_t shard = 0; shard < kShards; ++shard) {
      EXPECT_EQ(ReadLike(tables[shard], record.key).kind,
                shard == owner ? Kind::kFound : Kind::kMiss)
          << record.key << " shard " << shard;
    }
  }
  BuildOptions bad;
  bad.traces = {trace};
  bad.out = TmpPath("badshard.hop");
  bad.shard = 2;
  bad.shards = 2;
  absl::StatusOr<BuildSummary> refused = BuildTable(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("shard 2 of 2"), std::string::npos) << refused.status();
}

// YCSB's own output: banner and status lines, ten 100-byte fields, a repeated key, and two
// files (load, run).
TEST(RoundTrip, YcsbOutputFilesWithFieldData) {
  const std::string load = TmpPath("load.txt"), run = TmpPath("run.txt");
  {
    std::ofstream out(load);
    out << "YCSB Client 0.17.0\nLoading workload...\nStarting test.\n";
    for (int i = 0; i < 50; ++i) {
      out << "INSERT usertable user" << i << " [ ";
      for (int f = 9; f >= 0; --f) {
        out << "field" << f << "=" << std::string(100, static_cast<char>('A' + (i + f) % 26))
            << " ";
      }
      out << "]\n";
    }
    out << "[OVERALL], RunTime(ms), 12\n[INSERT], Operations, 50\n";
  }
  {
    std::ofstream out(run);
    out << "READ usertable user3 [ <all fields>]\nINSERT usertable user3 [ field0=new value ]\n"
        << "INSERT usertable fresh [ <all fields>]\n";
  }
  BuildOptions build;
  build.traces = {load, run};
  build.out = TmpPath("ycsb.hop");
  absl::StatusOr<BuildSummary> summary = BuildTable(build);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->keys, 51u);
  EXPECT_EQ(summary->updates, 1u);
  EXPECT_EQ(summary->skipped_lines, 5u);
  absl::StatusOr<Table> table = Table::Open(build.out, false);
  ASSERT_TRUE(table.ok());
  for (int i = 0; i < 50; ++i) {
    if (i == 3) continue;
    Value want;
    std::memset(want.data(), 'A' + (i + 9) % 26, kValueBytes);  // field9 is listed first
    EXPECT_EQ(ReadLike(*table, absl::StrFormat("user%d", i)).value, want) << i;
  }
  Value updated{};
  std::memcpy(updated.data(), "new value", 9);
  EXPECT_EQ(ReadLike(*table, "user3").value, updated);
  EXPECT_EQ(ReadLike(*table, "fresh").value, ExpectedValue("fresh"));
}

TEST(RoundTrip, BuildErrorsNameTheirCause) {
  const std::string trace = TmpPath("small.txt");
  {
    std::ofstream out(trace);
    bench::TraceOptions options;
    options.records = 200;
    options.operations = 0;
    bench::TraceCounts counts;
    ASSERT_TRUE(bench::WriteTrace(options, out, &counts).ok());
    out << "INSERT usertable\n";
  }
  BuildOptions build;
  build.traces = {trace};
  build.out = TmpPath("small.hop");
  build.home_buckets = 64;  // 200 keys cannot fit
  absl::StatusOr<BuildSummary> full = BuildTable(build);
  ASSERT_TRUE(absl::IsResourceExhausted(full.status())) << full.status();
  EXPECT_NE(full.status().message().find("try --buckets 128"), std::string::npos) << full.status();
  build.home_buckets = 0;
  absl::StatusOr<BuildSummary> bad = BuildTable(build);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(trace + ":201: INSERT without a key"), std::string::npos)
      << bad.status();
  build.traces = {TmpPath("missing.txt")};
  EXPECT_FALSE(BuildTable(build).ok());
  // A trace with no INSERT line builds nothing: an error, and no table file left behind.
  const std::string reads_only = TmpPath("reads_only.txt");
  {
    std::ofstream out(reads_only);
    out << "READ usertable user1 [ ]\n";
  }
  build.traces = {reads_only};
  build.out = TmpPath("empty.hop");
  absl::StatusOr<BuildSummary> empty = BuildTable(build);
  ASSERT_TRUE(absl::IsInvalidArgument(empty.status())) << empty.status();
  EXPECT_NE(empty.status().message().find("no INSERT line"), std::string::npos);
  EXPECT_FALSE(std::ifstream(build.out).good());
}

}  // namespace
}  // namespace hopscotch
