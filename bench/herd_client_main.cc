// herd_client: --threads threads, each one Client hosting --clients_per_thread logical clients,
// drive a workload against a herd server. A per-second progress line goes to stderr; the last
// stdout line is one JSON result: every knob, Mops (total, per thread, per server worker), latency
// percentiles, the client's transport counters per operation, CPU time and the machine. Warm-up
// excluded.
#include <array>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/histogram.h"
#include "bench/keys.h"
#include "bench/machine.h"
#include "bench/workload.h"
#include "bench/workload_flags.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/client.h"
#include "herd/pinning.h"
#include "herd/replication/coordinator.h"
#include "mica/keyhash.h"
#include "transport/flags.h"

DEFINE_string(server, "127.0.0.1:31850", "host:port of the server's control plane");
DEFINE_string(coordinator, "",
              "A coordinated cluster's ZooKeeper, HOST:PORT[,...]: the run goes to the primary of "
              "its configuration (as found at start) instead of --server");
DEFINE_string(cluster, "herd", "--coordinator: the cluster's name");
DEFINE_double(follow_s, 30,
              "--coordinator: when the primary is lost during the run, each thread follows the "
              "member that takes over (Client::Follow: its outstanding requests carried over, "
              "none applied twice), waiting up to this long; 0: the run ends with an error");
DEFINE_uint32(threads, 1, "Client threads (each its own connection and QPs)");
DEFINE_uint32(clients_per_thread, 1, "Logical clients per thread (HERD ran many per thread)");
DEFINE_double(duration_s, 5, "Measured seconds (after the warm-up)");
DEFINE_double(warmup_s, 1, "Seconds run before measuring");
DEFINE_bool(preload, true, "PUT every key once before the run (thread t loads keys t mod T)");
DEFINE_uint32(retry_timeout_us, 20000,
              "Retransmission timeout before a round trip was measured (always, with "
              "--noadaptive_retry)");
DEFINE_bool(adaptive_retry, true,
            "Derive each worker's retransmission timeout from the round trips measured to it "
            "(srtt + 4 rttvar, at least twice the largest of the last 0.5-1 s; doubling per "
            "retransmission), within --min/max_retry_timeout_us");
DEFINE_uint32(min_retry_timeout_us, 5000, "Floor of the adaptive retransmission timeout");
DEFINE_uint32(max_retry_timeout_us, 1000000, "Ceiling of the adaptive retransmission timeout");
DEFINE_bool(batch_doorbells, true,
            "Post each loop's requests to a QP with one doorbell (HERD's client batching); false: "
            "one doorbell per request");
DEFINE_string(read_from, "primary",
              "Where GETs go when --backups is given: primary, backups (thread t reads backup "
              "t mod B) or any (thread t reads member t mod (B+1), the primary first); writes "
              "always go to --server");
DEFINE_string(
    backups, "",
    "The backups' client ports (HOST:PORT,...) of a replicated --server, for --read_from");
DEFINE_string(client_cores, "auto",
              "Cores the client threads are pinned to (hwloc): auto (the last cores of the NIC's "
              "NUMA node, clear of a local server's workers), none, or a list like 1,3-4");

namespace {

using Clock = std::chrono::steady_clock;

struct ThreadResult {
  uint64_t ops = 0, errors = 0;
  // GETs answered, and those answered NOT_FOUND: with every key preloaded, what a lossy cache
  // (--store_mode=cache) forgot, or what the workload deleted; writes answered NO_MEMORY.
  uint64_t gets = 0, get_misses = 0, no_memory = 0;
  uint64_t backup_busy = 0;  // GETs a backup answered BACKUP_BUSY (--read_from)
  uint32_t followed = 0;     // failovers this thread followed (--coordinator, --follow_s)
  double follow_s = 0;       // the longest it waited for one
  std::string read_server;   // where this thread's GETs went
  uint32_t workers = 0;      // the server's
  std::array<uint64_t, herd::kMaxWorkers> worker_ops{};  // answered by each worker
  bench::Histogram latency;
  herd::ClientStats stats;
  herd::ClientStats reader_stats;  // its connection to the server its GETs went to, if not --server
  absl::Status status;
};

// The server thread `t`'s GETs go to ("" for --server itself).
std::string ReadServerOf(uint32_t t, const std::vector<std::string>& backups) {
  if (backups.empty() || FLAGS_read_from == "primary") return "";
  if (FLAGS_read_from == "backups") return backups[t % backups.size()];
  const size_t member = t % (backups.size() + 1);  // "any": the primary, then each backup
  return member == 0 ? "" : backups[member - 1];
}

// A connection's counters over the measured window (the rest are levels, as at its end).
herd::ClientStats MeasuredWindow(const herd::ClientStats& start, const herd::ClientStats& end) {
  herd::ClientStats window = end;
  window.fabric = end.fabric.Since(start.fabric);
  window.large_puts -= start.large_puts;
  window.out_of_line_gets -= start.out_of_line_gets;
  window.item_rereads -= start.item_rereads;
  window.copied_gets -= start.copied_gets;
  return window;
}

// Adds b's counters into a (the JSON's totals).
void AddStats(const herd::ClientStats& b, herd::ClientStats* a) {
  a->submitted += b.submitted;
  a->retransmissions += b.retransmissions;
  a->absences += b.absences;
  a->holds += b.holds;
  a->timed_out += b.timed_out;
  a->send_failed += b.send_failed;
  a->stray += b.stray;
  a->torn += b.torn;
  a->large_puts += b.large_puts;
  a->out_of_line_gets += b.out_of_line_gets;
  a->item_rereads += b.item_rereads;
  a->copied_gets += b.copied_gets;
  a->retry_timeout = std::max(a->retry_timeout, b.retry_timeout);
  a->fabric.Add(b.fabric);
}

// The unit of false sharing on x86-64 (and most ARM servers).
constexpr size_t kCacheLineBytes = 64;

// A thread's completed ops: written by that thread alone (a plain store of its own count, no
// locked add), on a cache line of its own (no false sharing between threads' counters).
struct alignas(kCacheLineBytes) Progress {
  std::atomic<uint64_t> ops{0};
};

struct Shared {
  std::atomic<bool> measuring{false}, stop{false};
  std::vector<Progress> progress;  // per thread, read relaxed by the progress printer
  explicit Shared(uint32_t threads) : progress(threads) {}
};

herd::Op ToOp(bench::Operation op) {
  switch (op) {
    case bench::Operation::kGet:
      return herd::Op::kGet;
    case bench::Operation::kPut:
      return herd::Op::kPut;
    case bench::Operation::kDelete:
      return herd::Op::kDelete;
    case bench::Operation::kCas:
      return herd::Op::kCas;
  }
  return herd::Op::kGet;
}

void RunThread(uint32_t t, const herd::ClientOptions& options, const bench::WorkloadConfig& w,
               const herd::Topology& topology, int core, const std::string& read_server,
               Shared& shared, ThreadResult* out) {
  if (core >= 0) {
    if (absl::Status s = topology.PinCurrentThread(core); !s.ok()) {
      out->status = s;
      shared.stop = true;
      return;
    }
  }
  absl::StatusOr<std::unique_ptr<herd::Client>> connected = herd::Client::Connect(options);
  if (!connected.ok()) {
    out->status = connected.status();
    shared.stop = true;
    return;
  }
  // The connection in use: replaced by its follower when a failover is followed.
  std::unique_ptr<herd::Client> owned = *std::move(connected);
  herd::Client* client = owned.get();
  out->workers = client->config().workers;
  // --read_from: GETs on a connection of their own to a backup (the same logical clients).
  std::unique_ptr<herd::Client> reader_connection;
  if (!read_server.empty()) {
    herd::ClientOptions reader_options = options;
    reader_options.server = read_server;
    absl::StatusOr<std::unique_ptr<herd::Client>> reader = herd::Client::Connect(reader_options);
    if (!reader.ok()) {
      out->status = reader.status();
      shared.stop = true;
      return;
    }
    reader_connection = *std::move(reader);
  }
  herd::Client* reader = reader_connection ? reader_connection.get() : client;
  out->read_server = read_server.empty() ? options.server : read_server;
  std::vector<herd::Result> results(256);
  std::string key(w.key_bytes, '\0'), value(w.value_bytes, '\0');
  const uint32_t threads = FLAGS_threads;
  if (FLAGS_preload) {
    uint64_t next = t, tag = 0;
    while (next < w.keys || client->outstanding() > 0) {
      for (uint32_t c = 0; c < client->clients() && next < w.keys; ++c) {
        bench::MakeKey(next, w.key_bytes, key.data());
        if (!client->CanSubmit(c, mica::KeyHash(key), value.size())) continue;
        bench::MakeValue(next, 0, w.value_bytes, value.data());
        // CanSubmit said the window has room: a failure is the QP's or the server's, and final.
        if (absl::Status s = client->Submit(c, herd::Op::kPut, key, value, 0, tag++); !s.ok()) {
          out->status = s;
          break;
        }
        next += threads;
      }
      const size_t got = client->Poll(absl::MakeSpan(results));
      for (size_t i = 0; i < got; ++i) {
        if (results[i].status != herd::Status::kOk) {
          out->status = absl::UnavailableError(
              absl::StrFormat("preload PUT failed: %s", herd::StatusName(results[i].status)));
        }
      }
      if (!client->health().ok()) out->status = client->health();
      if (!out->status.ok()) shared.stop = true;
      if (shared.stop) return;
    }
  }
  bench::Workload workload(w, t);
  // Each logical client keeps its next request ready until its worker has a free slot.
  // The key's hash is computed once, when the request is drawn: CanSubmit routes it on every
  // pass until its window has room, and Submit takes it as is.
  struct Next {
    uint64_t index;
    herd::Op op;
    uint64_t keyhash;
  };
  auto draw = [&]() {
    Next next{workload.NextKey(), ToOp(workload.NextOp()), 0};
    bench::MakeKey(next.index, w.key_bytes, key.data());
    next.keyhash = mica::KeyHash(key);
    return next;
  };
  std::vector<Next> pending(client->clients());
  for (auto& p : pending) p = draw();
  uint64_t stamp = 1;
  uint64_t completed = 0;  // this thread's, published in shared.progress
  herd::ClientStats at_start, at_end, reader_at_start, reader_at_end;
  bool window_started = false, window_ended = false;
  // A failover is followed on a connection of the coordinated primary's alone (a --read_from
  // connection to a backup is not handed over): the follower carries the outstanding requests
  // and the run goes on; the window's counters of the connection left behind are kept.
  const bool may_follow = FLAGS_follow_s > 0 && !options.members.empty() && !reader_connection;
  herd::ClientStats carried;
  auto follow = [&]() -> absl::Status {
    if (window_started && !window_ended)
      AddStats(MeasuredWindow(at_start, client->stats()), &carried);
    const Clock::time_point began = Clock::now();
    absl::StatusOr<std::unique_ptr<herd::Client>> follower =
        client->Follow(absl::Seconds(FLAGS_follow_s));
    if (!follower.ok()) return follower.status();
    owned = *std::move(follower);
    client = reader = owned.get();
    if (window_started && !window_ended) at_start = client->stats();
    ++out->followed;
    out->follow_s =
        std::max(out->follow_s, std::chrono::duration<double>(Clock::now() - began).count());
    return absl::OkStatus();
  };
  while (!shared.stop.load(std::memory_order_relaxed)) {
    if (may_follow && !client->health().ok()) {
      if (absl::Status s = follow(); !s.ok()) {
        out->status = s;
        shared.stop = true;
        break;
      }
    }
    for (uint32_t c = 0; c < client->clients(); ++c) {
      Next& p = pending[c];
      herd::Client& to = p.op == herd::Op::kGet ? *reader : *client;
      if (!to.CanSubmit(c, p.keyhash, herd::CarriesValue(p.op) ? value.size() : 0)) continue;
      bench::MakeKey(p.index, w.key_bytes, key.data());
      if (p.op == herd::Op::kPut || p.op == herd::Op::kCas) {
        bench::MakeValue(p.index, stamp++, w.value_bytes, value.data());
      }
      // CAS expects version 0, so it fails (CAS_FAILED or NOT_FOUND) but still costs a full
      // lookup: the benchmark measures the operation's cost, not its success rate.
      if (absl::Status s = to.Submit(c, p.op, key, p.keyhash, value, 0, p.index); !s.ok()) {
        out->status = s;  // as in the preload: not a full window (CanSubmit), so final
        shared.stop = true;
        break;
      }
      p = draw();
    }
    size_t got = client->Poll(absl::MakeSpan(results));
    if (reader_connection) {
      got += reader->Poll(absl::MakeSpan(results).subspan(got));
      if (!reader->health().ok()) out->status = reader->health();
    }
    if (!client->health().ok() && !may_follow) out->status = client->health();
    if (!out->status.ok()) {
      shared.stop = true;
      break;
    }
    // The counters of the measured window only (not the preload's or the warm-up's).
    const bool measuring = shared.measuring.load(std::memory_order_relaxed);
    if (measuring && !window_started) {
      at_start = client->stats();
      reader_at_start = reader->stats();
      window_started = true;
    } else if (!measuring && window_started && !window_ended) {
      at_end = client->stats();
      reader_at_end = reader->stats();
      window_ended = true;
    }
    if (got == 0) continue;
    if (measuring) {
      for (size_t i = 0; i < got; ++i) {
        out->latency.Record(results[i].latency_ns);
        ++out->worker_ops[results[i].worker];
        const herd::Status status = results[i].status;
        if (status == herd::Status::kTimedOut || status == herd::Status::kBadRequest) {
          ++out->errors;
        }
        if (results[i].op == herd::Op::kGet) {
          ++out->gets;
          if (status == herd::Status::kNotFound) ++out->get_misses;
          if (status == herd::Status::kBackupBusy) ++out->backup_busy;
        } else if (status == herd::Status::kNoMemory) {
          ++out->no_memory;
        }
      }
      out->ops += got;
    }
    completed += got;
    shared.progress[t].ops.store(completed, std::memory_order_relaxed);
  }
  if (!window_ended) {
    at_end = client->stats();
    reader_at_end = reader->stats();
  }
  if (reader_connection) out->reader_stats = MeasuredWindow(reader_at_start, reader_at_end);
  out->stats = MeasuredWindow(at_start, at_end);
  AddStats(carried, &out->stats);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("herd benchmark client: see README.md");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  absl::StatusOr<bench::WorkloadConfig> workload = bench::WorkloadConfigFromFlags();
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  absl::StatusOr<transport::ConnectMode> connect = transport::ConnectModeFromFlags();
  for (const absl::Status& s : {workload.status(), device.status(), connect.status()}) {
    if (!s.ok()) {
      fprintf(stderr, "herd_client: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (FLAGS_threads < 1 || FLAGS_clients_per_thread < 1) {
    fprintf(stderr, "herd_client: --threads and --clients_per_thread must be at least 1\n");
    return 1;
  }
  herd::ClientOptions options;
  options.server = FLAGS_server;
  if (!FLAGS_coordinator.empty()) {
    if (!gflags::GetCommandLineFlagInfoOrDie("server").is_default) {
      fprintf(stderr, "herd_client: --coordinator names the server: drop --server\n");
      return 1;
    }
    herd::CoordinatorOptions coordinator;
    coordinator.hosts = FLAGS_coordinator;
    coordinator.cluster = FLAGS_cluster;
    // The primary's address first (replication/coordinator.h).
    absl::StatusOr<std::vector<std::string>> members = herd::ClusterAddresses(coordinator);
    if (!members.ok() || members->empty()) {
      fprintf(stderr, "herd_client: --coordinator=%s: %s\n", FLAGS_coordinator.c_str(),
              members.ok() ? "the cluster has no member" : members.status().ToString().c_str());
      return 1;
    }
    options.server = members->front();
    options.members = *members;  // for Follow: the member that takes over is among them
  }
  options.connect = *connect;
  options.clients = FLAGS_clients_per_thread;
  options.device = *device;
  options.retry_timeout = absl::Microseconds(FLAGS_retry_timeout_us);
  options.adaptive_retry = FLAGS_adaptive_retry;
  options.min_retry_timeout = absl::Microseconds(FLAGS_min_retry_timeout_us);
  options.max_retry_timeout = absl::Microseconds(FLAGS_max_retry_timeout_us);
  options.batch_doorbells = FLAGS_batch_doorbells;

  absl::StatusOr<std::unique_ptr<herd::Topology>> topology = herd::Topology::Load();
  const absl::StatusOr<std::vector<int>> cores =
      topology.ok() ? (*topology)->PickClientCores(FLAGS_threads, FLAGS_client_cores,
                                                   herd::DeviceNumaNode(device->name))
                    : topology.status();
  if (!cores.ok()) {
    fprintf(stderr, "herd_client: %s\n", cores.status().ToString().c_str());
    return 1;
  }

  const std::vector<std::string> backups = absl::StrSplit(FLAGS_backups, ',', absl::SkipEmpty());
  if (FLAGS_read_from != "primary" && FLAGS_read_from != "backups" && FLAGS_read_from != "any") {
    fprintf(stderr, "herd_client: --read_from=%s: expected primary, backups or any\n",
            FLAGS_read_from.c_str());
    return 1;
  }
  if (FLAGS_read_from != "primary" && backups.empty()) {
    fprintf(stderr, "herd_client: --read_from=%s needs --backups=HOST:PORT,...\n",
            FLAGS_read_from.c_str());
    return 1;
  }
  Shared shared(FLAGS_threads);
  std::vector<ThreadResult> results(FLAGS_threads);
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < FLAGS_threads; ++t) {
    const int core = cores->empty() ? -1 : (*cores)[t];
    threads.emplace_back(RunThread, t, options, *workload, std::cref(**topology), core,
                         ReadServerOf(t, backups), std::ref(shared), &results[t]);
  }
  // Warm-up starts when every thread has finished its preload (made its first progress).
  auto total_progress = [&] {
    uint64_t sum = 0;
    for (auto& p : shared.progress) sum += p.ops.load(std::memory_order_relaxed);
    return sum;
  };
  auto all_started = [&] {
    for (auto& p : shared.progress) {
      if (p.ops.load(std::memory_order_relaxed) == 0) return false;
    }
    return true;
  };
  while (!shared.stop && !all_started()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(absl::ToChronoNanoseconds(absl::Seconds(FLAGS_warmup_s)));
  const double cpu_start = bench::ProcessCpuSeconds();
  const Clock::time_point start = Clock::now();
  shared.measuring = true;
  uint64_t last = total_progress();
  Clock::time_point tick = start;
  while (!shared.stop &&
         Clock::now() - start < absl::ToChronoNanoseconds(absl::Seconds(FLAGS_duration_s))) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min<int>(1000, static_cast<int>(FLAGS_duration_s * 1000))));
    const Clock::time_point now = Clock::now();
    const uint64_t progress = total_progress();
    fprintf(stderr, "progress %.3f Mops\n",
            (progress - last) / std::chrono::duration<double>(now - tick).count() / 1e6);
    last = progress;
    tick = now;
  }
  shared.measuring = false;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu_s = bench::ProcessCpuSeconds() - cpu_start;
  shared.stop = true;
  for (auto& t : threads) t.join();

  bench::Histogram latency;
  herd::ClientStats total;
  uint64_t ops = 0, errors = 0, gets = 0, get_misses = 0, no_memory = 0, backup_busy = 0;
  uint64_t followed = 0;
  double follow_s = 0;
  std::vector<std::string> per_thread;
  for (ThreadResult& r : results) {
    if (!r.status.ok()) {
      fprintf(stderr, "herd_client: %s\n", r.status.ToString().c_str());
      return 1;
    }
    latency.Merge(r.latency);
    ops += r.ops;
    errors += r.errors;
    gets += r.gets;
    get_misses += r.get_misses;
    backup_busy += r.backup_busy;
    followed += r.followed;
    follow_s = std::max(follow_s, r.follow_s);
    AddStats(r.reader_stats, &total);
    no_memory += r.no_memory;
    per_thread.push_back(absl::StrFormat("%.4f", r.ops / seconds / 1e6));
    AddStats(r.stats, &total);
  }
  // On the shm fabric the server runs here too: every worker and every client thread spins, so
  // with more of them than cores they time-slice and throughput collapses (by 100x and more on
  // 2 cores). Said on stderr and in the JSON, so a sweep point measured that way is recognisable.
  const bool oversubscribed =
      device->name == "shm" &&
      static_cast<int>(results[0].workers + FLAGS_threads) > bench::OnlineCores();
  if (oversubscribed) {
    LOG(WARNING) << "the server's " << results[0].workers << " workers and this client's "
                 << FLAGS_threads << " threads spin on " << bench::OnlineCores()
                 << " cores: they time-slice, and the numbers measure the scheduler";
  }
  std::vector<std::string> per_worker;
  for (uint32_t w = 0; w < results[0].workers; ++w) {
    uint64_t answered = 0;
    for (const ThreadResult& r : results) answered += r.worker_ops[w];
    per_worker.push_back(absl::StrFormat("%.4f", answered / seconds / 1e6));
  }
  const double per_op = total.fabric.wrs == 0 ? 0 : 1.0 / static_cast<double>(total.fabric.wrs);
  const std::string json = absl::StrFormat(
      "{\"threads\":%d,\"clients_per_thread\":%d,\"clients\":%d,\"server\":\"%s\","
      "\"fabric\":\"%s\",\"device\":\"%s\",\"workload\":%s,\"duration_s\":%.3f,\"ops\":%d,"
      "\"errors\":%d,\"gets\":%d,\"get_misses\":%d,\"no_memory\":%d,\"mops\":%.4f,\"thread_mops\":["
      "%s],\"worker_mops\":[%s],\"p50_us\":%.2f,\"p99_"
      "us\":%.2f,"
      "\"p999_us\":%.2f,\"max_us\":%.2f,\"retransmissions\":%d,\"absences\":%d,\"holds\":%d,"
      "\"timed_out\":%d,"
      "\"send_failed\":%d,\"stray\":%d,\"torn\":%d,\"retry_timeout_us\":%.1f,"
      "\"large_puts\":%d,\"out_of_line_gets\":%d,\"item_rereads\":%d,\"copied_gets\":%d,"
      "\"client_wrs\":%d,\"wrs_per_op\":%.3f,\"payload_bytes_per_op\":%.1f,"
      "\"doorbells_per_wr\":%.3f,\"requests_per_doorbell\":%.2f,\"signaled_"
      "fraction\":%.4f,"
      "\"inline_fraction\":%.4f,\"bytes_per_wr\":%.1f,\"cpu_s\":%.3f,\"cpu_model\":\"%s\","
      "\"cores\":%d,\"oversubscribed\":%s,\"read_from\":\"%s\",\"backup_busy\":%d,"
      "\"followed\":%d,\"follow_s_max\":%.3f}",
      FLAGS_threads, FLAGS_clients_per_thread, FLAGS_threads * FLAGS_clients_per_thread,
      options.server, device->name == "shm" ? "shm" : "verbs", device->name, workload->ToJson(),
      seconds, ops, errors, gets, get_misses, no_memory, ops / seconds / 1e6,
      absl::StrJoin(per_thread, ","), absl::StrJoin(per_worker, ","), latency.Quantile(0.5) / 1e3,
      latency.Quantile(0.99) / 1e3, latency.Quantile(0.999) / 1e3, latency.max() / 1e3,
      total.retransmissions, total.absences, total.holds, total.timed_out, total.send_failed,
      total.stray, total.torn, absl::ToDoubleMicroseconds(total.retry_timeout), total.large_puts,
      total.out_of_line_gets, total.item_rereads, total.copied_gets, total.fabric.wrs,
      ops == 0 ? 0.0 : static_cast<double>(total.fabric.wrs) / ops,
      ops == 0 ? 0.0 : static_cast<double>(total.fabric.bytes) / ops,
      total.fabric.doorbells * per_op,
      total.fabric.doorbells == 0
          ? 0.0
          : static_cast<double>(total.fabric.wrs) / static_cast<double>(total.fabric.doorbells),
      total.fabric.signaled_wrs * per_op, total.fabric.inline_wrs * per_op,
      total.fabric.bytes * per_op, cpu_s, bench::CpuModel(), bench::OnlineCores(),
      oversubscribed ? "true" : "false", FLAGS_read_from, backup_busy, followed, follow_s);
  printf("%s\n", json.c_str());
  if (ops == 0) {
    // A run that did nothing is a failure, however quietly it went.
    fprintf(stderr, "%s",
            absl::StrFormat("herd_client: 0 operations completed in %.1f s (%d retransmissions, "
                            "%d timed out): the server answered nothing\n",
                            seconds, total.retransmissions, total.timed_out)
                .c_str());
    return 3;
  }
  return errors == 0 ? 0 : 2;
}
