// herd_server: serves GET/PUT/DELETE/CAS until SIGINT/SIGTERM (or --duration_s), printing
// per-second progress to stderr. Its first stdout line, "herd_server ready port=N", says it
// accepts clients (scripts wait for it instead of sleeping).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdio>
#include <ctime>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/flags.h"
#include "herd/replication/configuration.h"
#include "herd/server.h"
#include "mica/flags.h"
#include "mica/item.h"
#include "transport/flags.h"
#include "util/server_process.h"

DEFINE_uint32(port, 31850,
              "Port clients join on: TCP, or RDMA-CM with --connect=cm (0 picks a free one)");
DEFINE_string(listen_address, "0.0.0.0",
              "Address clients join on (--connect=cm: an address of the RDMA interface)");
DEFINE_string(worker_cores, "", "Cores for the workers, e.g. 0,2,4-7 (default: NIC's node)");
DEFINE_bool(pin_workers, true, "Pin each worker to its own core with hwloc");
DEFINE_double(duration_s, 0, "Stop after this many seconds (0: run until SIGINT/SIGTERM)");
DEFINE_string(role, "none",
              "Replication: none (a server alone), primary (mirrors every write to --backups "
              "before acknowledging it) or backup (takes a primary's writes, serves GETs)");
DEFINE_string(backups, "",
              "--role=primary: the backups' replication ports, HOST:PORT[,HOST:PORT...]");
DEFINE_uint32(replication_port, 31851,
              "--role=backup: the TCP port a primary attaches on (0 picks a free one)");
DEFINE_uint64(replication_staging_bytes, uint64_t{8} << 20,
              "Replication: each worker's staging ring on the primary and redo area on each "
              "backup (must match on both); a batch's changed bytes may take a third of it");
DEFINE_uint32(replication_stall_ms, 500,
              "--role=primary: drop a backup whose oldest replication WRITE has not completed "
              "for this long (0: never)");
DEFINE_bool(hold_unreplicated_reads, true,
            "Primary: a GET that read a write not yet at every live backup is answered once it "
            "is (false: at once, and a failover may take back a write a reader saw)");
DEFINE_string(coordinator, "",
              "Coordinated replication: the ZooKeeper server(s), HOST:PORT[,...] (scripts/zk.sh "
              "starts one). The cluster's configuration lives there; failover is automatic");
DEFINE_string(cluster, "herd", "--coordinator: the cluster's name");
DEFINE_string(member, "", "--coordinator: this server's name in the cluster (unique)");
DEFINE_string(advertise_host, "127.0.0.1",
              "--coordinator: the host other members and clients reach this server at");
DEFINE_uint32(advertise_replication_port, 0,
              "--coordinator: the replication port other members dial, when not the one listened "
              "on (a port forward, a proxy); 0: --replication_port");
DEFINE_bool(auto_failover, true,
            "--coordinator, --role=backup: take over when the primary's session ends");
DEFINE_uint32(session_timeout_ms, 2000,
              "--coordinator: the coordination session's timeout (a dead primary is replaced "
              "about this long after it died)");
DEFINE_uint32(read_lease_ms, 500,
              "--coordinator: a backup serves GETs this long after its primary last renewed its "
              "lease; a write waits at most this long for a backup that stops answering");
DEFINE_bool(rejoin_when_fenced, true,
            "--coordinator: a primary that was fenced (another member took over, or its "
            "coordination session expired) keeps its copy until the stored configuration names "
            "another primary and that primary is live, then stops and starts again in this "
            "process as a backup under the same --member and client port, brought up to date by "
            "state transfer; false: it serves nothing until restarted");

namespace {

// How often a fenced primary tries again to come back as a backup (--rejoin_when_fenced), and
// how often it looks for a stop signal while a try runs.
constexpr absl::Duration kRejoinRetry = absl::Seconds(1);
constexpr absl::Duration kRejoinPoll = absl::Milliseconds(50);

// A fenced primary's next life (--rejoin_when_fenced), begun once another member took over: a
// backup server under the same member name. Server::Create connects, registers and listens
// (seconds when the coordinator is slow; a name another live session holds keeps it out for a
// session timeout), so it runs on a thread of its own while this one answers stop signals: a
// stop meanwhile ends the process at once (it holds nothing yet, nor anyone's data). A failed try
// (the coordinator unreachable from a partitioned member, the name or the port taken) is tried
// again every kRejoinRetry, a stop between tries returning Cancelled; a client port taken by
// someone else falls back to any free one.
absl::StatusOr<std::unique_ptr<herd::Server>> RejoinAsBackup(herd::ServerOptions& options,
                                                             const sigset_t& stop_signals) {
  while (true) {
    absl::StatusOr<std::unique_ptr<herd::Server>> server = absl::UnknownError("not created");
    std::atomic<bool> created{false};
    // The stop signals stay blocked in it (inherited): this thread alone takes them.
    std::thread creator([&] {
      server = herd::Server::Create(options);
      created.store(true, std::memory_order_release);
    });
    const timespec poll = absl::ToTimespec(kRejoinPoll);
    while (!created.load(std::memory_order_acquire)) {
      if (const int signal = sigtimedwait(&stop_signals, nullptr, &poll); signal > 0) {
        LOG(INFO) << "signal " << signal << " while rejoining: exiting";
        fflush(stdout);
        google::FlushLogFiles(google::INFO);
        _exit(0);  // the half-made server holds nothing to save, nor anyone's data
      }
    }
    creator.join();
    if (server.ok()) return server;
    LOG(WARNING) << "not rejoined yet (tried again in " << kRejoinRetry << "): " << server.status();
    if (server.status().message().find("in use") != std::string::npos && options.port != 0) {
      LOG(WARNING) << "client port " << options.port << " is taken: rejoining on a free one";
      options.port = 0;
    }
    const timespec retry = absl::ToTimespec(kRejoinRetry);
    if (sigtimedwait(&stop_signals, nullptr, &retry) > 0) {
      LOG(INFO) << "stop signal while rejoining: exiting";
      return absl::CancelledError("stopped while rejoining");
    }
  }
}

int Fail(const absl::Status& status) {
  LOG(ERROR) << status;
  fprintf(stderr, "herd_server: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("herd key-value server: see README.md for the knobs");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  // Signals are taken synchronously by this thread only (sigtimedwait), never by workers.
  sigset_t stop_signals = util::BlockStopSignals();
  util::RaiseFileLimit();

  herd::ServerOptions options;
  absl::StatusOr<herd::Config> config = herd::ConfigFromFlags();
  if (!config.ok()) return Fail(config.status());
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  if (!device.ok()) return Fail(device.status());
  options.config = *config;
  options.device = *device;
  absl::StatusOr<mica::PartitionConfig> store = mica::PartitionConfigFromFlags();
  if (!store.ok()) return Fail(store.status());
  options.store = *store;
  // --max_value_bytes bounds values on the wire too: those over the inline limit go out of line.
  options.config.max_value_bytes = options.store.max_value_bytes;
  absl::StatusOr<transport::ConnectMode> connect = transport::ConnectModeFromFlags();
  if (!connect.ok()) return Fail(connect.status());
  options.connect = *connect;
  options.listen_address = FLAGS_listen_address;
  if (FLAGS_port > 65535) return Fail(absl::InvalidArgumentError("--port must be <= 65535"));
  options.port = static_cast<uint16_t>(FLAGS_port);
  options.worker_cores = FLAGS_worker_cores;
  options.pin_workers = FLAGS_pin_workers;
  absl::StatusOr<transport::PagePolicy> pages = transport::PagePolicyFromFlags();
  if (!pages.ok()) return Fail(pages.status());
  options.region_pages = *pages;
  // A log shorter than the largest value's item is allowed (such writes answer NO_MEMORY); say
  // so at start rather than only in answers.
  const uint64_t largest_item = mica::ItemBytes(options.config.max_key_bytes,
                                                options.config.value_limit(), /*checksum=*/true);
  const uint64_t log_bytes = std::bit_ceil(options.store.log_bytes);  // as mica rounds it
  if (options.store.mode == mica::StoreMode::kCache && largest_item > log_bytes) {
    LOG(WARNING) << "a " << log_bytes << "-byte log (--mica_log_bytes) is shorter than the item "
                 << "of a " << options.config.value_limit() << "-byte value (" << largest_item
                 << " bytes): writes of items longer than the log are answered NO_MEMORY";
  }
  absl::StatusOr<herd::ReplicationRole> role = herd::ParseReplicationRole(FLAGS_role);
  if (!role.ok()) return Fail(role.status());
  options.replication.role = *role;
  if (!FLAGS_backups.empty()) {
    if (*role != herd::ReplicationRole::kPrimary) {
      return Fail(absl::InvalidArgumentError("--backups is for --role=primary"));
    }
    options.replication.backups = absl::StrSplit(FLAGS_backups, ',', absl::SkipEmpty());
  }
  if (FLAGS_replication_port > 65535) {
    return Fail(absl::InvalidArgumentError("--replication_port must be <= 65535"));
  }
  options.replication.port = static_cast<uint16_t>(FLAGS_replication_port);
  options.replication.listen_address = FLAGS_listen_address;
  options.replication.gate.staging_bytes = FLAGS_replication_staging_bytes;
  options.replication.gate.stall_timeout = absl::Milliseconds(FLAGS_replication_stall_ms);
  options.replication.gate.hold_unreplicated_reads = FLAGS_hold_unreplicated_reads;
  if (!FLAGS_coordinator.empty()) {
    if (FLAGS_read_lease_ms == 0 || FLAGS_session_timeout_ms == 0) {
      return Fail(
          absl::InvalidArgumentError("--read_lease_ms and --session_timeout_ms must be > 0"));
    }
    options.replication.coordinator.hosts = FLAGS_coordinator;
    options.replication.coordinator.cluster = FLAGS_cluster;
    options.replication.coordinator.session_timeout = absl::Milliseconds(FLAGS_session_timeout_ms);
    options.replication.member = FLAGS_member;
    options.replication.advertise_host = FLAGS_advertise_host;
    if (FLAGS_advertise_replication_port > 65535) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--advertise_replication_port=", FLAGS_advertise_replication_port, ": not a port")));
    }
    options.replication.advertise_replication_port =
        static_cast<uint16_t>(FLAGS_advertise_replication_port);
    options.replication.auto_failover = FLAGS_auto_failover;
    options.replication.read_lease = absl::Milliseconds(FLAGS_read_lease_ms);
  }
  absl::StatusOr<std::unique_ptr<herd::Server>> server = herd::Server::Create(options);
  if (!server.ok()) return Fail(server.status());
  if (absl::Status s = (*server)->Start(); !s.ok()) return Fail(s);
  const auto print_ready = [&options](const herd::Server& s) {
    printf(
        "herd_server ready port=%d connect=%s store_mode=%s role=%s replication_port=%d "
        "device=%s region_page_kib=%zu config=%s\n",
        s.port(), options.connect == transport::ConnectMode::kCm ? "cm" : "tcp",
        std::string(mica::StoreModeName(options.store.mode)).c_str(),
        std::string(herd::ReplicationRoleName(options.replication.role)).c_str(),
        s.replication_port(), s.device_name().c_str(), s.region_page_bytes() >> 10,
        options.config.ToJson().c_str());
    fflush(stdout);
  };
  print_ready(**server);

  herd::ServerStats last = (*server)->Stats();
  herd::ServerStats first = last;
  absl::Time start = absl::Now();  // of this life (a rejoin after a fence starts another)
  const absl::Time began = start;
  // The stored configuration's backup count a fenced primary last said it waits on (logged once
  // per change; 0: nobody can take over; -1: nothing said yet). A plain integer: GCC 12 warns of
  // a std::optional here as maybe uninitialized under -O1 (the sanitizer builds).
  int64_t fenced_wait_said = -1;
  absl::Time tick = start;
  while (true) {
    timespec second{1, 0};
    const int signal = sigtimedwait(&stop_signals, nullptr, &second);
    const absl::Time now = absl::Now();
    if (signal > 0) {
      LOG(INFO) << "signal " << signal << ": shutting down";
      break;
    }
    const herd::ServerStats stats = (*server)->Stats();
    fprintf(stderr, "progress %s\n",
            herd::StatsJson(stats, last, absl::ToDoubleSeconds(now - tick)).c_str());
    last = stats;
    tick = now;
    // A fenced primary drops its copy (to rejoin as a backup) only once another member took
    // over: until then its memory may hold acknowledged writes no other copy can serve, even
    // where the configuration lists backups (one never told it is in sync, or dropped and not
    // yet removed, cannot take over). Kept (fenced, serving nothing) meanwhile.
    if (stats.fenced && FLAGS_rejoin_when_fenced && stats.succession == herd::Succession::kNone &&
        fenced_wait_said != static_cast<int64_t>(stats.backups)) {
      fenced_wait_said = stats.backups;
      if (stats.backups == 0) {
        LOG(ERROR) << "fenced with no backup in its configuration: no member can take over, so "
                      "this server keeps its copy, serving nothing (a restart would drop it)";
      } else {
        LOG(WARNING) << "fenced: keeping this copy until one of the configuration's "
                     << stats.backups
                     << " backups takes over (one not in sync never can); then rejoining as a "
                        "backup";
      }
    }
    if (stats.fenced && FLAGS_rejoin_when_fenced &&
        stats.succession == herd::Succession::kTakenOver) {
      // This life's totals, as a stop prints them: the next life is a backup's.
      printf("{\"server\":%s}\n",
             herd::StatsJson(stats, first, absl::ToDoubleSeconds(now - start)).c_str());
      fflush(stdout);
      LOG(WARNING) << "fenced: stopping, and starting again as a backup of cluster "
                   << options.replication.coordinator.cluster << " (--rejoin_when_fenced)";
      options.port = (*server)->port();
      options.replication.role = herd::ReplicationRole::kBackup;
      if (gflags::GetCommandLineFlagInfoOrDie("replication_port").is_default) {
        options.replication.port = 0;  // a primary never listened there: any free port
      }
      (*server)->Stop();
      server->reset();  // every port, device and region let go before the next life takes them
      server = RejoinAsBackup(options, stop_signals);
      if (!server.ok()) {
        if (absl::IsCancelled(server.status())) return 0;  // a stop signal meanwhile
        return Fail(server.status());
      }
      if (absl::Status s = (*server)->Start(); !s.ok()) return Fail(s);
      print_ready(**server);
      LOG(INFO) << "rejoined cluster " << options.replication.coordinator.cluster << " as a backup";
      last = first = (*server)->Stats();
      start = tick = absl::Now();
      fenced_wait_said = -1;
    }
    if (FLAGS_duration_s > 0 && now - began >= absl::Seconds(FLAGS_duration_s)) break;
  }
  (*server)->Stop();
  printf("{\"server\":%s}\n",
         herd::StatsJson((*server)->Stats(), first, absl::ToDoubleSeconds(absl::Now() - start))
             .c_str());
  return 0;
}
