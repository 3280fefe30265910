#include "hopscotch/build.h"

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "hopscotch/table.h"
#include "hopscotch/ycsb_trace.h"

namespace hopscotch {
namespace {

// Calls visit(path, file, record) for every INSERT line of every trace, in order, until it
// returns an error; then visited(path, file) once each file is done.
template <typename Visit, typename Visited>
absl::Status ForEachInsert(const std::vector<std::string>& paths, const Sharding& sharding,
                           Visit visit, Visited visited) {
  for (const std::string& path : paths) {
    absl::StatusOr<TraceFile> file = TraceFile::Open(path);
    if (!file.ok()) return file.status();
    TraceRecord record;
    for (;;) {
      absl::StatusOr<bool> more = file->Next(&record);
      if (!more.ok()) return more.status();
      if (!*more) break;
      if (record.op != TraceOp::kInsert || !sharding.Holds(record.key)) continue;
      if (absl::Status s = visit(path, *file, record); !s.ok()) return s;
    }
    visited(*file);
  }
  return absl::OkStatus();
}

// INSERT lines across the traces: an upper bound on distinct keys.
absl::StatusOr<uint64_t> CountInserts(const std::vector<std::string>& paths,
                                      const Sharding& sharding) {
  uint64_t inserts = 0;
  absl::Status s = ForEachInsert(
      paths, sharding,
      [&](const std::string&, const TraceFile&, const TraceRecord&) {
        ++inserts;
        return absl::OkStatus();
      },
      [](const TraceFile&) {});
  if (!s.ok()) return s;
  return inserts;
}

}  // namespace

absl::StatusOr<BuildSummary> BuildTable(const BuildOptions& o) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  if (o.traces.empty()) return absl::InvalidArgumentError("no trace file");
  if (!(o.target_load > 0 && o.target_load <= 1)) {
    return absl::InvalidArgumentError("target load must be in (0, 1]");
  }
  const Sharding sharding{o.shard, o.shards};
  BuildSummary summary;
  summary.home_buckets = o.home_buckets;
  if (summary.home_buckets == 0) {
    absl::StatusOr<uint64_t> inserts = CountInserts(o.traces, sharding);
    if (!inserts.ok()) return inserts.status();
    const auto wanted =
        static_cast<uint64_t>(std::ceil(static_cast<double>(*inserts) / o.target_load));
    summary.home_buckets = std::bit_ceil(std::max<uint64_t>(wanted, 1));
  }
  absl::StatusOr<Table> table = Table::Create(o.out, summary.home_buckets, o.seed, sharding);
  if (!table.ok()) return table.status();
  absl::Status built = ForEachInsert(
      o.traces, sharding,
      [&](const std::string& path, const TraceFile& file, const TraceRecord& record) {
        absl::Status s = table->Insert(record.key, ValueFor(record));
        if (absl::IsResourceExhausted(s)) {
          const double load =
              static_cast<double>(table->items()) / static_cast<double>(summary.home_buckets);
          return absl::ResourceExhaustedError(
              absl::StrFormat("%s:%u: %s; %u keys in %u home buckets (load %.3f): try --buckets %u",
                              path, file.line(), s.message(), table->items(), summary.home_buckets,
                              load, summary.home_buckets * 2));
        }
        return s;
      },
      [&](const TraceFile& file) {
        summary.lines += file.line();
        summary.skipped_lines += file.skipped();
      });
  if (!built.ok()) return built;
  if (table->items() == 0) {
    // A run that built nothing is an error, not an empty table reported as a success. Only a
    // regular file is removed: a device-DAX output is a device node, never unlinked.
    const bool device = table->device();
    (void)table->Close();
    if (!device) std::remove(o.out.c_str());
    return absl::InvalidArgumentError(
        "no INSERT line in the trace(s): nothing to build (is the load phase missing?)");
  }
  summary.keys = table->items();
  summary.load = static_cast<double>(summary.keys) / static_cast<double>(summary.home_buckets);
  summary.max_displacement = table->stats().max_distance;
  summary.moves = table->stats().moves;
  summary.updates = table->stats().updates;
  summary.bytes = table->file_bytes();
  summary.map_sync = table->map_sync();
  if (absl::Status s = table->Close(); !s.ok()) return s;
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

}  // namespace hopscotch
