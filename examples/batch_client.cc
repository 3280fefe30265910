// Many requests in flight on one thread: Submit while the window has room, Poll for results.
// PUTs --keys keys, then GETs each and checks its value.
//   bazel-bin/examples/batch_client --server=127.0.0.1:31850 --keys=10000
#include <cstdio>
#include <string>
#include <vector>

#include "gflags/gflags.h"
#include "herd/client.h"
#include "transport/flags.h"

DEFINE_string(server, "127.0.0.1:31850", "host:port of the herd server's control plane");
DEFINE_uint32(keys, 10000, "keys to PUT, then GET");

int Fail(const std::string& why) {
  std::fprintf(stderr, "batch_client: %s\n", why.c_str());
  return 1;
}

// Runs `op` on keys 0..n-1 (values "v<i>") with as many requests in flight as the windows hold.
bool RunAll(herd::Client& client, herd::Op op, uint32_t n, uint64_t* mismatches) {
  std::vector<herd::Result> results(64);
  uint32_t next = 0, done = 0;
  std::string key, value;
  while (done < n) {
    for (; next < n; ++next) {  // submit until the next key's window is full
      key = "k" + std::to_string(next);
      value = op == herd::Op::kPut ? "v" + std::to_string(next) : "";
      const uint64_t hash = herd::Client::HashKey(key);
      if (!client.CanSubmit(/*client=*/0, hash)) break;
      if (!client.Submit(0, op, key, hash, value, 0, /*tag=*/next).ok()) return false;
    }
    const size_t got = client.Poll(absl::MakeSpan(results));  // posts, then delivers
    for (size_t i = 0; i < got; ++i, ++done) {
      const herd::Result& r = results[i];
      if (r.status != herd::Status::kOk) return false;
      if (op == herd::Op::kGet && r.value != "v" + std::to_string(r.tag)) ++*mismatches;
    }
  }
  return true;
}

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_keys == 0) return Fail("--keys must be at least 1: a run of nothing proves nothing");
  herd::ClientOptions options;
  options.server = FLAGS_server;
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  if (!device.ok()) return Fail(device.status().ToString());
  options.device = *device;
  auto client = herd::Client::Connect(options);
  if (!client.ok()) return Fail(client.status().ToString());
  uint64_t mismatches = 0;
  if (!RunAll(**client, herd::Op::kPut, FLAGS_keys, &mismatches)) return Fail("a PUT failed");
  if (!RunAll(**client, herd::Op::kGet, FLAGS_keys, &mismatches)) return Fail("a GET failed");
  const herd::ClientStats stats = (*client)->stats();
  std::printf("%u PUTs and %u GETs, %lu wrong values, %lu retransmissions\n", FLAGS_keys,
              FLAGS_keys, mismatches, stats.retransmissions);
  return mismatches == 0 ? 0 : 1;
}
