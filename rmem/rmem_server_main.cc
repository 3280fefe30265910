// rmem_server: a remote-memory pool served to clients over the fabric (rmem/server.h).
//   rmem_server --pool_bytes 1073741824 [--pool_file /var/lib/rmem.pool] [--port 31870]
// A --pool_file that exists is reopened (and a transaction its last server committed but did not
// finish is applied); without one the pool lives in memory (hugepages when reserved). Prints
// "rmem_server ready port=P ..." once clients can join, and its stats JSON when it stops
// (SIGINT/SIGTERM or --duration_s).
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "rmem/server.h"
#include "transport/flags.h"
#include "util/server_process.h"

DEFINE_uint64(pool_bytes, 0,
              "The pool's data bytes (a multiple of 64). Required unless --pool_file exists.");
DEFINE_string(pool_file, "",
              "A file holding the pool, so its contents outlive the server (reopened if it "
              "exists); empty: the pool lives in memory.");
DEFINE_bool(pool_hugepages, true, "A pool in memory: use 2 MiB pages when the kernel has them.");
DEFINE_uint32(max_regions, rmem::kDefaultMaxRegions, "Regions a new pool can hold.");
DEFINE_uint32(max_pool_clients, rmem::kDefaultMaxClients,
              "Client identities a new pool records (the least recently used one not connected "
              "is forgotten when full).");
DEFINE_uint32(max_ops, rmem::kDefaultMaxOps, "Queued ops one transaction may hold (new pool).");
DEFINE_uint32(port, 31870, "Port clients join on; 0: any.");
DEFINE_string(listen_address, "0.0.0.0", "Address to listen on.");
DEFINE_uint64(max_clients, rmem::kDefaultServerClients, "Clients connected at once.");
DEFINE_double(duration_s, 0, "Stop after this many seconds (0: run until SIGINT/SIGTERM).");

namespace {

// How long one serving step runs before it checks for signals.
constexpr absl::Duration kStepTimeout = absl::Milliseconds(50);

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "rmem_server: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("rmem_server --pool_bytes N [--pool_file PATH] [--port P]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  sigset_t stop_signals = util::BlockStopSignals();
  util::RaiseFileLimit();

  if (FLAGS_port > 65535) return Fail(absl::InvalidArgumentError("--port must be <= 65535"));
  rmem::ServerOptions options;
  options.pool.path = FLAGS_pool_file;
  options.pool.pool_bytes = FLAGS_pool_bytes;
  options.pool.hugepages = FLAGS_pool_hugepages;
  options.pool.max_regions = FLAGS_max_regions;
  options.pool.max_clients = FLAGS_max_pool_clients;
  options.pool.max_ops = FLAGS_max_ops;
  options.listen_address = FLAGS_listen_address;
  options.port = static_cast<uint16_t>(FLAGS_port);
  options.max_clients = FLAGS_max_clients;
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  if (!device.ok()) return Fail(device.status());
  options.device = *device;
  absl::StatusOr<std::unique_ptr<rmem::Server>> server = rmem::Server::Create(options);
  if (!server.ok()) return Fail(server.status());
  const rmem::Pool& pool = (*server)->pool();
  std::printf(
      "rmem_server ready port=%u device=%s pool_bytes=%lu pool_file=%s regions=%u "
      "replayed=%s\n",
      (*server)->port(), options.device.name.c_str(), pool.data_bytes(),
      options.pool.path.empty() ? "(memory)" : options.pool.path.c_str(), pool.stats().regions,
      pool.stats().replayed ? "true" : "false");
  std::fflush(stdout);

  util::ServeUntilStopped(stop_signals, absl::Seconds(FLAGS_duration_s),
                          [&] { (*server)->Step(kStepTimeout); });
  std::printf("%s\n", (*server)->StatsJson().c_str());
  std::fflush(stdout);
  return 0;
}
