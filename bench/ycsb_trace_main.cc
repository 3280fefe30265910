// ycsb_trace: writes a YCSB text trace (load phase, then operations) without Java; see
// bench/ycsb_trace_gen.h for what it writes. hop_build reads it, as it reads YCSB's own output.
//
//   ycsb_trace --records N --operations M --distribution uniform|zipfian --out FILE
//              [--read_proportion 1.0 --update_proportion 0 --insert_proportion 0] [--seed S]
//
// Prints one JSON line: {"out":..,"records":..,"operations":..,"inserts":..,"reads":..,
// "updates":..}.
#include <cstdio>
#include <fstream>
#include <string>

#include "bench/ycsb_trace_gen.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

DEFINE_uint64(records, 1000, "Load phase: INSERT lines (record numbers 0..N-1).");
DEFINE_uint64(operations, 1000, "Run phase: operation lines.");
DEFINE_string(distribution, "uniform", "Key choice of READ/UPDATE: uniform or zipfian.");
DEFINE_string(out, "", "Trace file to write.");
DEFINE_double(read_proportion, 1.0, "Share of READ operations.");
DEFINE_double(update_proportion, 0, "Share of UPDATE operations.");
DEFINE_double(insert_proportion, 0, "Share of INSERT operations (new records).");
DEFINE_uint64(seed, 1, "Seed of the operation and key choices.");
DEFINE_string(table, "usertable", "YCSB table name written on every line.");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("ycsb_trace --records N --operations M --out FILE");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_out.empty()) {
    std::fprintf(stderr, "ycsb_trace: --out is required\n");
    return 1;
  }
  if (FLAGS_distribution != "uniform" && FLAGS_distribution != "zipfian") {
    std::fprintf(stderr, "ycsb_trace: --distribution must be uniform or zipfian\n");
    return 1;
  }
  std::ofstream out(FLAGS_out);
  if (!out) {
    std::fprintf(stderr, "ycsb_trace: cannot write %s\n", FLAGS_out.c_str());
    return 1;
  }
  bench::TraceOptions options;
  options.records = FLAGS_records;
  options.operations = FLAGS_operations;
  options.zipfian = FLAGS_distribution == "zipfian";
  options.read_proportion = FLAGS_read_proportion;
  options.update_proportion = FLAGS_update_proportion;
  options.insert_proportion = FLAGS_insert_proportion;
  options.seed = FLAGS_seed;
  options.table = FLAGS_table;
  bench::TraceCounts counts;
  if (absl::Status s = bench::WriteTrace(options, out, &counts); !s.ok()) {
    std::fprintf(stderr, "ycsb_trace: %s: %s\n", FLAGS_out.c_str(),
                 std::string(s.message()).c_str());
    return 1;
  }
  out.close();
  if (!out) {
    std::fprintf(stderr, "ycsb_trace: %s: write failed\n", FLAGS_out.c_str());
    return 1;
  }
  std::printf(
      "{\"out\":\"%s\",\"records\":%lu,\"operations\":%lu,\"inserts\":%lu,\"reads\":%lu,"
      "\"updates\":%lu}\n",
      FLAGS_out.c_str(), FLAGS_records, FLAGS_operations, counts.inserts, counts.reads,
      counts.updates);
  return 0;
}
