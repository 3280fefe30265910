// Building a table file from YCSB text traces: what hop_build runs (hop_build_main.cc has the
// flags). Every INSERT line's key is inserted, in order (a repeated key rewrites its value), with
// ValueFor(record); the run phase's other operations are for a client to replay, not applied.
#ifndef HERD_HOPSCOTCH_BUILD_H_
#define HERD_HOPSCOTCH_BUILD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hopscotch/table.h"

namespace hopscotch {

struct BuildOptions {
  std::vector<std::string> traces;
  // The table: a regular file, built beside it and renamed over it only on success, or a
  // device-DAX character device, written in place with its header made only on success
  // (table_output.h). Refused while another process holds it (a hop_server serving it).
  std::string out;
  uint64_t home_buckets = 0;  // 0: the smallest power of two with inserts / buckets <= load
  double target_load = 0.8;
  uint64_t seed = 0;
  // Keys sharded over `shards` servers: only the INSERT lines of keys this shard holds
  // (ServerOf) are built into the table.
  uint32_t shard = 0;
  uint32_t shards = 1;
  // How the table is created (Table::Create; defer_header is always set). Tests: a fake sysfs.
  TableOptions table;
};

struct BuildSummary {
  uint64_t keys = 0;
  uint64_t home_buckets = 0;
  double load = 0;                // keys / home buckets
  uint32_t max_displacement = 0;  // the largest distance of a key from its home bucket
  uint64_t moves = 0;
  uint64_t updates = 0;  // INSERT lines of a key already inserted
  uint64_t bytes = 0;
  uint64_t lines = 0;
  uint64_t skipped_lines = 0;  // non-operation lines
  bool map_sync = false;
  double seconds = 0;
};

// Errors: a trace that cannot be read or has a malformed line (FILE:LINE), a table file that
// cannot be written or is in use, or a full table (ResourceExhausted naming the load and a
// --buckets to try). After an error `out` is as it was (a regular file), or holds no table (a
// device: the error says so).
absl::StatusOr<BuildSummary> BuildTable(const BuildOptions& options);

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_BUILD_H_
