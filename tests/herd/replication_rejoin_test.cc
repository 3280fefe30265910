// A backup killed under load and restarted empty rejoins its running primary (issue 16): the
// primary attaches to it again, copies each partition to it by state transfer while writes go
// on (ReplicationGate::OfferLink), and only then counts it and tells it to serve reads. The
// rejoined backup then holds every acknowledged write, serves them, and can be promoted.
#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "herd/join.h"
#include "herd/replication/link.h"
#include "herd/replication/outcome_table.h"
#include "mica/partition.h"
#include "tests/herd/replication_workload.h"
#include "tests/herd/server_fixture.h"
#include "transport/control/channel.h"

namespace herd {
namespace {

using testing::BackupGet;
using testing::JsonNumber;
using testing::ReplicatedServer;
using testing::ServerProcess;

constexpr int kWriters = 2;
constexpr uint32_t kKeysPerWriter = 24;
// Acknowledged writes before the kill, and after the rejoin completed.
constexpr uint64_t kWritesBeforeKill = 200;
constexpr uint64_t kWritesAfterRejoin = 200;
// How long the primary may take to notice, reattach and transfer (generous: 2 cores, ASan).
constexpr absl::Duration kRejoinDeadline = absl::Seconds(60);
// How long a primary's attach waits for a backup's welcome (herd/replication/member_primary.cc,
// kRejoinWelcomeTimeout).
constexpr absl::Duration kWelcomeTimeout = absl::Seconds(10);

// Polls the server at `address` until `done(stats)` holds; the last stats, or an error.
template <typename Done>
absl::StatusOr<std::string> AwaitStats(const std::string& address, Done done) {
  const absl::Time give_up = absl::Now() + kRejoinDeadline;
  absl::StatusOr<std::string> stats;
  while (absl::Now() < give_up) {
    stats = FetchServerStats(address, absl::Seconds(5));
    if (stats.ok() && done(*stats)) return stats;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError(absl::StrCat("condition not met; last stats: ",
                                                  stats.ok() ? *stats : stats.status().ToString()));
}

std::string Key(int writer, uint32_t k) { return absl::StrFormat("w%d-%03d", writer, k); }

TEST(ReplicationRejoin, AKilledBackupRestartedEmptyIsBroughtUpToDateUnderLoad) {
  for (const mica::StoreMode mode : {mica::StoreMode::kStore, mica::StoreMode::kCache}) {
    SCOPED_TRACE(std::string(mica::StoreModeName(mode)));
    const std::string fabric = absl::StrCat("repl-rejoin-", getpid(), "-", static_cast<int>(mode));
    ServerOptions backup_options = ReplicatedServer(fabric, mode, ReplicationRole::kBackup);
    auto doomed = std::make_unique<ServerProcess>(backup_options);
    ServerProcess survivor(backup_options);
    ASSERT_TRUE(doomed->ok() && survivor.ok());
    ServerOptions options = ReplicatedServer(fabric, mode, ReplicationRole::kPrimary);
    options.replication.backups = {doomed->replication_address(), survivor.replication_address()};
    auto primary = std::make_unique<ServerProcess>(options);
    ASSERT_TRUE(primary->ok());

    // Cold keys: written once before anything else and never again, so only the state transfer
    // can bring them to the restarted backup.
    constexpr int kColdKeys = 16;
    {
      ClientOptions o;
      o.server = primary->address();
      o.device.fabric = fabric;
      auto loader = Client::Connect(o);
      ASSERT_TRUE(loader.ok()) << loader.status();
      for (int i = 0; i < kColdKeys; ++i) {
        ASSERT_TRUE((*loader)->Put(absl::StrCat("cold", i), absl::StrCat("cold value ", i)).ok());
      }
    }
    std::atomic<uint64_t> acknowledged{0};
    std::atomic<bool> stop{false};
    std::vector<std::vector<testing::ModelEntry>> models(
        kWriters, std::vector<testing::ModelEntry>(kKeysPerWriter));
    std::vector<std::string> errors(kWriters);
    std::vector<std::thread> writers;
    for (int t = 0; t < kWriters; ++t) {
      writers.emplace_back([&, t] {
        ClientOptions o;
        o.server = primary->address();
        o.device.fabric = fabric;
        o.retry_timeout = absl::Milliseconds(5);
        auto client = Client::Connect(o);
        if (!client.ok()) {
          errors[t] = client.status().ToString();
          return;
        }
        std::mt19937_64 rng(99 + t);
        for (uint64_t i = 0; !stop.load(); ++i) {
          const auto k = static_cast<uint32_t>(rng() % kKeysPerWriter);
          testing::ModelEntry& m = models[t][k];
          if (rng() % 5 == 0 && m.present) {
            absl::StatusOr<uint64_t> del = (*client)->Delete(Key(t, k));
            if (!del.ok()) {
              errors[t] = absl::StrCat("delete: ", del.status().ToString());
              return;
            }
            m = testing::ModelEntry{false, "", *del};
          } else {
            const std::string value = absl::StrCat("w", t, "#", i, std::string(rng() % 40, 'v'));
            absl::StatusOr<uint64_t> put = (*client)->Put(Key(t, k), value);
            if (!put.ok()) {
              errors[t] = absl::StrCat("put: ", put.status().ToString());
              return;
            }
            m = testing::ModelEntry{true, value, *put};
          }
          acknowledged.fetch_add(1);
        }
      });
    }
    auto await_acks = [&](uint64_t target) {
      while (acknowledged.load() < target && errors[0].empty() && errors[1].empty()) {
        std::this_thread::yield();
      }
    };
    await_acks(kWritesBeforeKill);
    // The backup dies; the primary goes on degraded.
    const std::string replication_address = doomed->replication_address();
    const int replication_port =
        std::stoi(replication_address.substr(replication_address.rfind(':') + 1));
    doomed->Kill();
    absl::StatusOr<std::string> stats = AwaitStats(primary->address(), [](const std::string& s) {
      return JsonNumber(s, "live_backups") == 1;
    });
    ASSERT_TRUE(stats.ok()) << stats.status();
    // It restarts empty on the same replication port; the primary reattaches it, transfers the
    // partitions while the writers go on, and counts it again.
    ServerOptions restarted_options = backup_options;
    restarted_options.replication.port = static_cast<uint16_t>(replication_port);
    auto restarted = std::make_unique<ServerProcess>(restarted_options);
    ASSERT_TRUE(restarted->ok());
    {
      // Before (or while) the primary brings it up to date, its empty region answers nothing:
      // never NOT_FOUND for a key the primary holds.
      ClientOptions o;
      o.server = restarted->address();
      o.device.fabric = fabric;
      auto early = Client::Connect(o);
      ASSERT_TRUE(early.ok()) << early.status();
      const absl::StatusOr<Value> got = (*early)->Get("cold0");
      EXPECT_FALSE(absl::IsNotFound(got.status())) << "an empty restarted backup answered a miss";
      if (got.ok()) {
        EXPECT_EQ(got->value, "cold value 0");
      }
    }
    stats = AwaitStats(primary->address(), [](const std::string& s) {
      return JsonNumber(s, "live_backups") == 2 && JsonNumber(s, "joined") >= 1;
    });
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_GT(JsonNumber(*stats, "transfer_bytes"), 0) << *stats;
    absl::StatusOr<std::string> backup_stats = AwaitStats(
        restarted->address(),
        [](const std::string& s) { return s.find("\"syncing\":false") != std::string::npos; });
    ASSERT_TRUE(backup_stats.ok()) << backup_stats.status();
    await_acks(acknowledged.load() + kWritesAfterRejoin);
    stop.store(true);
    for (std::thread& t : writers) t.join();
    for (int t = 0; t < kWriters; ++t) ASSERT_TRUE(errors[t].empty()) << errors[t];

    // Every acknowledged write, on the rejoined backup.
    ClientOptions o;
    o.server = restarted->address();
    o.device.fabric = fabric;
    auto reader = Client::Connect(o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto expect_holds = [&](Client& client, const std::string& who) {
      for (int i = 0; i < kColdKeys; ++i) {
        const absl::StatusOr<Value> got = BackupGet(client, absl::StrCat("cold", i));
        ASSERT_TRUE(got.ok()) << who << " cold" << i << ": " << got.status();
        EXPECT_EQ(got->value, absl::StrCat("cold value ", i)) << who;
      }
      for (int t = 0; t < kWriters; ++t) {
        for (uint32_t k = 0; k < kKeysPerWriter; ++k) {
          const testing::ModelEntry& m = models[t][k];
          const absl::StatusOr<Value> got = BackupGet(client, Key(t, k));
          if (m.present) {
            ASSERT_TRUE(got.ok()) << who << " " << Key(t, k) << ": " << got.status();
            EXPECT_EQ(got->value, m.value) << who << " " << Key(t, k);
            EXPECT_EQ(got->version, m.version) << who << " " << Key(t, k);
          } else {
            EXPECT_TRUE(absl::IsNotFound(got.status())) << who << " " << Key(t, k);
          }
        }
      }
    };
    expect_holds(**reader, "rejoined backup");
    // And it can take over: the primary dies, the rejoined backup is promoted and holds it all.
    primary->Kill();
    absl::StatusOr<std::string> promoted = testing::PromoteOnceDetached(restarted->address());
    ASSERT_TRUE(promoted.ok()) << promoted.status();
    reader->reset();
    reader = Client::Connect(o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    expect_holds(**reader, "promoted backup");
    absl::StatusOr<uint64_t> put = (*reader)->Put("after", "promotion");
    EXPECT_TRUE(put.ok()) << put.status();
  }
}

// Issue 35: attaching a backup again runs on a thread of its own. A restarted backup may take
// seconds to answer a primary's hello (it registers its partitions first); the primary's control
// thread, which admits clients, used to wait for that answer. Here the lost backup's port is
// taken by a listener that accepts the primary's attach and never answers: a client joins the
// primary and writes while the primary still waits on it.
TEST(ReplicationRejoin, ClientsJoinWhileALostBackupIsSlowToWelcomeItsPrimary) {
  const std::string fabric = absl::StrCat("repl-slow-welcome-", getpid());
  ServerOptions backup_options =
      ReplicatedServer(fabric, mica::StoreMode::kStore, ReplicationRole::kBackup);
  auto doomed = std::make_unique<ServerProcess>(backup_options);
  ASSERT_TRUE(doomed->ok());
  ServerOptions options =
      ReplicatedServer(fabric, mica::StoreMode::kStore, ReplicationRole::kPrimary);
  options.replication.backups = {doomed->replication_address()};
  ServerProcess primary(options);
  ASSERT_TRUE(primary.ok());
  const std::string replication_address = doomed->replication_address();
  const auto replication_port = static_cast<uint16_t>(
      std::stoi(replication_address.substr(replication_address.rfind(':') + 1)));
  doomed->Kill();
  absl::StatusOr<std::string> stats = AwaitStats(
      primary.address(), [](const std::string& s) { return JsonNumber(s, "live_backups") == 0; });
  ASSERT_TRUE(stats.ok()) << stats.status();
  absl::StatusOr<transport::control::Listener> silent =
      transport::control::Listener::Listen("127.0.0.1", replication_port);
  ASSERT_TRUE(silent.ok()) << silent.status();
  // The primary's next attempt (one a second) connects, sends its hello and waits.
  absl::StatusOr<transport::control::Channel> attach = silent->Accept(kRejoinDeadline);
  ASSERT_TRUE(attach.ok()) << attach.status();
  ClientOptions o;
  o.server = primary.address();
  o.device.fabric = fabric;
  o.connect_timeout = kRejoinDeadline;  // however long it takes: the order is the point
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<uint64_t> put = (*client)->Put("during", "a slow rejoin");
  ASSERT_TRUE(put.ok()) << put.status();
  // Joined and written while the primary still waits for the welcome (it gives up after 10 s
  // and closes the connection): the join did not wait on the attach.
  EXPECT_FALSE(attach->PeerClosed()) << "the client's join waited for the backup's welcome";
  // And a stop does not wait it out either: the primary shuts down (cleanly: ServerProcess::Stop
  // checks) long before the attach's 10 s would end, a silent backup holding nothing up.
  client->reset();
  const absl::Time stopping = absl::Now();
  primary.Stop();
  EXPECT_LT(absl::Now() - stopping, kWelcomeTimeout / 2)
      << "the stop waited for the silent backup's welcome";
}

// A backup that is told to expect a state transfer serves no read and refuses promotion until
// the transfer completes; one whose primary leaves mid-transfer is never promoted.
TEST(ReplicationRejoin, ABackupWhosePrimaryLeavesMidTransferIsNeverPromoted) {
  const std::string fabric = absl::StrCat("repl-midtransfer-", getpid());
  ServerProcess backup(ReplicatedServer(fabric, mica::StoreMode::kStore, ReplicationRole::kBackup));
  ASSERT_TRUE(backup.ok());
  // A primary's hello with transfer set, and then it vanishes: what a primary that died during
  // a state transfer leaves behind.
  absl::StatusOr<transport::control::Channel> channel =
      transport::control::Channel::Connect(backup.replication_address(), absl::Seconds(5));
  ASSERT_TRUE(channel.ok()) << channel.status();
  ServerOptions options =
      ReplicatedServer(fabric, mica::StoreMode::kStore, ReplicationRole::kPrimary);
  auto partition = mica::Partition::Create([&] {
    // As herd::Server sizes a replicated partition.
    mica::PartitionConfig store = options.store;
    store.max_value_bytes = std::min(store.max_value_bytes, options.config.value_limit());
    store.checksum_from_value_bytes = 0;
    store.owner_area_bytes = OutcomeTableBytes(options.config);
    return store;
  }());
  ASSERT_TRUE(partition.ok()) << partition.status();
  ReplicaHello hello;
  hello.workers = options.config.workers;
  hello.staging_bytes = options.replication.gate.staging_bytes;
  hello.layout = LayoutOf(**partition);
  hello.transfer = true;
  hello.max_clients = options.config.max_clients;
  hello.window = options.config.window;
  transport::DeviceOptions device = options.device;
  auto opened = transport::OpenDevice(device);
  ASSERT_TRUE(opened.ok());
  auto pd = (*opened)->AllocatePd();
  auto cq = (*opened)->CreateCq(16);
  ASSERT_TRUE(pd.ok() && cq.ok());
  std::vector<std::unique_ptr<transport::QueuePair>> qps;
  for (uint32_t w = 0; w < hello.workers; ++w) {
    transport::QpConfig qc;
    qc.type = transport::QpType::kRc;
    qc.send_cq = cq->get();
    qc.recv_cq = cq->get();
    auto qp = (*pd)->CreateQp(qc);
    ASSERT_TRUE(qp.ok());
    hello.link_qps.push_back((*qp)->endpoint());
    qps.push_back(*std::move(qp));
  }
  ASSERT_TRUE(channel->Send(kReplicaHello, Encode(hello)).ok());
  absl::StatusOr<transport::control::Message> welcome =
      Expect(*channel, kReplicaWelcome, absl::Seconds(5));
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  absl::StatusOr<std::string> stats = FetchServerStats(backup.address(), absl::Seconds(5));
  ASSERT_TRUE(stats.ok());
  EXPECT_NE(stats->find("\"syncing\":true"), std::string::npos) << *stats;
  // Reads are refused while syncing.
  ClientOptions o;
  o.server = backup.address();
  o.device.fabric = fabric;
  auto reader = Client::Connect(o);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE(absl::IsUnavailable((*reader)->Get("anything").status()));
  // The "primary" leaves mid-transfer.
  *channel = transport::control::Channel(-1);
  absl::StatusOr<std::string> promoted = testing::PromoteOnceDetached(backup.address());
  ASSERT_FALSE(promoted.ok());
  EXPECT_NE(promoted.status().message().find("state transfer"), std::string::npos)
      << promoted.status();
  EXPECT_TRUE(absl::IsUnavailable((*reader)->Get("anything").status()));
}

}  // namespace
}  // namespace herd
