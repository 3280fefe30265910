// hop_build: builds a hopscotch table file from YCSB text traces (ycsb_trace.h).
//
//   hop_build --trace FILE[,FILE...] --out PATH [--buckets N] [--target_load 0.8] [--seed S]
//
// Inserts the key of every INSERT line of the traces, in order (a repeated key rewrites its
// value), with the value ValueFor(record) (ycsb_trace.h); other operations are the run phase
// a client replays later and are not applied. Without --buckets, the home bucket count is the
// smallest power of two that keeps (INSERT lines / home buckets) <= --target_load, counted in a
// first pass over the traces. Prints one JSON line:
//   {"keys":..,"buckets":..,"load":..,"max_displacement":..,"moves":..,"bytes":..,"seconds":..}
// load = keys / home buckets; max_displacement = the largest distance of a key from its home
// bucket (< H = 32). Exit status 1 with a message on stderr on any error; a full table names
// the load reached and a --buckets that would do.
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "hopscotch/table.h"
#include "hopscotch/ycsb_trace.h"

DEFINE_string(trace, "", "YCSB text trace file(s), comma-separated (load phase first).");
DEFINE_string(out, "", "Table file to write (replaced if it exists).");
DEFINE_uint64(buckets, 0, "Home buckets (a power of two); 0: derived from the key count.");
DEFINE_double(target_load, 0.8, "Largest keys / home buckets when --buckets is derived.");
DEFINE_uint64(seed, 0, "Seed of the home-bucket hash, stored in the table header.");

namespace {

using Clock = std::chrono::steady_clock;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "hop_build: %s\n", std::string(status.message()).c_str());
  return 1;
}

// INSERT lines across the traces: an upper bound on distinct keys.
absl::StatusOr<uint64_t> CountInserts(const std::vector<std::string>& paths) {
  uint64_t inserts = 0;
  for (const std::string& path : paths) {
    absl::StatusOr<hopscotch::TraceFile> file = hopscotch::TraceFile::Open(path);
    if (!file.ok()) return file.status();
    hopscotch::TraceRecord record;
    for (;;) {
      absl::StatusOr<bool> more = file->Next(&record);
      if (!more.ok()) return more.status();
      if (!*more) break;
      if (record.op == hopscotch::TraceOp::kInsert) ++inserts;
    }
  }
  return inserts;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("hop_build --trace FILE[,FILE] --out PATH [--buckets N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_trace.empty() || FLAGS_out.empty()) {
    return Fail(absl::InvalidArgumentError("--trace and --out are required"));
  }
  if (!(FLAGS_target_load > 0 && FLAGS_target_load <= 1)) {
    return Fail(absl::InvalidArgumentError("--target_load must be in (0, 1]"));
  }
  const std::vector<std::string> paths = absl::StrSplit(FLAGS_trace, ',', absl::SkipEmpty());
  const Clock::time_point start = Clock::now();

  uint64_t buckets = FLAGS_buckets;
  if (buckets == 0) {
    absl::StatusOr<uint64_t> inserts = CountInserts(paths);
    if (!inserts.ok()) return Fail(inserts.status());
    const auto wanted =
        static_cast<uint64_t>(std::ceil(static_cast<double>(*inserts) / FLAGS_target_load));
    buckets = std::bit_ceil(std::max<uint64_t>(wanted, 1));
  }
  absl::StatusOr<hopscotch::Table> table = hopscotch::Table::Create(FLAGS_out, buckets, FLAGS_seed);
  if (!table.ok()) return Fail(table.status());

  uint64_t lines = 0, skipped = 0;
  for (const std::string& path : paths) {
    absl::StatusOr<hopscotch::TraceFile> file = hopscotch::TraceFile::Open(path);
    if (!file.ok()) return Fail(file.status());
    hopscotch::TraceRecord record;
    for (;;) {
      absl::StatusOr<bool> more = file->Next(&record);
      if (!more.ok()) return Fail(more.status());
      if (!*more) break;
      if (record.op != hopscotch::TraceOp::kInsert) continue;
      absl::Status s = table->Insert(record.key, hopscotch::ValueFor(record));
      if (absl::IsResourceExhausted(s)) {
        return Fail(absl::ResourceExhaustedError(absl::StrFormat(
            "%s:%u: %s; %u keys in %u home buckets (load %.3f): try --buckets %u", path,
            file->line(), s.message(), table->items(), buckets,
            static_cast<double>(table->items()) / static_cast<double>(buckets), buckets * 2)));
      }
      if (!s.ok()) return Fail(s);
    }
    lines += file->line();
    skipped += file->skipped();
  }
  const hopscotch::TableStats stats = table->stats();
  const uint64_t keys = table->items();
  const uint64_t bytes = table->file_bytes();
  const bool map_sync = table->map_sync();
  if (absl::Status s = table->Close(); !s.ok()) return Fail(s);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "{\"keys\":%lu,\"buckets\":%lu,\"load\":%.4f,\"max_displacement\":%u,\"moves\":%lu,"
      "\"updates\":%lu,\"bytes\":%lu,\"seconds\":%.3f,\"lines\":%lu,\"skipped_lines\":%lu,"
      "\"map_sync\":%s,\"out\":\"%s\"}\n",
      keys, buckets, static_cast<double>(keys) / static_cast<double>(buckets), stats.max_distance,
      stats.moves, stats.updates, bytes, seconds, lines, skipped, map_sync ? "true" : "false",
      FLAGS_out.c_str());
  return 0;
}
