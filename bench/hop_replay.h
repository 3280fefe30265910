// Replaying a YCSB trace's lookups against hop_servers, checked (what hop_client runs).
//
// The traces' INSERT lines say what each key's value must be (the last one of a key wins); the
// READ lines are the lookups, dealt round-robin to `threads` threads, each with its own
// hopscotch::Client (its own device, CQ and QPs) keeping `window` lookups in flight. Every
// found value is compared with its expectation; a READ of a key no INSERT line named must miss.
// The other operations (UPDATE, SCAN, ...) are not replayed.
#ifndef HERD_BENCH_HOP_REPLAY_H_
#define HERD_BENCH_HOP_REPLAY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hopscotch/client.h"
#include "transport/types.h"

namespace bench {

struct ReplayOptions {
  hopscotch::ClientOptions client;  // servers, device, window...
  std::vector<std::string> traces;  // load phase first
  uint32_t threads = 1;
  uint32_t passes = 1;    // times each thread replays its share (when duration_s is 0)
  double duration_s = 0;  // > 0: each thread replays its share again and again this long
  // Called by each thread once its client has joined every server (tests: the moment a server
  // may go away and the replay must count failed lookups rather than fail to connect).
  std::function<void()> on_joined;
};

struct ReplayResult {
  uint32_t threads = 0, servers = 0, window = 0;
  uint64_t lookups = 0;
  double seconds = 0;
  double mops = 0;
  double p50_us = 0, p99_us = 0;
  uint64_t found = 0, misses = 0;
  uint64_t expected_misses = 0;  // misses of keys no INSERT line named (correct)
  uint64_t wrong_values = 0;     // found with a value other than the expected one
  uint64_t false_misses = 0;     // a key an INSERT line named was not found
  uint64_t unexpected_hits = 0;  // a key no INSERT line named was found
  uint64_t torn = 0, failed = 0;
  uint64_t reads = 0, rereads = 0, confirm_reads = 0;
  transport::CounterSnapshot fabric;  // every thread's client device, summed
  bool passed() const {
    return wrong_values == 0 && false_misses == 0 && unexpected_hits == 0 && torn == 0 &&
           failed == 0 && lookups > 0;
  }
  std::string ToJson() const;
};

absl::StatusOr<ReplayResult> ReplayLookups(const ReplayOptions& options);

}  // namespace bench

#endif  // HERD_BENCH_HOP_REPLAY_H_
