// hop_server: serves a hopscotch table file (hop_build's output) to one-sided readers.
//   hop_server --table /tmp/ycsb.hop [--port 31860] [--read_only] [--fabric ... --connect ...]
// Prints "hop_server ready port=P ..." once clients can join, and its stats JSON when it stops
// (SIGINT/SIGTERM or --duration_s); the table is closed clean then.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "hopscotch/server.h"
#include "transport/flags.h"
#include "util/server_process.h"

DEFINE_string(table, "", "The table file to serve (hop_build --out).");
DEFINE_uint32(port, 31860, "Port clients join on (TCP, or RDMA-CM with --connect=cm); 0: any.");
DEFINE_string(listen_address, "0.0.0.0", "Address to listen on.");
DEFINE_bool(read_only, false,
            "Map the table read-only and refuse upserts (read-only servers may share a table "
            "file; a writable one holds it alone).");
DEFINE_string(persistence, "process",
              "What an acknowledged upsert survives: process (kill -9 of this server) or power "
              "(a power failure: a cache-line flush, or an msync on a page-cache file, per "
              "ordering step of each insert).");
DEFINE_uint64(max_clients, hopscotch::kDefaultMaxClients, "Client connections at once.");
DEFINE_double(duration_s, 0, "Stop after this many seconds (0: run until SIGINT/SIGTERM).");

namespace {

// How long one serving step waits for control traffic before it checks for signals.
constexpr absl::Duration kStepTimeout = absl::Milliseconds(50);

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "hop_server: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("hop_server --table PATH [--port P] [--read_only]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  // Signals are taken synchronously by this thread only (sigtimedwait), never by workers.
  sigset_t stop_signals = util::BlockStopSignals();
  util::RaiseFileLimit();

  if (FLAGS_table.empty()) return Fail(absl::InvalidArgumentError("--table is required"));
  if (FLAGS_port > 65535) return Fail(absl::InvalidArgumentError("--port must be <= 65535"));
  hopscotch::ServerOptions options;
  options.table = FLAGS_table;
  options.read_only = FLAGS_read_only;
  options.listen_address = FLAGS_listen_address;
  options.port = static_cast<uint16_t>(FLAGS_port);
  options.max_clients = FLAGS_max_clients;
  absl::StatusOr<hopscotch::Persistence> persistence =
      hopscotch::ParsePersistence(FLAGS_persistence);
  if (!persistence.ok()) return Fail(persistence.status());
  options.persistence = *persistence;
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  if (!device.ok()) return Fail(device.status());
  options.device = *device;
  absl::StatusOr<transport::ConnectMode> connect = transport::ConnectModeFromFlags();
  if (!connect.ok()) return Fail(connect.status());
  options.connect = *connect;
  absl::StatusOr<std::unique_ptr<hopscotch::Server>> server = hopscotch::Server::Create(options);
  if (!server.ok()) return Fail(server.status());
  const hopscotch::Table& table = (*server)->table();
  std::printf(
      "hop_server ready port=%u connect=%s device=%s home_buckets=%lu items=%lu shard=%u "
      "shards=%u map_sync=%s read_only=%s persistence=%s\n",
      (*server)->port(), options.connect == transport::ConnectMode::kCm ? "cm" : "tcp",
      options.device.name.c_str(), table.home_buckets(), table.items(), table.sharding().shard,
      table.sharding().shards, table.map_sync() ? "true" : "false",
      options.read_only ? "true" : "false",
      std::string(hopscotch::PersistenceName(table.persistence())).c_str());
  std::fflush(stdout);

  util::ServeUntilStopped(stop_signals, absl::Seconds(FLAGS_duration_s),
                          [&] { (*server)->Step(kStepTimeout); });
  std::printf("%s\n", (*server)->StatsJson().c_str());
  std::fflush(stdout);
  server->reset();  // closes the table clean
  return 0;
}
