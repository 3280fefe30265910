// hop_client: one-sided hopscotch lookups of a YCSB trace against hop_servers, every value
// checked (bench/hop_replay.h). Prints one JSON line; exits 1 when a lookup was wrong.
//   hop_client --servers h1:31860,h2:31860 --trace load.txt,run.txt --threads 2 [--window 16]
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "bench/hop_replay.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "transport/flags.h"

DEFINE_string(servers, "", "host:port of every shard's hop_server, comma-separated.");
DEFINE_string(trace, "",
              "YCSB text trace(s), comma-separated: INSERT lines give the expected "
              "values, READ lines are the lookups.");
DEFINE_uint32(threads, 1, "Client threads (each its own device, CQ and QP per server).");
DEFINE_uint32(window, hopscotch::kDefaultWindow, "Lookups in flight per thread.");
DEFINE_uint32(passes, 1, "Times each thread replays its share of the lookups.");
DEFINE_double(duration_s, 0, "> 0: replay again and again for this long instead of --passes.");
DEFINE_bool(confirm_misses, true, "Confirm every miss with a second READ.");

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "hop_client: %s\n", std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("hop_client --servers H:P[,H:P] --trace FILE[,FILE] --threads N");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_servers.empty() || FLAGS_trace.empty()) {
    return Fail(absl::InvalidArgumentError("--servers and --trace are required"));
  }
  bench::ReplayOptions options;
  options.client.servers = absl::StrSplit(FLAGS_servers, ',', absl::SkipEmpty());
  options.client.window = FLAGS_window;
  options.client.confirm_misses = FLAGS_confirm_misses;
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  if (!device.ok()) return Fail(device.status());
  options.client.device = *device;
  absl::StatusOr<transport::ConnectMode> connect = transport::ConnectModeFromFlags();
  if (!connect.ok()) return Fail(connect.status());
  options.client.connect = *connect;
  options.traces = absl::StrSplit(FLAGS_trace, ',', absl::SkipEmpty());
  options.threads = FLAGS_threads;
  options.passes = FLAGS_passes;
  options.duration_s = FLAGS_duration_s;
  absl::StatusOr<bench::ReplayResult> result = bench::ReplayLookups(options);
  if (!result.ok()) return Fail(result.status());
  std::printf("%s\n", result->ToJson().c_str());
  return result->passed() ? 0 : 1;
}
