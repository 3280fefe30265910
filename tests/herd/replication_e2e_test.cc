// Primary-backup replication end to end (issue 16): backups in processes of their own, a
// primary in this process (its Stats() readable), clients of both over the shm fabric.
//   - every acknowledged write is already on every backup: a GET there right after the
//     acknowledgement returns it (checked against a model, every verb pair);
//   - concurrent readers on the backups and writers on the primary make a history the checker
//     finds linearizable (no torn value, nothing older than an acknowledged write);
//   - a backup killed (SIGKILL) is dropped, the primary goes on degraded, the other backup
//     stays exact;
//   - what a backup refuses: mutations (NOT_PRIMARY), a second primary, a primary whose layout
//     or ring differs, a malformed hello, a new primary over an earlier one's data.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "herd/join.h"
#include "herd/replication/gate.h"
#include "herd/replication/link.h"
#include "tests/herd/history.h"
#include "tests/herd/replication_workload.h"
#include "tests/herd/server_fixture.h"
#include "transport/control/channel.h"

namespace herd {
namespace {

using testing::BackupGet;
using testing::ExpectBackupsHold;
using testing::KeyName;
using testing::ModelEntry;
using testing::MutateAndCheck;
using testing::ServerProcess;
using testing::StartInProcess;

constexpr uint32_t kKeys = 64;

ServerOptions Replicated(const std::string& fabric, mica::StoreMode mode, ReplicationRole role) {
  return testing::ReplicatedServer(fabric, mode, role);
}

std::unique_ptr<Client> Connect(const std::string& address, const std::string& fabric,
                                uint32_t delay_us) {
  ClientOptions options;
  options.server = address;
  options.device.fabric = fabric;
  options.device.faults.delay_us = delay_us;
  options.retry_timeout = absl::Milliseconds(5);
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

using Params = std::tuple<RequestVerb, ResponseVerb, mica::StoreMode, int, bool>;

class EveryVerbReplicated : public ::testing::TestWithParam<Params> {};

TEST_P(EveryVerbReplicated, AnAcknowledgedWriteIsOnEveryBackup) {
  const auto [request, response, mode, backup_count, async] = GetParam();
  const uint32_t delay_us = async ? 50 : 0;
  // One worker per server in this sweep (three servers' spinning workers share the machine's
  // cores with the clients); the other tests run two, each with its own links.
  const auto one_worker = [](ServerOptions o) {
    o.config.workers = 1;
    return o;
  };
  const std::string fabric =
      absl::StrCat("repl-", getpid(), "-", static_cast<int>(request), static_cast<int>(response),
                   static_cast<int>(mode), backup_count, async);
  std::vector<std::unique_ptr<ServerProcess>> backup_servers;
  std::vector<std::string> replication_addresses;
  for (int b = 0; b < backup_count; ++b) {
    ServerOptions options = one_worker(Replicated(fabric, mode, ReplicationRole::kBackup));
    options.config.request_verb = request;
    options.config.response_verb = response;
    options.device.faults.delay_us = delay_us;
    backup_servers.push_back(std::make_unique<ServerProcess>(options));
    ASSERT_TRUE(backup_servers.back()->ok());
    replication_addresses.push_back(backup_servers.back()->replication_address());
  }
  ServerOptions options = one_worker(Replicated(fabric, mode, ReplicationRole::kPrimary));
  options.config.request_verb = request;
  options.config.response_verb = response;
  options.device.faults.delay_us = delay_us;
  options.replication.backups = replication_addresses;
  std::unique_ptr<Server> primary = StartInProcess(options);
  ASSERT_NE(primary, nullptr);
  auto client = Connect(absl::StrCat("127.0.0.1:", primary->port()), fabric, delay_us);
  ASSERT_NE(client, nullptr);
  std::vector<std::unique_ptr<Client>> backups;
  for (const auto& b : backup_servers) {
    backups.push_back(Connect(b->address(), fabric, delay_us));
    ASSERT_NE(backups.back(), nullptr);
  }
  std::vector<ModelEntry> model(kKeys);
  MutateAndCheck(*client, backups, model, 300, 7);
  ExpectBackupsHold(backups, model, "at the end");
  // A backup takes no writes.
  for (auto& backup : backups) {
    const absl::Status put = backup->Put(KeyName(0), "x").status();
    EXPECT_TRUE(absl::IsFailedPrecondition(put)) << put;
    EXPECT_NE(put.message().find("NOT_PRIMARY"), std::string::npos) << put;
  }
  const ServerStats stats = primary->Stats();
  EXPECT_EQ(stats.role, ReplicationRole::kPrimary);
  EXPECT_EQ(stats.live_backups, static_cast<uint32_t>(backup_count));
  EXPECT_GT(stats.replication.batches_posted, 0u);
  EXPECT_EQ(stats.replication.links_dropped, 0u);
  // Each batch posted one chain per backup: its WRs are the frame and the ranges.
  EXPECT_GE(stats.replication.writes_posted,
            stats.replication.batches_posted * backup_count * (kChainFrameWrs + 1));
  const std::string json = StatsJson(stats, ServerStats{}, 1.0);
  EXPECT_NE(json.find("\"degraded\":false"), std::string::npos) << json;
  // Held GETs and those left unanswered (no held-read buffer free) are both reported.
  EXPECT_NE(json.find(absl::StrCat("\"reads_held\":", stats.replication.reads_held)),
            std::string::npos)
      << json;
  EXPECT_NE(json.find(absl::StrCat("\"reads_unanswered\":", stats.reads_unanswered)),
            std::string::npos)
      << json;
}

INSTANTIATE_TEST_SUITE_P(
    Verbs, EveryVerbReplicated,
    ::testing::Combine(::testing::Values(RequestVerb::kUcWrite, RequestVerb::kRcWrite,
                                         RequestVerb::kUdSend),
                       ::testing::Values(ResponseVerb::kUdSend, ResponseVerb::kRcWrite),
                       ::testing::Values(mica::StoreMode::kCache, mica::StoreMode::kStore),
                       ::testing::Values(1, 2), ::testing::Values(false, true)),
    [](const ::testing::TestParamInfo<Params>& info) {
      return absl::StrCat(std::string(Name(std::get<0>(info.param))), "_to_",
                          std::string(Name(std::get<1>(info.param))), "_",
                          std::string(mica::StoreModeName(std::get<2>(info.param))), "_",
                          std::get<3>(info.param), "backups",
                          std::get<4>(info.param) ? "_async" : "");
    });

// Writers on the primary, readers on two backups and the primary, all at once: one history,
// checked (tests/herd/history.h). BACKUP_BUSY answers say nothing and are left out (counted).
TEST(Replication, ConcurrentBackupReadsAreLinearizable) {
  namespace h = testing::history;
  for (const mica::StoreMode mode : {mica::StoreMode::kCache, mica::StoreMode::kStore}) {
    SCOPED_TRACE(std::string(mica::StoreModeName(mode)));
    const std::string fabric = absl::StrCat("repl-hist-", getpid(), "-", static_cast<int>(mode));
    constexpr uint32_t kDelayUs = 20;
    std::vector<std::unique_ptr<ServerProcess>> backup_servers;
    ServerOptions options = Replicated(fabric, mode, ReplicationRole::kBackup);
    options.device.faults.delay_us = kDelayUs;
    for (int b = 0; b < 2; ++b) {
      backup_servers.push_back(std::make_unique<ServerProcess>(options));
      ASSERT_TRUE(backup_servers.back()->ok());
    }
    options = Replicated(fabric, mode, ReplicationRole::kPrimary);
    options.device.faults.delay_us = kDelayUs;
    for (const auto& b : backup_servers) {
      options.replication.backups.push_back(b->replication_address());
    }
    std::unique_ptr<Server> primary = StartInProcess(options);
    ASSERT_NE(primary, nullptr);
    constexpr uint32_t kHistoryKeys = 8;  // few keys: reads race the writes of their key
    constexpr int kWriters = 2, kReaders = 3, kOpsPerThread = 1500;
    std::vector<std::vector<h::Event>> events(kWriters + kReaders);
    std::vector<uint64_t> busy(kWriters + kReaders, 0);
    std::vector<std::string> errors(kWriters + kReaders);
    std::vector<std::thread> threads;
    for (int t = 0; t < kWriters + kReaders; ++t) {
      // Readers 0 and 1 read a backup each; reader 2 reads the primary.
      const bool writer = t < kWriters;
      const int reader = t - kWriters;
      const std::string address = writer || reader == 2
                                      ? absl::StrCat("127.0.0.1:", primary->port())
                                      : backup_servers[reader]->address();
      threads.emplace_back([&, t, writer, address] {
        auto client = Connect(address, fabric, kDelayUs);
        if (client == nullptr) {
          errors[t] = "connect failed";
          return;
        }
        std::mt19937_64 rng(100 + t);
        const uint32_t max_value = client->config().slot_value_bytes();
        for (int i = 0; i < kOpsPerThread; ++i) {
          h::Event e;
          e.key = static_cast<uint32_t>(rng() % kHistoryKeys);
          e.writer = static_cast<uint32_t>(t);
          e.seq = static_cast<uint64_t>(i) + 1;
          const uint32_t dice = static_cast<uint32_t>(rng() % 10);
          // (No CAS: the library's CAS error carries no version for the checker; the model test
          // above checks CAS.)
          e.op = !writer ? Op::kGet : dice < 8 ? Op::kPut : Op::kDelete;
          std::string value;
          if (e.op == Op::kPut) {
            e.value_bytes = h::kValueHeaderBytes +
                            static_cast<uint32_t>(rng() % (max_value - h::kValueHeaderBytes + 1));
            value = h::EncodeValue({e.key, e.writer, e.seq, e.value_bytes});
          }
          const std::string key = absl::StrFormat("hk%03d", e.key);
          e.invoke_ns = h::MonotonicNowNs();
          absl::StatusOr<Value> got;
          absl::StatusOr<uint64_t> version;
          if (e.op == Op::kGet) {
            got = client->Get(key);
          } else if (e.op == Op::kPut) {
            version = client->Put(key, value);
          } else {
            version = client->Delete(key);
          }
          e.complete_ns = h::MonotonicNowNs();
          const absl::Status status = e.op == Op::kGet ? got.status() : version.status();
          if (absl::IsUnavailable(status)) {  // BACKUP_BUSY: no answer at all
            ++busy[t];
            continue;
          }
          if (status.ok()) {
            e.status = Status::kOk;
            e.version = e.op == Op::kGet ? got->version : *version;
            if (e.op == Op::kGet) h::RecordRead(got->value, &e);
          } else if (absl::IsNotFound(status)) {
            e.status = Status::kNotFound;
          } else {
            errors[t] = absl::StrCat("op ", i, ": ", status.ToString());
            return;
          }
          events[t].push_back(std::move(e));
        }
      });
    }
    for (std::thread& t : threads) t.join();
    std::vector<h::Event> all;
    uint64_t busy_total = 0;
    for (int t = 0; t < kWriters + kReaders; ++t) {
      ASSERT_TRUE(errors[t].empty()) << "thread " << t << ": " << errors[t];
      all.insert(all.end(), events[t].begin(), events[t].end());
      busy_total += busy[t];
    }
    const h::CheckResult result = h::Check(all);
    EXPECT_TRUE(result.ok()) << result.Summary();
    EXPECT_GT(result.values_read, 1000u) << "the readers read too little to mean anything";
    // A live primary's chains land in microseconds: a GET given up on because its copy kept
    // changing is rare (a descheduled fabric thread on a loaded machine makes bursts: the bound
    // is loose, the count reported). GETs held back because they read a write the primary had
    // not yet released are by design, and grow with the links' lag (about 3x under ASan): they
    // are counted apart (the backups' held_back) and not held to the bound.
    uint64_t held_back = 0;
    for (const auto& b : backup_servers) {
      absl::StatusOr<std::string> json = FetchServerStats(
          b->address(), absl::Seconds(10), transport::ConnectMode::kTcp, /*device=*/nullptr);
      ASSERT_TRUE(json.ok()) << json.status();
      const size_t at = json->find("\"held_back\":");
      ASSERT_NE(at, std::string::npos) << *json;
      held_back +=
          std::strtoull(json->c_str() + at + std::string("\"held_back\":").size(), nullptr, 10);
    }
    const uint64_t gave_up = busy_total > held_back ? busy_total - held_back : 0;
    EXPECT_LT(gave_up, uint64_t{kReaders} * kOpsPerThread / 20)
        << busy_total << " busy, " << held_back << " of them held back";
    RecordProperty(absl::StrCat("values_read_", std::string(mica::StoreModeName(mode))),
                   static_cast<int>(result.values_read));
    RecordProperty(absl::StrCat("busy_", std::string(mica::StoreModeName(mode))),
                   static_cast<int>(busy_total));
    RecordProperty(absl::StrCat("held_back_", std::string(mica::StoreModeName(mode))),
                   static_cast<int>(held_back));
  }
}

// Large values under replication: many large PUTs land at once, more than one batch's record
// (a third of the staging ring) could hold. The worker admits only as many per batch as fit, and
// none while the gate is backlogged, so no batch overflows and no backup is dropped (before,
// two large PUTs in one batch dropped every backup). Every value is then on the backup.
TEST(Replication, LargeWritesNeverOverflowARecordAndDropTheBackups) {
  constexpr uint32_t kLargeValue = 200 << 10;  // two of them exceed a 1 MiB ring's record
  constexpr uint32_t kClients = 4;
  constexpr int kRounds = 6;
  const std::string fabric = absl::StrCat("repl-large-", getpid());
  auto large = [&](ReplicationRole role) {
    ServerOptions o = Replicated(fabric, mica::StoreMode::kStore, role);
    o.config.max_value_bytes = 256 << 10;
    o.store.max_value_bytes = 256 << 10;
    o.config.landing_buffers = kClients;
    o.store.pool_bytes = 16 << 20;
    return o;
  };
  ServerProcess backup_server(large(ReplicationRole::kBackup));
  ASSERT_TRUE(backup_server.ok());
  ServerOptions options = large(ReplicationRole::kPrimary);
  ASSERT_GT(2 * uint64_t{kLargeValue}, MaxRecordBytes(options.replication.gate.staging_bytes));
  options.replication.backups.push_back(backup_server.replication_address());
  std::unique_ptr<Server> primary = StartInProcess(options);
  ASSERT_NE(primary, nullptr);
  ClientOptions co;
  co.server = absl::StrCat("127.0.0.1:", primary->port());
  co.device.fabric = fabric;
  co.clients = kClients;
  auto client = Client::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_GT(kLargeValue, (*client)->config().inline_limit());
  std::vector<std::string> expected(kClients);
  for (int round = 0; round < kRounds; ++round) {
    // Every logical client's large PUT in flight at once, to keys of one worker where possible.
    for (uint32_t c = 0; c < kClients; ++c) {
      expected[c] = std::string(kLargeValue, static_cast<char>('a' + (round * kClients + c) % 26));
      ASSERT_TRUE((*client)->Submit(c, Op::kPut, absl::StrCat("big", c), expected[c], 0, c).ok());
    }
    uint32_t done = 0;
    Result results[kClients];
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (done < kClients && absl::Now() < deadline) {
      const size_t n = (*client)->Poll(absl::MakeSpan(results));
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(results[i].status, Status::kOk) << StatusName(results[i].status);
      }
      done += static_cast<uint32_t>(n);
    }
    ASSERT_EQ(done, kClients);
  }
  const ServerStats stats = primary->Stats();
  EXPECT_EQ(stats.replication.links_dropped, 0u);
  EXPECT_EQ(stats.live_backups, 1u);
  // Every value, on the backup.
  ClientOptions bo = co;
  bo.server = backup_server.address();
  bo.clients = 1;
  auto backup = Client::Connect(bo);
  ASSERT_TRUE(backup.ok()) << backup.status();
  for (uint32_t c = 0; c < kClients; ++c) {
    const absl::StatusOr<Value> got = testing::BackupGet(**backup, absl::StrCat("big", c));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->value, expected[c]);
  }
}

// A staging ring whose record share cannot hold one batch of small writes and one largest value
// is refused at start, naming the size that works (no backup is contacted).
TEST(Replication, AStagingRingTooSmallForTheLargestValueIsRefusedAtStart) {
  ServerOptions options = Replicated(absl::StrCat("repl-small-ring-", getpid()),
                                     mica::StoreMode::kStore, ReplicationRole::kPrimary);
  options.config.max_value_bytes = 256 << 10;
  options.store.max_value_bytes = 256 << 10;
  options.replication.gate.staging_bytes = 256 << 10;
  options.replication.backups = {"127.0.0.1:1"};
  options.port = 0;
  options.listen_address = "127.0.0.1";
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  absl::Status status = server.ok() ? (*server)->Start() : server.status();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("--replication_staging_bytes=262144 is too small"),
            std::string::npos)
      << status;
}

// A backup killed with SIGKILL: its control connection closes, the primary drops it and goes
// on (degraded); the other backup stays exact.
TEST(Replication, AKilledBackupIsDroppedAndThePrimaryGoesOn) {
  const std::string fabric = absl::StrCat("repl-kill-", getpid());
  std::vector<std::unique_ptr<ServerProcess>> backup_servers;
  ServerOptions options = Replicated(fabric, mica::StoreMode::kStore, ReplicationRole::kBackup);
  for (int b = 0; b < 2; ++b) {
    backup_servers.push_back(std::make_unique<ServerProcess>(options));
    ASSERT_TRUE(backup_servers.back()->ok());
  }
  options = Replicated(fabric, mica::StoreMode::kStore, ReplicationRole::kPrimary);
  for (const auto& b : backup_servers) {
    options.replication.backups.push_back(b->replication_address());
  }
  std::unique_ptr<Server> primary = StartInProcess(options);
  ASSERT_NE(primary, nullptr);
  auto client = Connect(absl::StrCat("127.0.0.1:", primary->port()), fabric, 0);
  std::vector<std::unique_ptr<Client>> backups;
  for (const auto& b : backup_servers) backups.push_back(Connect(b->address(), fabric, 0));
  ASSERT_TRUE(client && backups[0] && backups[1]);
  std::vector<ModelEntry> model(kKeys);
  MutateAndCheck(*client, backups, model, 100, 11);
  backup_servers[0]->Kill();
  backups.erase(backups.begin());
  // Writes go on: each is acknowledged once the survivor holds it (the dead backup is dropped
  // when its control connection closes, or its chain stalls).
  MutateAndCheck(*client, backups, model, 200, 12);
  ExpectBackupsHold(backups, model, "after the kill");
  // The drop itself is asynchronous (the control thread sees the connection close, the gates
  // act within kStallCheckEvery loops): waited for, with a deadline.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (primary->Stats().replication.links_dropped < options.config.workers &&
         absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const ServerStats stats = primary->Stats();
  EXPECT_EQ(stats.live_backups, 1u);
  EXPECT_EQ(stats.replication.links_dropped, options.config.workers);
  const std::string json = StatsJson(stats, ServerStats{}, 1.0);
  EXPECT_NE(json.find("\"degraded\":true"), std::string::npos) << json;
}

// A backup whose chains stall past --replication_stall_ms is dropped; the primary tells it so,
// and from then on it answers no GET (its copy misses acknowledged writes) and refuses a
// promotion, even once the primary is gone.
TEST(Replication, AStalledBackupIsDroppedToldAndNeverPromoted) {
  const std::string fabric = absl::StrCat("repl-stall-", getpid());
  ServerOptions options = Replicated(fabric, mica::StoreMode::kCache, ReplicationRole::kBackup);
  options.config.workers = 1;
  auto backup = std::make_unique<ServerProcess>(options);
  ASSERT_TRUE(backup->ok());
  options = Replicated(fabric, mica::StoreMode::kCache, ReplicationRole::kPrimary);
  options.config.workers = 1;
  options.replication.backups = {backup->replication_address()};
  options.replication.gate.stall_timeout = absl::Milliseconds(20);
  // Links whose WRITEs execute a whole second late: the first chain stalls.
  options.replication.device = options.device;
  options.replication.device->faults.delay_us = 1000000;
  std::unique_ptr<Server> primary = StartInProcess(options);
  ASSERT_NE(primary, nullptr);
  auto client = Connect(absl::StrCat("127.0.0.1:", primary->port()), fabric, 0);
  ASSERT_NE(client, nullptr);
  // Acknowledged once the gate gave up on the backup (degraded): the write is the primary's only.
  absl::StatusOr<uint64_t> put = client->Put("k", "v");
  ASSERT_TRUE(put.ok()) << put.status();
  const ServerStats stats = primary->Stats();
  EXPECT_EQ(stats.live_backups, 0u);
  EXPECT_GE(stats.replication.stalls, 1u);
  // The backup learns it was dropped: reads answer BACKUP_BUSY (never "not found" for "k").
  auto reader = Connect(backup->address(), fabric, 0);
  ASSERT_NE(reader, nullptr);
  absl::Status got = reader->Get("k").status();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!absl::IsUnavailable(got) && absl::Now() < deadline) {
    EXPECT_FALSE(got.ok()) << "the backup has a value it was never sent";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polls for the notice
    got = reader->Get("k").status();
  }
  EXPECT_TRUE(absl::IsUnavailable(got)) << got;
  // The primary goes; the dropped backup refuses to take over.
  client.reset();
  primary.reset();
  const absl::StatusOr<std::string> promoted = testing::PromoteOnceDetached(backup->address());
  EXPECT_FALSE(promoted.ok());
  EXPECT_NE(promoted.status().message().find("dropped"), std::string::npos) << promoted.status();
}

// The kill-and-promote test's backup links execute each WRITE this late.
constexpr uint32_t kSlowLinkUs = 2000;
// ... plus up to this much more, drawn per chain and per link: the backups drift apart by up
// to 10 ms, longer than a reader thread waits for the CPU on this 2-core machine, so a backup
// reader can see a batch the other backup lacks while its write is still unanswered. (With
// the backups' released-watermark check disabled, about 1 run in 10 fails: runs 6, 10, 23 and
// 31 of 0..39, a lost or stale read after the other backup's promotion.)
constexpr uint32_t kLinkJitterUs = 10000;

// How many kill-and-promote runs (scripts/failover_check.sh asks for more).
int FailoverRuns() {
  const char* runs = getenv("HERD_FAILOVER_RUNS");
  return runs != nullptr ? std::max(1, atoi(runs)) : 4;
}
// The first run's number (HERD_FAILOVER_FIRST_RUN): every run's seeds derive from it.
int FailoverFirstRun() {
  const char* first = getenv("HERD_FAILOVER_FIRST_RUN");
  return first != nullptr ? std::max(0, atoi(first)) : 0;
}

// Kills the primary (SIGKILL) at a random point of a write load on two backups, promotes one
// backup (herd_admin promote's request), and checks one history of everything: every write
// acknowledged before the kill is visible at the new primary, nothing it returns is torn or
// older than what was acknowledged, and it takes new writes with newer versions.
TEST(Replication, KillThePrimaryPromoteABackupLoseNoAcknowledgedWrite) {
  namespace h = testing::history;
  const int first = FailoverFirstRun();
  for (int run = first; run < first + FailoverRuns(); ++run) {
    std::mt19937_64 rng(1000 + run);
    const mica::StoreMode mode = run % 2 == 0 ? mica::StoreMode::kStore : mica::StoreMode::kCache;
    SCOPED_TRACE(absl::StrCat("run ", run, " ", std::string(mica::StoreModeName(mode))));
    const std::string fabric = absl::StrCat("repl-failover-", getpid(), "-", run);
    // Half the runs on the asynchronous fabric: chains land late, so the kill finds some cut.
    const uint32_t delay_us = run % 4 < 2 ? 100 : 0;
    std::vector<std::unique_ptr<ServerProcess>> backups;
    ServerOptions options = Replicated(fabric, mode, ReplicationRole::kBackup);
    options.device.faults.delay_us = delay_us;
    for (int b = 0; b < 2; ++b) {
      backups.push_back(std::make_unique<ServerProcess>(options));
      ASSERT_TRUE(backups.back()->ok());
    }
    options = Replicated(fabric, mode, ReplicationRole::kPrimary);
    options.device.faults.delay_us = delay_us;
    // The links slower than the clients' fabric: an answer sent before its WRITEs complete
    // (a gate that acknowledged early) would reach its client long before the backups hold it.
    options.replication.device = options.device;
    options.replication.device->faults.delay_us = kSlowLinkUs;
    // Each link lags at random (per chain, in order): one backup holds a batch the other does
    // not yet, so a backup reader could see a write the promoted backup lacks, unless backups
    // answer nothing above the released watermark.
    options.replication.device->faults.delay_jitter_us = kLinkJitterUs;
    for (const auto& b : backups) options.replication.backups.push_back(b->replication_address());
    auto primary = std::make_unique<ServerProcess>(options);
    ASSERT_TRUE(primary->ok());
    constexpr uint32_t kFailoverKeys = 16;
    constexpr int kWriters = 2;
    // A random point of the load: after 20..400 acknowledged writes.
    const uint64_t kill_after = 20 + rng() % 381;
    std::atomic<uint64_t> acknowledged{0};
    std::atomic<int64_t> killed_ns{0};  // CLOCK_MONOTONIC of the SIGKILL
    std::atomic<bool> killed{false};
    // The backup whose reader saw an unanswered write and killed the primary (-1: none did).
    std::atomic<int> killed_by_backup{-1};
    const auto kill_once = [&] {
      if (killed.exchange(true)) return false;
      killed_ns.store(h::MonotonicNowNs());
      kill(primary->pid(), SIGKILL);
      return true;
    };
    // Each writer's last answered operation: the reader kills the primary the moment it reads
    // a write whose answer its writer has not had yet (a primary that lets a GET see a write
    // before the backups hold it then loses what a reader saw), once half the load ran.
    std::array<std::atomic<uint64_t>, kWriters> answered_seq{};
    // [0, kWriters): the writers; kWriters: the reads after the promotion; then readers of the
    // primary and of each backup under the load (a GET that saw a write the failover then took
    // back would make a later read stale).
    constexpr uint32_t kPrimaryReader = kWriters + 1;
    const size_t readers = 1 + backups.size();
    std::vector<std::vector<h::Event>> events(kPrimaryReader + readers);
    std::vector<std::string> errors(kWriters + readers);
    std::vector<std::thread> writers;
    // Writers stop only on an error; the last one to stop kills the primary if nothing did (its
    // reader, which stops only when the primary is gone, would otherwise read forever).
    std::atomic<int> writers_left{kWriters};
    struct LastOut {
      std::atomic<int>* left;
      std::function<void()> last;
      ~LastOut() {
        if (left->fetch_sub(1) == 1) last();
      }
    };
    for (int t = 0; t < kWriters; ++t) {
      writers.emplace_back([&, t] {
        const LastOut last_out{&writers_left, kill_once};
        ClientOptions o;
        o.server = primary->address();
        o.device.fabric = fabric;
        o.device.faults.delay_us = delay_us;
        o.retry_timeout = absl::Milliseconds(5);
        o.adaptive_retry = false;
        // A write fails only because the primary died: the client's health check (its control
        // connection closed) ends what is outstanding then. Giving up after a count of
        // retransmissions instead (20 x 5 ms) ended writes to a live primary that a loaded
        // machine or ASan slowed past 100 ms, and the load never got going (seen in CI).
        o.max_attempts = 10000;  // 50 s of 5 ms timeouts, within request_deadline
        o.request_deadline = absl::Seconds(60);
        auto client = Client::Connect(o);
        if (!client.ok()) {
          errors[t] = client.status().ToString();
          return;
        }
        std::mt19937_64 wrng(5000 + run * 10 + t);
        const uint32_t max_value = (*client)->config().slot_value_bytes();
        for (uint64_t seq = 1;; ++seq) {
          h::Event e;
          e.key = static_cast<uint32_t>(wrng() % kFailoverKeys);
          e.writer = static_cast<uint32_t>(t);
          e.seq = seq;
          e.op = wrng() % 5 == 0 ? Op::kDelete : Op::kPut;
          std::string value;
          if (e.op == Op::kPut) {
            e.value_bytes = h::kValueHeaderBytes +
                            static_cast<uint32_t>(wrng() % (max_value - h::kValueHeaderBytes + 1));
            value = h::EncodeValue({e.key, e.writer, e.seq, e.value_bytes});
          }
          const std::string key = absl::StrFormat("fk%03d", e.key);
          e.invoke_ns = h::MonotonicNowNs();
          const absl::StatusOr<uint64_t> version =
              e.op == Op::kPut ? (*client)->Put(key, value) : (*client)->Delete(key);
          e.complete_ns = h::MonotonicNowNs();
          if (version.ok()) {
            e.status = Status::kOk;
            e.version = *version;
          } else if (absl::IsNotFound(version.status())) {
            e.status = Status::kNotFound;
          } else {
            // The primary died with this write unanswered: it may or may not have happened.
            e.status = Status::kTimedOut;
            e.complete_ns = h::kNever;
            events[t].push_back(std::move(e));
            return;
          }
          events[t].push_back(std::move(e));
          answered_seq[t].store(seq);
          // The kill, right after an acknowledgement: the writes the primary acknowledged last
          // (and those of the other writer, in flight) are the ones a gate that answered early
          // would lose.
          if (acknowledged.fetch_add(1) + 1 == kill_after) kill_once();
        }
      });
    }
    // Readers of the primary and of each backup (one history with everything else). A backup's
    // BACKUP_BUSY is no answer; its readers stop once the writers and the primary's reader did.
    std::atomic<bool> stop_readers{false};
    const auto read_loop = [&](const std::string& server, uint32_t id, bool until_stopped) {
      ClientOptions o;
      o.server = server;
      o.device.fabric = fabric;
      o.device.faults.delay_us = delay_us;
      o.retry_timeout = absl::Milliseconds(5);
      o.adaptive_retry = false;
      o.max_attempts = 10000;  // as the writers'
      o.request_deadline = absl::Seconds(60);
      auto client = Client::Connect(o);
      if (!client.ok()) {
        errors[id - kPrimaryReader + kWriters] = client.status().ToString();
        return;
      }
      std::mt19937_64 rrng(7000 + run * 10 + id);
      for (uint64_t seq = 1; !until_stopped || !stop_readers.load(); ++seq) {
        h::Event e;
        e.key = static_cast<uint32_t>(rrng() % kFailoverKeys);
        e.writer = id;
        e.seq = seq;
        e.op = Op::kGet;
        e.invoke_ns = h::MonotonicNowNs();
        const absl::StatusOr<Value> got = (*client)->Get(absl::StrFormat("fk%03d", e.key));
        e.complete_ns = h::MonotonicNowNs();
        if (got.ok()) {
          e.status = Status::kOk;
          e.version = got->version;
          h::RecordRead(got->value, &e);
        } else if (absl::IsNotFound(got.status())) {
          e.status = Status::kNotFound;
        } else if (until_stopped) {
          continue;  // BACKUP_BUSY (or a timeout): no answer, nothing to check
        } else {
          return;  // the primary died: an unanswered GET says nothing
        }
        const bool unanswered_write = e.read_well_formed && e.read.writer < kWriters &&
                                      e.read.seq > answered_seq[e.read.writer].load();
        events[id].push_back(std::move(e));
        if (unanswered_write && acknowledged.load() >= kill_after / 2 && kill_once() &&
            id > kPrimaryReader) {
          killed_by_backup.store(static_cast<int>(id - kPrimaryReader - 1));
        }
      }
    };
    writers.emplace_back(read_loop, primary->address(), kPrimaryReader, false);
    std::vector<std::thread> backup_readers;
    for (size_t b = 0; b < backups.size(); ++b) {
      backup_readers.emplace_back(read_loop, backups[b]->address(),
                                  static_cast<uint32_t>(kPrimaryReader + 1 + b), true);
    }
    for (std::thread& t : writers) t.join();
    stop_readers.store(true);
    for (std::thread& t : backup_readers) t.join();
    primary->Kill();  // reaps it
    for (const std::string& error : errors) ASSERT_TRUE(error.empty()) << error;
    ASSERT_GE(acknowledged.load(), kill_after / 2) << "the load never got going";
    // Promote one backup, as `herd_admin promote` does: refused until it saw its primary go.
    // When a backup's reader saw an unanswered write, the OTHER backup: the one that may lack
    // it (the links drift apart), so a backup that answered it would make a later read stale.
    const size_t random_choice = rng() % backups.size();
    const size_t chosen = killed_by_backup.load() >= 0
                              ? (static_cast<size_t>(killed_by_backup.load()) + 1) % backups.size()
                              : random_choice;
    const absl::StatusOr<std::string> promoted =
        testing::PromoteOnceDetached(backups[chosen]->address());
    ASSERT_TRUE(promoted.ok()) << promoted.status();
    // Failover time as an operator sees it: from the kill to the promotion's answer (the
    // backup noticing its primary's death included).
    const double promotion_ms = static_cast<double>(h::MonotonicNowNs() - killed_ns.load()) / 1e6;
    EXPECT_NE(promoted->find("\"promoted\":true"), std::string::npos) << *promoted;
    // Every key read at the new primary, then a new write and its read.
    auto reader = Connect(backups[chosen]->address(), fabric, delay_us);
    ASSERT_NE(reader, nullptr);
    std::vector<h::Event>& reads = events[kWriters];
    for (uint32_t k = 0; k < kFailoverKeys; ++k) {
      h::Event e;
      e.key = k;
      e.writer = kWriters;
      e.seq = k + 1;
      e.op = Op::kGet;
      e.invoke_ns = h::MonotonicNowNs();
      const absl::StatusOr<Value> got = reader->Get(absl::StrFormat("fk%03d", k));
      e.complete_ns = h::MonotonicNowNs();
      ASSERT_TRUE(got.ok() || absl::IsNotFound(got.status())) << got.status();
      e.status = got.ok() ? Status::kOk : Status::kNotFound;
      if (got.ok()) {
        e.version = got->version;
        h::RecordRead(got->value, &e);
      }
      reads.push_back(std::move(e));
    }
    {
      h::Event e;
      e.key = 0;
      e.writer = kWriters;
      e.seq = kFailoverKeys + 1;
      e.op = Op::kPut;
      e.value_bytes = h::kValueHeaderBytes;
      e.invoke_ns = h::MonotonicNowNs();
      const absl::StatusOr<uint64_t> put =
          reader->Put("fk000", h::EncodeValue({0, kWriters, e.seq, e.value_bytes}));
      e.complete_ns = h::MonotonicNowNs();
      ASSERT_TRUE(put.ok()) << "the new primary takes writes: " << put.status();
      e.version = *put;
      // The promoted clock jumped past every version the dead primary could have handed out.
      EXPECT_GT(*put, uint64_t{1} << 32);
      reads.push_back(std::move(e));
    }
    std::vector<h::Event> all;
    for (const auto& v : events) all.insert(all.end(), v.begin(), v.end());
    const h::CheckResult result = h::Check(all);
    // One line per run for scripts/failover_check.sh, before any verdict.
    uint64_t acked_writes = 0;
    for (int t = 0; t < kWriters; ++t) {
      for (const h::Event& e : events[t]) acked_writes += e.unknown() ? 0 : 1;
    }
    testing::ReportRun(absl::StrFormat(
        "FAILOVER_RUN {\"run\":%d,\"acked_writes\":%d,\"lost\":%d,\"stale_reads\":%d,"
        "\"violations\":%d,\"promotion_ms\":%.3f,\"killed_by_backup\":%d,"
        "\"promoted\":%d,\"backup_reads\":%d}",
        run, acked_writes, result.Count(h::Rule::kLostWrite), result.Count(h::Rule::kStaleRead),
        result.violations.size(), promotion_ms, killed_by_backup.load(), chosen,
        events[kPrimaryReader + 1].size() + events[kPrimaryReader + 2].size()));
    ASSERT_TRUE(result.ok()) << result.Summary();
    // Promoting it again changes nothing.
    absl::StatusOr<std::string> again =
        RequestPromotion(backups[chosen]->address(), absl::Seconds(10));
    EXPECT_TRUE(again.ok() && again->find("already") != std::string::npos);
  }
}

// What a backup refuses, each with a reason, and goes on serving after.
TEST(Replication, ABackupRefusesWhatIsNotItsPrimary) {
  const std::string fabric = absl::StrCat("repl-refuse-", getpid());
  ServerOptions backup_options =
      Replicated(fabric, mica::StoreMode::kCache, ReplicationRole::kBackup);
  std::unique_ptr<Server> backup = StartInProcess(backup_options);
  ASSERT_NE(backup, nullptr);
  const std::string replication = absl::StrCat("127.0.0.1:", backup->replication_port());
  ServerOptions primary_options =
      Replicated(fabric, mica::StoreMode::kCache, ReplicationRole::kPrimary);
  primary_options.replication.backups = {replication};
  const auto refusal = [&](ServerOptions options) {
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
    EXPECT_FALSE(server.ok());
    return server.ok() ? std::string("attached") : server.status().ToString();
  };
  {  // A layout that differs (another log size): every offset would mean something else.
    ServerOptions other = primary_options;
    other.store.log_bytes *= 2;
    EXPECT_NE(refusal(other).find("differ"), std::string::npos);
  }
  {  // A staging ring the redo areas do not match.
    ServerOptions other = primary_options;
    other.replication.gate.staging_bytes *= 2;
    EXPECT_NE(refusal(other).find("staging"), std::string::npos);
  }
  {  // Another worker count.
    ServerOptions other = primary_options;
    other.config.workers = 1;
    EXPECT_NE(refusal(other).find("workers"), std::string::npos);
  }
  {  // A malformed hello: refused with an error message, the backup goes on.
    auto channel = transport::control::Channel::Connect(replication, absl::Seconds(5));
    ASSERT_TRUE(channel.ok());
    ASSERT_TRUE(channel->Send(kReplicaHello, {1, 2, 3}).ok());
    auto reply = channel->Receive(absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->type, kError);
  }
  {  // Something else than a hello.
    auto channel = transport::control::Channel::Connect(replication, absl::Seconds(5));
    ASSERT_TRUE(channel.ok());
    ASSERT_TRUE(channel->Send(kHello, Encode(Hello{})).ok());
    auto reply = channel->Receive(absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->type, kError);
  }
  // The right primary attaches, a second one is refused.
  // Nothing to promote on a backup that never had a primary.
  const absl::StatusOr<std::string> orphan =
      RequestPromotion(absl::StrCat("127.0.0.1:", backup->port()), absl::Seconds(10));
  EXPECT_TRUE(!orphan.ok() && orphan.status().message().find("never had") != std::string::npos)
      << orphan.status();
  std::unique_ptr<Server> primary = StartInProcess(primary_options);
  ASSERT_NE(primary, nullptr);
  EXPECT_NE(refusal(primary_options).find("attached"), std::string::npos);
  auto client = Connect(absl::StrCat("127.0.0.1:", primary->port()), fabric, 0);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("k", "v").ok());
  // No promotion while the primary is attached (two primaries would diverge), nor of a server
  // that is not a backup.
  const absl::StatusOr<std::string> early =
      RequestPromotion(absl::StrCat("127.0.0.1:", backup->port()), absl::Seconds(10));
  EXPECT_TRUE(!early.ok() && early.status().message().find("still attached") != std::string::npos)
      << early.status();
  const absl::StatusOr<std::string> not_backup =
      RequestPromotion(absl::StrCat("127.0.0.1:", primary->port()), absl::Seconds(10));
  EXPECT_TRUE(!not_backup.ok() &&
              not_backup.status().message().find("not a backup") != std::string::npos)
      << not_backup.status();
  // The primary leaves; the backup keeps its data and refuses a new primary over it (no state
  // transfer yet), rather than mirror only what the newcomer changes.
  client.reset();
  primary.reset();
  for (int i = 0; i < 500 && backup->Stats().primary_attached; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polls for the detach
  }
  ASSERT_FALSE(backup->Stats().primary_attached);
  EXPECT_NE(refusal(primary_options).find("earlier primary"), std::string::npos);
  auto reader = Connect(absl::StrCat("127.0.0.1:", backup->port()), fabric, 0);
  ASSERT_NE(reader, nullptr);
  absl::StatusOr<Value> got = reader->Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value, "v");
}

}  // namespace
}  // namespace herd
