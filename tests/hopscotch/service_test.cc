// hop_server + hopscotch::Client end to end on the shm fabric: a sharded YCSB trace looked up by
// several client threads against two servers, every value checked (bench/hop_replay), and
// upserts applied with displacement while readers READ through slow, racing copies: no lookup
// may return a torn value, an older value than one acknowledged before it began, or a miss of
// a key acknowledged before it began.
#include <array>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/hop_replay.h"
#include "bench/ycsb_trace_gen.h"
#include "gtest/gtest.h"
#include "hopscotch/build.h"
#include "hopscotch/client.h"
#include "hopscotch/hash.h"
#include "hopscotch/server.h"
#include "hopscotch/table.h"
#include "hopscotch/ycsb_trace.h"

namespace hopscotch {
namespace {

using Kind = LookupResult::Kind;

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// A server stepping on its own thread until destroyed.
class RunningServer {
 public:
  explicit RunningServer(const ServerOptions& options) {
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return;
    server_ = *std::move(server);
    thread_ = std::thread([this] { server_->Run(stop_); });
  }
  ~RunningServer() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool ok() const { return server_ != nullptr; }
  // Stops serving and destroys the server (its QPs and table registration go with it).
  void Destroy() {
    Stop();
    server_.reset();
  }
  std::string address() const { return absl::StrFormat("127.0.0.1:%u", server_->port()); }
  Server& server() { return *server_; }

 private:
  std::unique_ptr<Server> server_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(Service, ShardedLookupsOfATraceAreAllChecked) {
  const std::string trace = TmpPath("service.txt");
  constexpr uint64_t kAbsent = 500;  // READs of keys no INSERT names: must miss
  bench::TraceCounts counts;
  {
    std::ofstream out(trace);
    bench::TraceOptions options;
    options.records = 20000;
    options.operations = 30000;
    options.zipfian = true;
    ASSERT_TRUE(bench::WriteTrace(options, out, &counts).ok());
    for (uint64_t i = 0; i < kAbsent; ++i) {
      out << FormatRead("usertable", absl::StrFormat("absent%u", i)) << "\n";
    }
  }
  constexpr uint32_t kShards = 2;
  const std::string fabric = "hop_service_sharded";
  std::vector<std::unique_ptr<RunningServer>> servers;
  std::vector<std::string> addresses;
  for (uint32_t shard = 0; shard < kShards; ++shard) {
    BuildOptions build;
    build.traces = {trace};
    build.out = TmpPath(absl::StrFormat("service%u.hop", shard));
    build.shard = shard;
    build.shards = kShards;
    ASSERT_TRUE(BuildTable(build).ok());
    ServerOptions options;
    options.table = build.out;
    options.device.fabric = fabric;
    servers.push_back(std::make_unique<RunningServer>(options));
    ASSERT_TRUE(servers.back()->ok());
    addresses.push_back(servers.back()->address());
  }
  bench::ReplayOptions replay;
  replay.client.servers = {addresses[1], addresses[0]};  // any order
  replay.client.device.fabric = fabric;
  replay.client.window = 8;
  replay.traces = {trace};
  replay.threads = 3;
  absl::StatusOr<bench::ReplayResult> r = bench::ReplayLookups(replay);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->passed()) << r->ToJson();
  EXPECT_EQ(r->lookups, counts.reads + kAbsent);
  EXPECT_EQ(r->found, counts.reads);
  EXPECT_EQ(r->expected_misses, kAbsent);
  EXPECT_EQ(r->confirm_reads, kAbsent);  // each miss confirmed by a second READ
  EXPECT_EQ(r->rereads, 0u);             // nothing writes: no snapshot is torn
  EXPECT_EQ(r->reads, r->lookups + kAbsent);
  EXPECT_EQ(r->fabric.wrs, r->reads);
  EXPECT_EQ(r->fabric.bytes, r->reads * kNeighbourhoodBytes);  // one 2 KiB READ each
  EXPECT_LT(r->fabric.doorbells, r->reads);                    // READs chained per server

  ClientOptions options;
  options.servers = addresses;
  options.device.fabric = fabric;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string key = YcsbKeyName(7);
  absl::StatusOr<LookupResult> found = (*client)->Lookup(key);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->kind, Kind::kFound);
  EXPECT_EQ(found->value, ExpectedValue(key));
  EXPECT_EQ((*client)->Lookup("absent0")->kind, Kind::kMiss);
  absl::StatusOr<std::string> stats = (*client)->ServerStats(0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NE(stats->find("\"joins\":4"), std::string::npos) << *stats;  // 3 replay threads + 1
}

// A replay whose server goes away mid-run reports failed lookups and does not pass: a run that
// lost its server must never look like a checked one.
TEST(Service, AReplayWhoseServerGoesAwayFailsInsteadOfPassing) {
  const std::string trace = TmpPath("gone.txt");
  {
    std::ofstream out(trace);
    bench::TraceOptions options;
    options.records = 2000;
    options.operations = 2000;
    bench::TraceCounts counts;
    ASSERT_TRUE(bench::WriteTrace(options, out, &counts).ok());
  }
  BuildOptions build;
  build.traces = {trace};
  build.out = TmpPath("gone.hop");
  ASSERT_TRUE(BuildTable(build).ok());
  const std::string fabric = "hop_service_gone";
  ServerOptions server_options;
  server_options.table = build.out;
  server_options.device.fabric = fabric;
  RunningServer server(server_options);
  ASSERT_TRUE(server.ok());
  bench::ReplayOptions replay;
  replay.client.servers = {server.address()};
  replay.client.device.fabric = fabric;
  replay.traces = {trace};
  replay.duration_s = 60;  // replays until the server is gone (long before this)
  // Destroy the server once the replay's client joined (its QP connected: destroying the server
  // before that is a failure to connect, not failed lookups).
  std::atomic<bool> joined{false};
  replay.on_joined = [&] { joined = true; };
  absl::StatusOr<bench::ReplayResult> result;
  std::thread replaying([&] { result = bench::ReplayLookups(replay); });
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!joined && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  server.Destroy();
  replaying.join();
  ASSERT_TRUE(joined);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->failed, 0u) << result->ToJson();
  EXPECT_FALSE(result->passed()) << result->ToJson();
}

// A value that names its own key and generation, so any mix of two values is recognised.
Value MakeValue(std::string_view key, uint32_t generation) {
  Value v{};
  std::memcpy(v.data(), &generation, sizeof(generation));
  for (size_t i = sizeof(generation); i < v.size(); i += 8) {
    const uint64_t word = JenkinsHash64(key, (uint64_t{generation} << 8) | i);
    std::memcpy(v.data() + i, &word, std::min<size_t>(8, v.size() - i));
  }
  return v;
}

uint32_t GenerationOf(const Value& v) {
  uint32_t generation;
  std::memcpy(&generation, v.data(), sizeof(generation));
  return generation;
}

// What a reader knew about its key when it submitted the lookup.
struct Expectation {
  uint32_t key = 0;
  bool present = false;     // an insert of the key was acknowledged before the lookup began
  uint32_t generation = 0;  // the newest acknowledged generation then
};

TEST(Service, UpsertsWhileClientsReadNeverTearOrHideAKey) {
  constexpr uint64_t kHomeBuckets = 256;
  constexpr uint32_t kPreloaded = 150;
  constexpr uint32_t kKeys = 236;  // up to ~92% load: inserts displace items under the readers
  constexpr uint32_t kRounds = 400;
  constexpr uint64_t kMinLookups = 5000;  // the writer goes on until the readers did this many
  constexpr absl::Duration kGiveUp = absl::Seconds(120);
  constexpr uint32_t kPairsPerRound = 6;
  constexpr int kReaders = 2;
  const std::string path = TmpPath("racing.hop");
  std::vector<std::string> keys;
  for (uint32_t k = 0; k < kKeys; ++k) keys.push_back(absl::StrFormat("racing%u", k));
  // Acknowledged state, published by the writer after each Upsert returns.
  std::vector<std::atomic<uint32_t>> acked_generation(kKeys);
  std::vector<std::atomic<bool>> acked_present(kKeys);
  {
    absl::StatusOr<Table> table = Table::Create(path, kHomeBuckets);
    ASSERT_TRUE(table.ok());
    for (uint32_t k = 0; k < kPreloaded; ++k) {
      ASSERT_TRUE(table->Insert(keys[k], MakeValue(keys[k], 0)).ok());
      acked_present[k] = true;
    }
    ASSERT_TRUE(table->Close().ok());
  }
  const std::string fabric = "hop_service_racing";
  ServerOptions server_options;
  server_options.table = path;
  server_options.device.fabric = fabric;
  RunningServer server(server_options);
  ASSERT_TRUE(server.ok());

  std::atomic<bool> writing{true};
  std::atomic<uint64_t> wrong{0}, stale{0}, hidden{0}, torn{0}, failed{0}, lookups{0};
  std::atomic<uint64_t> rereads{0};
  auto reader = [&](int id) {
    ClientOptions options;
    options.servers = {server.address()};
    options.device.fabric = fabric;
    // Asynchronous READs copied in pieces with pauses between them: the writer gets ahead.
    options.device.faults.slow_read_us = 2;
    options.window = 4;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    std::mt19937 rng(id);
    std::vector<Expectation> tickets(options.window);
    std::vector<uint32_t> free_tickets = {0, 1, 2, 3};
    std::array<LookupDone, 4> done;
    while (writing.load() || (*client)->in_flight() > 0) {
      while (writing.load() && !free_tickets.empty()) {
        const uint32_t t = free_tickets.back();
        free_tickets.pop_back();
        const uint32_t k = rng() % kKeys;
        tickets[t] = Expectation{k, acked_present[k].load(), acked_generation[k].load()};
        ASSERT_TRUE((*client)->Submit(keys[k], t).ok());
      }
      const size_t n = (*client)->Poll(absl::MakeSpan(done));
      for (size_t i = 0; i < n; ++i) {
        const Expectation& e = tickets[done[i].tag];
        free_tickets.push_back(static_cast<uint32_t>(done[i].tag));
        ++lookups;
        if (!done[i].status.ok()) {
          ++failed;
        } else if (done[i].result.kind == Kind::kTorn) {
          ++torn;
        } else if (done[i].result.kind == Kind::kMiss) {
          if (e.present) ++hidden;
        } else {
          const uint32_t generation = GenerationOf(done[i].result.value);
          if (done[i].result.value != MakeValue(keys[e.key], generation)) {
            ++wrong;
          } else if (generation < e.generation) {
            ++stale;
          }
        }
      }
    }
    rereads += (*client)->stats().rereads;
  };
  std::vector<std::thread> readers;
  for (int i = 0; i < kReaders; ++i) readers.emplace_back(reader, i);

  ClientOptions writer_options;
  writer_options.servers = {server.address()};
  writer_options.device.fabric = fabric;
  absl::StatusOr<std::unique_ptr<Client>> writer = Client::Connect(writer_options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::mt19937 rng(99);
  uint32_t next_new = kPreloaded;
  uint64_t full = 0;
  const absl::Time give_up = absl::Now() + kGiveUp;
  for (uint32_t round = 1; round <= kRounds || lookups.load() < kMinLookups; ++round) {
    ASSERT_LT(absl::Now(), give_up) << "the readers made no progress";
    std::vector<HopUpsert> pairs;
    std::vector<uint32_t> which;
    for (uint32_t p = 0; p < kPairsPerRound; ++p) {
      // Mostly updates of present keys; an insert of a new key every few pairs.
      const uint32_t k = (next_new < kKeys && rng() % 4 == 0) ? next_new++ : rng() % next_new;
      if (std::find(which.begin(), which.end(), k) != which.end()) continue;
      pairs.push_back(HopUpsert{keys[k], MakeValue(keys[k], round)});
      which.push_back(k);
    }
    absl::StatusOr<std::vector<absl::Status>> statuses = (*writer)->Upsert(pairs);
    ASSERT_TRUE(statuses.ok()) << statuses.status();
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (!(*statuses)[i].ok()) {
        EXPECT_TRUE(absl::IsResourceExhausted((*statuses)[i])) << (*statuses)[i];
        ++full;
        continue;
      }
      acked_generation[which[i]] = round;
      acked_present[which[i]] = true;
    }
  }
  writing = false;
  for (std::thread& t : readers) t.join();
  server.Stop();
  const TableStats stats = server.server().table().stats();
  RecordProperty("lookups", static_cast<int>(lookups.load()));
  RecordProperty("rereads", static_cast<int>(rereads.load()));
  RecordProperty("moves", static_cast<int>(stats.moves));
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(stale.load(), 0u);
  EXPECT_EQ(hidden.load(), 0u);
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_EQ(failed.load(), 0u);
  EXPECT_GT(stats.moves, 0u) << "no displacement happened under the readers";
  EXPECT_GT(stats.updates, 0u);
  EXPECT_TRUE(server.server().table().CheckInvariants().ok());
  (void)full;
}

}  // namespace
}  // namespace hopscotch
