// herd's own history checker, end to end: a server process, several client processes (forked,
// each with one or more threads, one herd::Client per thread, several logical clients each)
// running GET/PUT/DELETE/CAS over a small Zipf-skewed hot key set with self-checking values and
// short retry timeouts, every request x response verb pair on the plain shm fabric, on the
// asynchronous fabric with injected delay, and with injected UD/UC loss. Each process records
// its history; the parent adds a final GET of every key and checks the whole history per key
// (tests/herd/history.h says what that proves).
//
// Bounded by default (kDefaultSeconds per configuration, a fixed seed). A long run by hand (one
// line; --test_filter='*uc_write_to_ud_send_lossy*' picks a configuration):
//   HERD_HISTORY_SECONDS=60 HERD_HISTORY_SEED=7 bazel test //tests/herd:history_test
//     --test_env=HERD_HISTORY_SECONDS --test_env=HERD_HISTORY_SEED --test_output=all
//     --test_timeout=3600
#include "tests/herd/history.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/zipf.h"
#include "mica/keyhash.h"
#include "tests/herd/server_fixture.h"

namespace herd::testing {
namespace {

using history::Event;
using history::MonotonicNowNs;

// ---- The workload ----
constexpr uint32_t kKeys = 64;             // the hot key set: every key is contended
constexpr double kZipfTheta = 0.99;        // YCSB's skew
constexpr uint32_t kProcesses = 3;         // client processes
constexpr uint32_t kThreadsInFirst = 2;    // process 0 runs this many Clients (threads); others 1
constexpr uint32_t kClientsPerThread = 3;  // logical clients per Client
// Operation mix, in percent (the rest are DELETEs).
constexpr uint32_t kGetPercent = 40;
constexpr uint32_t kPutPercent = 30;
constexpr uint32_t kCasPercent = 20;
// Percent of CASes that expect a version other than the last one this thread saw.
constexpr uint32_t kWrongCasPercent = 25;
// Short retransmission timer: retransmissions and late duplicates are the point.
constexpr absl::Duration kRetryTimeout = absl::Microseconds(200);
// Attempts before a request is given up (kTimedOut: unknown outcome); with 2 shared cores a
// process can be descheduled for tens of milliseconds, which must not make outcomes unknown.
constexpr uint32_t kMaxAttempts = 10000;
// How long the end of a run waits for the last outstanding requests.
constexpr absl::Duration kDrainTimeout = absl::Seconds(30);

// ---- Runs ----
constexpr double kDefaultSeconds = 2.0;  // per configuration (HERD_HISTORY_SECONDS)
constexpr uint64_t kDefaultSeed = 1;     // (HERD_HISTORY_SEED)
// A run must check at least this many operations, or it proved nothing.
constexpr uint64_t kMinOperations = 500;

// ---- The server ----
constexpr uint32_t kSlotBytes = 512;  // values up to 464 bytes: past the 188-byte inline limit
constexpr uint32_t kWorkers = 2;
constexpr uint32_t kMaxClients = 32;
// MICA's log is circular: a key's item dies once log_bytes of later items were appended to its
// partition. The clients count the bytes they append to each partition (an upper bound: a
// failed CAS appends nothing) and end the run once half of a log is used, so no item can die
// and a NOT_FOUND is never an eviction. The log is populated at start, so it grows with the
// run's length (kLogBytesPerSecond) between kMinLogBytes and kMaxLogBytes per partition.
constexpr uint64_t kMinLogBytes = uint64_t{128} << 20;
constexpr uint64_t kMaxLogBytes = uint64_t{2} << 30;
constexpr uint64_t kLogBytesPerSecond = uint64_t{16} << 20;
constexpr uint64_t kItemHeaderBytes = 24;  // mica/item.h: keyhash, version, lengths
// Index sized for far more keys than kKeys (no bucket can overflow: no index eviction).
constexpr uint64_t kExpectedItems = 4096;

// ---- Faults ----
constexpr uint32_t kDelayUs = 75;  // the asynchronous fabric: every WR takes effect 75 us late
constexpr double kLoss = 0.01;     // UD and UC messages lost

enum class Fabric { kPlain, kDelayed, kLossy };

std::string_view FabricName(Fabric f) {
  switch (f) {
    case Fabric::kPlain:
      return "plain";
    case Fabric::kDelayed:
      return "delayed";
    case Fabric::kLossy:
      return "lossy";
  }
  return "?";
}

double Seconds() {
  const char* s = std::getenv("HERD_HISTORY_SECONDS");
  double v = kDefaultSeconds;
  if (s != nullptr && !absl::SimpleAtod(s, &v)) v = kDefaultSeconds;
  return v;
}

uint64_t Seed() {
  const char* s = std::getenv("HERD_HISTORY_SEED");
  uint64_t v = kDefaultSeed;
  if (s != nullptr && !absl::SimpleAtoi(s, &v)) v = kDefaultSeed;
  return v;
}

std::string KeyName(uint32_t key) { return absl::StrFormat("hk%03d", key); }

// What one client thread needs.
struct DriverSpec {
  std::string address;
  std::string fabric;
  transport::FaultOptions faults;
  uint32_t first_writer = 0;  // writer id of logical client 0
  uint64_t seed = 0;
  int64_t deadline_ns = 0;  // stop submitting (CLOCK_MONOTONIC)
  // Log bytes each worker's partition may still take, shared by every process (MAP_SHARED).
  std::atomic<int64_t>* log_bytes_left = nullptr;
};

struct DriverOutput {
  std::vector<Event> events;
  ClientStats stats;
  std::string error;
};

// One thread: one Client, kClientsPerThread logical clients, window requests each.
void Drive(const DriverSpec& spec, DriverOutput* out) {
  ClientOptions options;
  options.server = spec.address;
  options.clients = kClientsPerThread;
  options.device.fabric = spec.fabric;
  options.device.faults = spec.faults;
  options.retry_timeout = kRetryTimeout;
  options.adaptive_retry = false;  // a fixed, short timeout: retransmissions and late duplicates
  options.max_attempts = kMaxAttempts;
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
  if (!connected.ok()) {
    out->error = absl::StrCat("connect: ", connected.status().ToString());
    return;
  }
  Client& client = **connected;
  const uint32_t max_value = client.config().slot_value_bytes();
  std::mt19937_64 rng(spec.seed);
  bench::ZipfGenerator zipf(kKeys, kZipfTheta, /*scrambled=*/true);
  std::vector<std::string> names(kKeys);
  std::vector<uint64_t> hashes(kKeys);
  for (uint32_t k = 0; k < kKeys; ++k) {
    names[k] = KeyName(k);
    hashes[k] = mica::KeyHash(names[k]);
  }
  std::vector<uint64_t> seen_version(kKeys, 0);  // the newest version this thread saw
  std::vector<uint64_t> next_seq(kClientsPerThread, 1);
  absl::flat_hash_map<uint64_t, Event> pending;
  std::vector<Result> results(64);
  uint64_t next_tag = 1;

  auto deliver = [&](size_t got) {
    const int64_t now = MonotonicNowNs();
    for (size_t i = 0; i < got; ++i) {
      const Result& r = results[i];
      auto it = pending.find(r.tag);
      if (it == pending.end()) {
        out->error = absl::StrCat("a result nobody asked for: tag ", r.tag);
        continue;
      }
      Event e = std::move(it->second);
      pending.erase(it);
      e.status = r.status;
      e.version = r.version;
      e.attempts = r.attempts;
      e.complete_ns = e.unknown() ? history::kNever : now;
      // Result::value is valid until the next Poll/Submit: decode it now.
      if (e.op == Op::kGet && e.status == Status::kOk) history::RecordRead(r.value, &e);
      if ((e.status == Status::kOk && e.op != Op::kDelete) || e.status == Status::kCasFailed) {
        seen_version[e.key] = std::max(seen_version[e.key], e.version);
      }
      out->events.push_back(std::move(e));
    }
  };

  bool writing = true;
  while (writing && out->error.empty() && MonotonicNowNs() < spec.deadline_ns) {
    for (uint32_t c = 0; c < kClientsPerThread && writing; ++c) {
      const uint32_t key = static_cast<uint32_t>(zipf.Next(rng));
      if (!client.CanSubmit(c, hashes[key])) continue;
      Event e;
      e.key = key;
      e.writer = spec.first_writer + c;
      e.seq = next_seq[c]++;
      const uint32_t dice = static_cast<uint32_t>(rng() % 100);
      e.op = dice < kGetPercent                               ? Op::kGet
             : dice < kGetPercent + kPutPercent               ? Op::kPut
             : dice < kGetPercent + kPutPercent + kCasPercent ? Op::kCas
                                                              : Op::kDelete;
      std::string value;
      if (e.op == Op::kPut || e.op == Op::kCas) {
        e.value_bytes = history::kValueHeaderBytes +
                        static_cast<uint32_t>(rng() % (max_value - history::kValueHeaderBytes + 1));
        value = history::EncodeValue({key, e.writer, e.seq, e.value_bytes});
      }
      if (e.op == Op::kCas) {
        e.expected_version = seen_version[key] + (rng() % 100 < kWrongCasPercent ? 1 : 0);
      }
      if (e.op == Op::kPut || e.op == Op::kCas) {
        const int64_t item =
            static_cast<int64_t>(kItemHeaderBytes + Pad8(names[key].size()) + Pad8(e.value_bytes));
        if (spec.log_bytes_left[client.WorkerOf(hashes[key])].fetch_sub(item) < item) {
          writing = false;  // half of a log is used: end the run
          break;
        }
      }
      const uint64_t tag = next_tag++;
      e.invoke_ns = MonotonicNowNs();
      const absl::Status s = client.Submit(c, e.op, names[key], value, e.expected_version, tag);
      if (!s.ok()) {
        out->error = absl::StrCat("Submit: ", s.ToString());
        break;
      }
      pending.emplace(tag, std::move(e));
    }
    deliver(client.Poll(absl::MakeSpan(results)));
  }
  const int64_t give_up = MonotonicNowNs() + absl::ToInt64Nanoseconds(kDrainTimeout);
  while (!pending.empty() && MonotonicNowNs() < give_up) {
    deliver(client.Poll(absl::MakeSpan(results)));
  }
  if (!pending.empty()) {
    absl::StrAppend(&out->error, pending.size(), " requests still outstanding after ",
                    absl::FormatDuration(kDrainTimeout), "; ");
    for (auto& [tag, e] : pending) {
      e.status = Status::kTimedOut;
      e.complete_ns = history::kNever;
      out->events.push_back(std::move(e));
    }
  }
  out->stats = client.stats();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return out.good();
}

// A client process: its threads, then their histories and stats into `dir`. Never returns.
[[noreturn]] void ClientProcess(uint32_t process, uint32_t threads, const DriverSpec& base,
                                const std::string& dir) {
  std::vector<DriverOutput> outputs(threads);
  std::vector<std::thread> running;
  for (uint32_t t = 0; t < threads; ++t) {
    DriverSpec spec = base;
    spec.first_writer = (process * kThreadsInFirst + t) * kClientsPerThread;
    spec.seed = base.seed * 1000 + process * 10 + t;
    spec.faults.seed = spec.seed;
    running.emplace_back([spec, out = &outputs[t]] { Drive(spec, out); });
  }
  for (std::thread& t : running) t.join();
  int rc = 0;
  for (uint32_t t = 0; t < threads; ++t) {
    const DriverOutput& o = outputs[t];
    const std::string stem = absl::StrFormat("%s/p%d-t%d", dir, process, t);
    if (!WriteFile(stem + ".history", history::Serialize(o.events))) rc = 3;
    const ClientStats& s = o.stats;
    if (!WriteFile(stem + ".stats", absl::StrFormat("%d %d %d %d %d\n", s.submitted, s.completed,
                                                    s.retransmissions, s.timed_out, s.stray))) {
      rc = 3;
    }
    if (!o.error.empty()) {
      fprintf(stderr, "client process %u thread %u: %s\n", process, t, o.error.c_str());
      rc = 1;
    }
  }
  _exit(rc);
}

// "" while process `pid` (our child) runs; how it ended otherwise. Does not reap it.
std::string DeathOf(pid_t pid) {
  siginfo_t info{};
  if (waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid) {
    return "";
  }
  if (info.si_code == CLD_EXITED) return absl::StrCat("exit status ", info.si_status);
  return absl::StrCat("killed by signal ", info.si_status, " (", strsignal(info.si_status), ")");
}

// DeathOf, waiting up to kDeathWait for a server that is unreachable (`unreachable`) to be seen
// dead (a crashing process takes a moment to exit).
constexpr absl::Duration kDeathWait = absl::Seconds(5);
std::string AwaitDeath(pid_t pid, bool unreachable) {
  const int64_t give_up = MonotonicNowNs() + absl::ToInt64Nanoseconds(kDeathWait);
  std::string death = DeathOf(pid);
  while (death.empty() && unreachable && MonotonicNowNs() < give_up) {
    usleep(10'000);
    death = DeathOf(pid);
  }
  if (death.empty() && unreachable) return "unreachable, though still running";
  return death;
}

using Params = std::tuple<RequestVerb, ResponseVerb, Fabric, mica::StoreMode>;

// Store mode's pool per partition: the hot keys' items, many times over (a write moves an item
// only when its size class changes, and DELETE frees): it never fills, and no budget is needed.
constexpr uint64_t kStorePoolBytes = uint64_t{16} << 20;

class History : public ::testing::TestWithParam<Params> {};

TEST_P(History, EveryKeysHistoryIsLinearizable) {
  const auto [request, response, mode, store_mode] = GetParam();
  const double seconds = Seconds();
  const uint64_t seed = Seed();
  const std::string name = absl::StrFormat("%s_to_%s_%s_%s", Name(request), Name(response),
                                           FabricName(mode), mica::StoreModeName(store_mode));
  std::cout << "[history] " << name << ": seed " << seed << ", " << seconds
            << " s (HERD_HISTORY_SEED, HERD_HISTORY_SECONDS)" << std::endl;
  const std::string fabric = absl::StrFormat("history-%d-%s", getpid(), name);

  transport::FaultOptions faults;
  faults.seed = seed;
  if (mode == Fabric::kDelayed) faults.delay_us = kDelayUs;
  if (mode == Fabric::kLossy) faults.ud_loss = faults.uc_loss = kLoss;

  ServerOptions options = SmallServer(fabric);
  options.device.faults = faults;
  options.config.request_verb = request;
  options.config.response_verb = response;
  options.config.workers = kWorkers;
  options.config.slot_bytes = kSlotBytes;
  options.config.max_clients = kMaxClients;
  options.config.postlist = 8;
  options.config.unsig_batch = 8;
  options.config.ud_qps_per_worker = 2;
  uint64_t log_bytes = kMinLogBytes;
  while (log_bytes < kMaxLogBytes && log_bytes < seconds * kLogBytesPerSecond) log_bytes *= 2;
  options.store.log_bytes = log_bytes;
  options.store.expected_items = kExpectedItems;
  options.store.mode = store_mode;
  options.store.pool_bytes = kStorePoolBytes;
  // Cache mode stops the run at half a log (nothing may be evicted); store mode loses nothing.
  const bool budgeted = store_mode == mica::StoreMode::kCache;
  ServerProcess server(options);
  ASSERT_TRUE(server.ok());

  constexpr size_t kBudgetBytes = sizeof(std::atomic<int64_t>) * kWorkers;
  auto* log_bytes_left = static_cast<std::atomic<int64_t>*>(
      mmap(nullptr, kBudgetBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(log_bytes_left, MAP_FAILED);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    new (&log_bytes_left[w]) std::atomic<int64_t>(
        budgeted ? static_cast<int64_t>(log_bytes / 2) : std::numeric_limits<int64_t>::max() / 2);
  }

  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", fabric);
  ASSERT_EQ(system(absl::StrCat("mkdir -p '", dir, "'").c_str()), 0);

  DriverSpec base;
  base.address = server.address();
  base.fabric = fabric;
  base.faults = faults;
  base.seed = seed;
  base.log_bytes_left = log_bytes_left;
  base.deadline_ns = MonotonicNowNs() + static_cast<int64_t>(seconds * 1e9);
  std::vector<pid_t> children;
  std::vector<uint32_t> threads_of;
  for (uint32_t p = 0; p < kProcesses; ++p) {
    const uint32_t threads = p == 0 ? kThreadsInFirst : 1;
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ClientProcess(p, threads, base, dir);
    children.push_back(pid);
    threads_of.push_back(threads);
  }
  bool children_ok = true;
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      children_ok = false;
      ADD_FAILURE() << "client process " << pid << " failed: status " << status;
    }
  }
  bool budget_spent = false;
  for (uint32_t w = 0; w < kWorkers; ++w) budget_spent |= log_bytes_left[w].load() <= 0;
  munmap(log_bytes_left, kBudgetBytes);

  // Every history, then a final GET of every key: invoked after every other operation ended,
  // it must see each key's last acknowledged write (or its absence after a DELETE).
  std::vector<Event> events;
  uint64_t retransmissions = 0, timed_out = 0, stray = 0, submitted = 0;
  for (uint32_t p = 0; p < kProcesses; ++p) {
    for (uint32_t t = 0; t < threads_of[p]; ++t) {
      const std::string stem = absl::StrFormat("%s/p%d-t%d", dir, p, t);
      absl::StatusOr<std::vector<Event>> h = history::Parse(ReadFile(stem + ".history"));
      ASSERT_TRUE(h.ok()) << stem << ": " << h.status();
      events.insert(events.end(), h->begin(), h->end());
      std::istringstream stats(ReadFile(stem + ".stats"));
      uint64_t s = 0, c = 0, r = 0, to = 0, st = 0;
      stats >> s >> c >> r >> to >> st;
      submitted += s;
      retransmissions += r;
      timed_out += to;
      stray += st;
    }
  }
  std::unique_ptr<Client> final_reader;
  if (DeathOf(server.pid()).empty()) final_reader = Join(server, fabric, 1, 0, 0, faults.delay_us);
  if (final_reader != nullptr) {
    constexpr uint32_t kFinalWriter = 1u << 30;  // no workload writer has this id
    std::vector<Result> results(1);
    for (uint32_t k = 0; k < kKeys; ++k) {
      Event e;
      e.key = k;
      e.writer = kFinalWriter;
      e.seq = k + 1;
      e.invoke_ns = MonotonicNowNs();
      ASSERT_TRUE(final_reader->Submit(0, Op::kGet, KeyName(k), "", 0, k).ok());
      while (final_reader->Poll(absl::MakeSpan(results)) == 0) {
      }
      e.complete_ns = MonotonicNowNs();
      e.status = results[0].status;
      e.version = results[0].version;
      e.attempts = results[0].attempts;
      if (e.status == Status::kOk) history::RecordRead(results[0].value, &e);
      if (e.unknown()) e.complete_ns = history::kNever;
      const bool timed_out = e.unknown();
      events.push_back(std::move(e));
      if (timed_out) {
        ADD_FAILURE() << "final GET of " << KeyName(k) << " timed out";
        break;
      }
    }
  }
  if (const std::string death = AwaitDeath(server.pid(), final_reader == nullptr); !death.empty()) {
    ADD_FAILURE() << "the server process died during the run: " << death
                  << " (the histories until then are still checked)";
  }

  const history::CheckResult result = history::Check(events);
  std::cout << "[history] " << name << ": seed " << seed << ", " << submitted << " submitted, "
            << retransmissions << " retransmissions, " << timed_out << " timed out, " << stray
            << " stray responses" << (budget_spent ? ", stopped early: half of a log used" : "")
            << "\n[history] " << name << ": " << result.Summary(/*max_examples=*/8) << std::endl;
  EXPECT_TRUE(children_ok);
  EXPECT_GE(result.operations, kMinOperations) << "the run checked too little to prove anything";
  EXPECT_GT(result.values_read, 0u) << "no GET returned a value";
  EXPECT_GT(result.writes, 0u) << "no write was acknowledged";
  EXPECT_TRUE(result.ok()) << name << " (seed " << seed << "): " << result.Summary(20);
}

std::string ParamName(const ::testing::TestParamInfo<Params>& info) {
  return absl::StrFormat("%s_to_%s_%s_%s", Name(std::get<0>(info.param)),
                         Name(std::get<1>(info.param)), FabricName(std::get<2>(info.param)),
                         mica::StoreModeName(std::get<3>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    AllVerbsAndFabrics, History,
    ::testing::Combine(
        ::testing::Values(RequestVerb::kUcWrite, RequestVerb::kRcWrite, RequestVerb::kUdSend),
        ::testing::Values(ResponseVerb::kUdSend, ResponseVerb::kUcWrite, ResponseVerb::kRcWrite),
        ::testing::Values(Fabric::kPlain, Fabric::kDelayed, Fabric::kLossy),
        ::testing::Values(mica::StoreMode::kCache)),
    ParamName);

// Store mode under the same checker: every request verb with HERD's UD SEND responses, on every
// fabric (a lossless store must lose no acknowledged write either; the write-response paths do
// not touch the store, and e2e_test runs them in store mode).
INSTANTIATE_TEST_SUITE_P(
    StoreMode, History,
    ::testing::Combine(::testing::Values(RequestVerb::kUcWrite, RequestVerb::kRcWrite,
                                         RequestVerb::kUdSend),
                       ::testing::Values(ResponseVerb::kUdSend),
                       ::testing::Values(Fabric::kPlain, Fabric::kDelayed, Fabric::kLossy),
                       ::testing::Values(mica::StoreMode::kStore)),
    ParamName);

}  // namespace
}  // namespace herd::testing
