// rmem_bench: the remote-memory service's costs, measured through its client library.
//   bazel run -c opt //bench:rmem_bench -- [--server HOST:PORT] [--fabric ... --device ...]
// Without --server it serves a pool of its own on a thread (the shm fabric, or the verbs device
// named). Prints one JSON line per point:
//   {"bench":"put"|"get","bytes":B,"ops":N,"p50_us":..,"p99_us":..,"mb_per_s":..}
//       one-sided WRITE / READ of B bytes from registered memory, one outstanding (latency-bound
//       throughput: B / mean latency)
//   {"bench":"commit","granule":G,"dirty":D,"p50_us":..,"p99_us":..,"fabric_bytes":..,
//    "doorbells":..,"wrs":..,"copied_bytes":..}
//       a shadow commit of D scattered dirty bytes-ranges of 64 B each (non-adjacent, so D runs),
//       tracked at granule G: per commit, the bytes this client's QP posted (WRITE payload plus
//       the command), its doorbells and send WRs (fabric counters), and the bytes the server
//       copied (rmem_cp moves nothing over the fabric).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/histogram.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "rmem/client.h"
#include "rmem/server.h"
#include "rmem/shadow.h"
#include "transport/flags.h"

DEFINE_string(server, "", "rmem_server's HOST:PORT; empty: serve a pool on a thread here.");
DEFINE_uint64(pool_bytes, 64 << 20, "The pool of the server run here.");
DEFINE_string(sizes, "64,256,1024,4096,16384,65536,262144,1048576", "put/get sizes (bytes).");
DEFINE_string(dirty, "1,4,16,64,256,1024", "Dirty 64-byte ranges per commit.");
DEFINE_string(granules, "64,4096", "Shadow granules (bytes) to commit at.");
DEFINE_double(point_s, 1.0, "Seconds per point (at least 10 operations).");

namespace {

constexpr uint64_t kMinOps = 10;
constexpr uint64_t kChangeBytes = 64;  // each dirty range of a commit
// Tags of the bench's regions: the put/get region, and the first commit buffer (one per granule,
// sized for the most changes at that granule, one in every other granule).
constexpr uint64_t kPutGetTag = 6000;
constexpr uint64_t kShadowTag = 7000;

std::vector<uint64_t> ParseList(const std::string& text) {
  std::vector<uint64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    uint64_t v = 0;
    CHECK(absl::SimpleAtoi(part, &v)) << "not a number: " << part;
    out.push_back(v);
  }
  return out;
}

double Us(uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

void PutGet(rmem::Client& c, uint64_t max_bytes) {
  absl::StatusOr<rmem::RemoteRegion> region = c.Alloc(max_bytes, kPutGetTag);
  CHECK(region.ok()) << region.status();
  absl::StatusOr<uint8_t*> local = c.AllocateLocal(max_bytes);
  CHECK(local.ok()) << local.status();
  std::memset(*local, 0x5a, max_bytes);
  for (uint64_t bytes : ParseList(FLAGS_sizes)) {
    for (const bool put : {true, false}) {
      bench::Histogram h;
      const absl::Time end = absl::Now() + absl::Seconds(FLAGS_point_s);
      uint64_t ops = 0, total_ns = 0;
      while (ops < kMinOps || absl::Now() < end) {
        const absl::Time t0 = absl::Now();
        const absl::Status s =
            put ? c.Put(*region, 0, *local, bytes) : c.Get(*region, 0, *local, bytes);
        CHECK(s.ok()) << s;
        const uint64_t ns = absl::ToInt64Nanoseconds(absl::Now() - t0);
        h.Record(ns);
        total_ns += ns;
        ++ops;
      }
      std::printf(
          "{\"bench\":\"%s\",\"bytes\":%lu,\"ops\":%lu,\"p50_us\":%.2f,\"p99_us\":%.2f,"
          "\"mb_per_s\":%.1f}\n",
          put ? "put" : "get", bytes, ops, Us(h.Quantile(0.5)), Us(h.Quantile(0.99)),
          static_cast<double>(bytes) * static_cast<double>(ops) * 1e3 /
              static_cast<double>(total_ns));
      std::fflush(stdout);
    }
  }
}

void Commits(rmem::Client& c) {
  const std::vector<uint64_t> dirty_counts = ParseList(FLAGS_dirty);
  uint64_t most = 0;
  for (uint64_t d : dirty_counts) most = std::max(most, d);
  uint64_t tag = kShadowTag;
  for (uint64_t granule : ParseList(FLAGS_granules)) {
    const uint64_t bytes = 2 * most * granule;  // changes land in every other granule
    absl::StatusOr<rmem::ShadowMemory> m = rmem::ShadowMemory::Open(&c, {tag++, bytes, granule});
    CHECK(m.ok()) << m.status();
    for (uint64_t dirty : dirty_counts) {
      bench::Histogram h;
      transport::CounterSnapshot fabric;
      uint64_t copied = 0, commits = 0;
      const absl::Time end = absl::Now() + absl::Seconds(FLAGS_point_s);
      while (commits < kMinOps || absl::Now() < end) {
        for (uint64_t i = 0; i < dirty; ++i) {
          std::memset(m->data() + 2 * i * granule, static_cast<int>(commits), kChangeBytes);
          CHECK(m->MarkDirty(2 * i * granule, kChangeBytes).ok());
        }
        const transport::CounterSnapshot before = c.device().counters();
        const absl::Time t0 = absl::Now();
        absl::StatusOr<rmem::CommitStats> stats = m->Commit();
        const uint64_t ns = absl::ToInt64Nanoseconds(absl::Now() - t0);
        CHECK(stats.ok()) << stats.status();
        fabric.Add(c.device().counters().Since(before));
        h.Record(ns);
        copied += stats->txn.bytes_copied;
        ++commits;
      }
      const double n = static_cast<double>(commits);
      std::printf(
          "{\"bench\":\"commit\",\"granule\":%lu,\"dirty\":%lu,\"commits\":%lu,"
          "\"p50_us\":%.2f,\"p99_us\":%.2f,\"fabric_bytes\":%.0f,\"doorbells\":%.2f,"
          "\"wrs\":%.2f,\"copied_bytes\":%.0f}\n",
          granule, dirty, commits, Us(h.Quantile(0.5)), Us(h.Quantile(0.99)),
          static_cast<double>(fabric.bytes) / n, static_cast<double>(fabric.doorbells) / n,
          static_cast<double>(fabric.wrs) / n, static_cast<double>(copied) / n);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  CHECK(device.ok()) << device.status();
  std::unique_ptr<rmem::Server> server;
  std::atomic<bool> stop{false};
  std::thread serving;
  rmem::ClientOptions options;
  options.device = *device;
  options.server = FLAGS_server;
  if (FLAGS_server.empty()) {
    rmem::ServerOptions so;
    so.pool.pool_bytes = FLAGS_pool_bytes;
    so.device = *device;
    so.listen_address = "127.0.0.1";
    absl::StatusOr<std::unique_ptr<rmem::Server>> s = rmem::Server::Create(so);
    CHECK(s.ok()) << s.status();
    server = *std::move(s);
    options.server = absl::StrFormat("127.0.0.1:%u", server->port());
    serving = std::thread([&] { server->Run(stop); });
  }
  {
    absl::StatusOr<std::unique_ptr<rmem::Client>> c = rmem::Client::Connect(options);
    CHECK(c.ok()) << c.status();
    uint64_t max_bytes = 0;
    for (uint64_t b : ParseList(FLAGS_sizes)) max_bytes = std::max(max_bytes, b);
    PutGet(**c, max_bytes);
    Commits(**c);
  }
  if (serving.joinable()) {
    stop = true;
    serving.join();
  }
  return 0;
}
