#include "hopscotch/build.h"

#include <bit>
#include <chrono>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "hopscotch/table.h"
#include "hopscotch/table_output.h"
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
  // Before any work: a path in use is refused now, not after the build.
  absl::StatusOr<TableOutput> output = TableOutput::Prepare(o.out, o.table.lock);
  if (!output.ok()) return output.status();
  // A failed build of a regular file leaves it as it was (the temporary goes with `output`); a
  // device was zeroed from its first byte and its header is left unmade.
  auto failed = [&](const absl::Status& s) {
    if (!output->in_place()) return s;
    return absl::Status(
        s.code(), absl::StrFormat("%s; %s now holds no table (its header is left unmade, so that "
                                  "nothing serves a partial one) until a build succeeds",
                                  s.message(), o.out));
  };
  BuildSummary summary;
  summary.home_buckets = o.home_buckets;
  if (summary.home_buckets == 0) {
    absl::StatusOr<uint64_t> inserts = CountInserts(o.traces, sharding);
    if (!inserts.ok()) return inserts.status();
    const auto wanted =
        static_cast<uint64_t>(std::ceil(static_cast<double>(*inserts) / o.target_load));
    summary.home_buckets = std::bit_ceil(std::max<uint64_t>(wanted, 1));
  }
  TableOptions table_options = o.table;
  table_options.defer_header = true;  // a table only once Publish says it is complete
  absl::StatusOr<Table> table =
      Table::Create(output->build_path(), summary.home_buckets, o.seed, sharding, table_options);
  if (!table.ok()) {
    // Refused before a device was touched. Its message names the temporary, a name the user
    // never gave: name --out instead.
    return absl::Status(
        table.status().code(),
        absl::StrReplaceAll(table.status().message(), {{output->build_path(), o.out}}));
  }
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
  if (!built.ok()) return failed(built);
  if (table->items() == 0) {  // an error, not an empty table reported as a success
    return failed(absl::InvalidArgumentError(
        "no INSERT line in the trace(s): nothing to build (is the load phase missing?)"));
  }
  summary.keys = table->items();
  summary.load = static_cast<double>(summary.keys) / static_cast<double>(summary.home_buckets);
  summary.max_displacement = table->stats().max_distance;
  summary.moves = table->stats().moves;
  summary.updates = table->stats().updates;
  summary.bytes = table->file_bytes();
  summary.map_sync = table->map_sync();
  if (absl::Status s = table->Publish(); !s.ok()) return failed(s);
  if (absl::Status s = output->Commit(); !s.ok()) return s;
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

}  // namespace hopscotch
