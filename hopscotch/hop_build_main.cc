// hop_build: builds a hopscotch table file from YCSB text traces (build.h, ycsb_trace.h).
//
//   hop_build --trace FILE[,FILE...] --out PATH [--buckets N] [--target_load 0.8] [--seed S]
//
// Without --buckets, the home bucket count is the smallest power of two that keeps
// (INSERT lines / home buckets) <= --target_load, counted in a first pass over the traces: at
// most 80% by default, where inserts practically never fail (H = 32), and at least 40% because
// of the rounding. Prints one JSON line:
//   {"keys":..,"buckets":..,"load":..,"max_displacement":..,"moves":..,"bytes":..,"seconds":..}
// load = keys / home buckets; max_displacement = the largest distance of a key from its home
// bucket (< H = 32). Exit status 1 with a message on stderr on any error; a full table names
// the load reached and a --buckets that would do.
//
// --out is never a partial table. A regular file is built in a temporary file beside it
// (".NAME.tmp-PID-N", same directory) and renamed over it only once complete and fsynced, so a
// failed build leaves the table that was there untouched (and removes the temporary). A
// device-DAX character device (--out /dev/dax0.0) cannot be renamed: it keeps its node and
// size, the table is written in place from its first byte and must fit (its size and alignment
// come from /sys/dev/char/MAJOR:MINOR/{size,align}), and its header is written last: after a
// failed build the device holds no table (the error says so), never a partial one. A --out a
// hop_server is serving (or another hop_build writing) is refused, before the build and again
// before the rename: stop the server first, or build to another path.
#include <cstdio>
#include <string>

#include "absl/strings/str_split.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "hopscotch/build.h"

DEFINE_string(trace, "", "YCSB text trace file(s), comma-separated (load phase first).");
DEFINE_string(out, "",
              "Table to write: a regular file (built in a temporary file beside it, renamed over "
              "it only on success) or a device-DAX character device such as /dev/dax0.0 (written "
              "in place from its first byte, header last; the table must fit in it). Refused "
              "while a hop_server serves it.");
DEFINE_uint64(buckets, 0, "Home buckets (a power of two); 0: derived from the key count.");
DEFINE_double(target_load, 0.8, "Largest keys / home buckets when --buckets is derived.");
DEFINE_uint64(seed, 0, "Seed of the home-bucket hash, stored in the table header.");
DEFINE_uint32(shards, 1, "Servers the key space is sharded over (keys routed by ServerOf).");
DEFINE_uint32(shard, 0, "Which shard this table is: only its keys are inserted (0..shards-1).");

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "hop_build --trace FILE[,FILE] --out PATH [--buckets N] [--shard I --shards N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_trace.empty() || FLAGS_out.empty()) {
    std::fprintf(stderr, "hop_build: --trace and --out are required\n");
    return 1;
  }
  hopscotch::BuildOptions options;
  options.traces = absl::StrSplit(FLAGS_trace, ',', absl::SkipEmpty());
  options.out = FLAGS_out;
  options.home_buckets = FLAGS_buckets;
  options.target_load = FLAGS_target_load;
  options.seed = FLAGS_seed;
  options.shard = FLAGS_shard;
  options.shards = FLAGS_shards;
  absl::StatusOr<hopscotch::BuildSummary> s = hopscotch::BuildTable(options);
  if (!s.ok()) {
    std::fprintf(stderr, "hop_build: %s\n", std::string(s.status().message()).c_str());
    return 1;
  }
  std::printf(
      "{\"keys\":%lu,\"buckets\":%lu,\"load\":%.4f,\"max_displacement\":%u,\"moves\":%lu,"
      "\"updates\":%lu,\"bytes\":%lu,\"seconds\":%.3f,\"lines\":%lu,\"skipped_lines\":%lu,"
      "\"shard\":%u,\"shards\":%u,\"map_sync\":%s}\n",
      s->keys, s->home_buckets, s->load, s->max_displacement, s->moves, s->updates, s->bytes,
      s->seconds, s->lines, s->skipped_lines, FLAGS_shard, FLAGS_shards,
      s->map_sync ? "true" : "false");
  return 0;
}
