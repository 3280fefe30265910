// A YCSB trace without Java: a load phase of `records` INSERT lines, then `operations` lines of
// READ / UPDATE / INSERT, in the exact text YCSB's BasicDB prints (hopscotch/ycsb_trace.h).
// Keys are YCSB's (hopscotch::YcsbKeyName: "user" + FNV-64 of the record number). Field data is
// one field, field0 = hopscotch::ExpectedValue(key), for INSERT and UPDATE alike, so every value
// a table built from the trace holds is checkable from its key (YCSB itself writes ten random
// 100-byte fields). Run-phase INSERTs take the next record numbers, as YCSB's
// transactioninsertkeysequence does; READ and UPDATE pick a record number uniformly from the
// load phase's records, or Zipfian (YCSB's scrambled Zipfian, theta 0.99, over the records plus
// twice the expected inserts, re-drawn while it names a record not inserted yet).
#ifndef HERD_BENCH_YCSB_TRACE_GEN_H_
#define HERD_BENCH_YCSB_TRACE_GEN_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace bench {

struct TraceOptions {
  uint64_t records = 1000;
  uint64_t operations = 1000;
  bool zipfian = false;
  double read_proportion = 1.0;
  double update_proportion = 0;
  double insert_proportion = 0;
  uint64_t seed = 1;
  std::string table = "usertable";
};

struct TraceCounts {
  uint64_t inserts = 0;  // load + run
  uint64_t reads = 0;
  uint64_t updates = 0;
};

// Writes the trace; InvalidArgument for proportions that are negative or sum to 0 (they are
// normalized, as YCSB's DiscreteGenerator does).
absl::Status WriteTrace(const TraceOptions& options, std::ostream& out, TraceCounts* counts);

}  // namespace bench

#endif  // HERD_BENCH_YCSB_TRACE_GEN_H_
