// ReplicationMember on its own: a primary and a backup, each over a fake ReplicationHost (a shm
// device, two partitions, tasks run on the calling thread), with no server, no worker and no
// client linked in: what the roles need of the engine is that interface and nothing more. The
// servers' own tests (replication_e2e_test, replication_rejoin_test, the coordinated ones) run
// the same member inside herd_server.
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "herd/config.h"
#include "herd/replication/member.h"
#include "herd/replication/outcome_table.h"
#include "herd/replication/role.h"
#include "mica/partition.h"
#include "transport/fabric.h"

namespace herd {
namespace {

constexpr uint32_t kWorkers = 2;
constexpr uint64_t kStagingBytes = 1 << 20;
constexpr uint64_t kLogBytes = uint64_t{4} << 20;
constexpr uint32_t kExpectedItems = 4096;
// How long the backup's replication thread may take to see its primary come or go (it polls
// every 20 ms; generous for sanitizers on 2 cores).
constexpr absl::Duration kNoticeDeadline = absl::Seconds(30);

Config SmallConfig() {
  Config config;
  config.workers = kWorkers;
  config.max_clients = 16;
  return config;
}

// The engine as the member sees it. Tasks run here, on whichever thread asks (the backup's
// replication thread when its primary leaves, the test's for a promotion), as a worker runs one
// between two batches.
class FakeHost : public ReplicationHost {
 public:
  explicit FakeHost(const std::string& fabric) {
    transport::DeviceOptions device;
    device.fabric = fabric;
    absl::StatusOr<std::unique_ptr<transport::Device>> opened = transport::OpenDevice(device);
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (opened.ok()) device_ = *std::move(opened);
    mica::PartitionConfig store;
    store.log_bytes = kLogBytes;
    store.expected_items = kExpectedItems;
    store.try_hugepages = false;
    // As a replicated server's: every item checksummed, the outcome table in the owner area.
    store.checksum_from_value_bytes = 0;
    store.owner_area_bytes = OutcomeTableBytes(SmallConfig());
    for (uint32_t w = 0; w < kWorkers; ++w) {
      absl::StatusOr<std::unique_ptr<mica::Partition>> partition = mica::Partition::Create(store);
      EXPECT_TRUE(partition.ok()) << partition.status();
      if (partition.ok()) partitions_.push_back(*std::move(partition));
    }
  }

  transport::Device& device() override { return *device_; }
  bool stopping() const override { return stopping_.load(); }
  uint16_t client_port() const override { return 0; }
  std::vector<std::string> RunOnWorkers(absl::Span<ReplicaTask* const> tasks) override {
    EXPECT_EQ(tasks.size(), partitions_.size());
    std::vector<std::string> failures;
    for (size_t w = 0; w < tasks.size(); ++w) {
      ReplicaTask* task = tasks[w];
      task->status = task->apply(*partitions_[w]);
      if (!task->status.ok()) failures.push_back(task->status.ToString());
      task->done.store(true, std::memory_order_release);
    }
    (tasks[0]->take_writes ? promotions_ : repairs_).fetch_add(1);
    return failures;
  }

  std::vector<mica::Partition*> partitions() {
    std::vector<mica::Partition*> raw;
    for (const auto& p : partitions_) raw.push_back(p.get());
    return raw;
  }
  void Stop() { stopping_.store(true); }
  int repairs() const { return repairs_.load(); }
  int promotions() const { return promotions_.load(); }

 private:
  std::unique_ptr<transport::Device> device_;
  std::vector<std::unique_ptr<mica::Partition>> partitions_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> repairs_{0}, promotions_{0};
};

ReplicationServerOptions Options(ReplicationRole role) {
  ReplicationServerOptions options;
  options.role = role;
  options.listen_address = "127.0.0.1";
  options.gate.staging_bytes = kStagingBytes;
  options.connect_timeout = absl::Seconds(10);
  return options;
}

absl::StatusOr<std::unique_ptr<ReplicationMember>> Member(FakeHost& host, ServerRole& role,
                                                          const ReplicationServerOptions& options) {
  return ReplicationMember::Create(host, role, SmallConfig(), options,
                                   transport::PagePolicy::kSmall, host.partitions());
}

// Polls `condition` until it holds or kNoticeDeadline passed.
template <typename Condition>
bool Eventually(Condition condition) {
  const absl::Time deadline = absl::Now() + kNoticeDeadline;
  while (!condition()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST(ReplicationMember, IsNoMemberWithoutAGroupOrWithoutAPartitionPerWorker) {
  const std::string fabric = absl::StrCat("member-refuse-", getpid());
  FakeHost host(fabric);
  ServerRole alone(ReplicationRole::kNone);
  absl::StatusOr<std::unique_ptr<ReplicationMember>> none =
      Member(host, alone, Options(ReplicationRole::kNone));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("without replication"), std::string::npos)
      << none.status();
  ServerRole backup(ReplicationRole::kBackup);
  std::vector<mica::Partition*> one = host.partitions();
  one.pop_back();
  absl::StatusOr<std::unique_ptr<ReplicationMember>> short_of_one =
      ReplicationMember::Create(host, backup, SmallConfig(), Options(ReplicationRole::kBackup),
                                transport::PagePolicy::kSmall, one);
  ASSERT_FALSE(short_of_one.ok());
  EXPECT_NE(short_of_one.status().message().find("1 partitions for 2 workers"), std::string::npos)
      << short_of_one.status();
  ServerRole primary(ReplicationRole::kPrimary);
  absl::StatusOr<std::unique_ptr<ReplicationMember>> no_backups =
      Member(host, primary, Options(ReplicationRole::kPrimary));
  ASSERT_FALSE(no_backups.ok());
  EXPECT_NE(no_backups.status().message().find("--backups"), std::string::npos)
      << no_backups.status();
}

TEST(ReplicationMember, AttachesDetachesAndPromotesThroughItsHostAlone) {
  const std::string fabric = absl::StrCat("member-roles-", getpid());
  FakeHost backup_host(fabric);
  ServerRole backup_role(ReplicationRole::kBackup);
  absl::StatusOr<std::unique_ptr<ReplicationMember>> backup =
      Member(backup_host, backup_role, Options(ReplicationRole::kBackup));
  ASSERT_TRUE(backup.ok()) << backup.status();
  // However the test ends (a failed ASSERT returns early), the host stops before the member's
  // destructor joins the threads that return only then.
  const absl::Cleanup stop_first = [&backup_host] { backup_host.Stop(); };
  ASSERT_NE((*backup)->replication_port(), 0);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    EXPECT_NE((*backup)->reader(w), nullptr);  // its workers' GETs go through a reader
    EXPECT_EQ((*backup)->gate(w), nullptr);
  }
  (*backup)->Start();
  // Nothing to take over yet.
  absl::StatusOr<std::string> orphan = (*backup)->Promote();
  ASSERT_FALSE(orphan.ok());
  EXPECT_NE(orphan.status().message().find("never had a primary"), std::string::npos)
      << orphan.status();

  ReplicationServerOptions primary_options = Options(ReplicationRole::kPrimary);
  primary_options.backups = {absl::StrCat("127.0.0.1:", (*backup)->replication_port())};
  {
    FakeHost primary_host(fabric);
    ServerRole primary_role(ReplicationRole::kPrimary);
    absl::StatusOr<std::unique_ptr<ReplicationMember>> primary =
        Member(primary_host, primary_role, primary_options);
    ASSERT_TRUE(primary.ok()) << primary.status();
    for (uint32_t w = 0; w < kWorkers; ++w) {
      EXPECT_NE((*primary)->gate(w), nullptr);  // its workers answer mutations through a gate
      EXPECT_EQ((*primary)->reader(w), nullptr);
    }
    const MemberStats stats = (*primary)->Stats();
    EXPECT_EQ(stats.role, ReplicationRole::kPrimary);
    EXPECT_EQ(stats.backups, 1u);
    EXPECT_EQ(stats.live_backups, 1u);
    ASSERT_TRUE(Eventually([&] { return (*backup)->Stats().primary_attached; }));
    // Two primaries would diverge: no promotion while one is attached.
    absl::StatusOr<std::string> early = (*backup)->Promote();
    ASSERT_FALSE(early.ok());
    EXPECT_NE(early.status().message().find("still attached"), std::string::npos) << early.status();
    // A second primary is refused: a backup follows one.
    ServerRole second_role(ReplicationRole::kPrimary);
    FakeHost second_host(fabric);
    absl::StatusOr<std::unique_ptr<ReplicationMember>> second =
        Member(second_host, second_role, primary_options);
    ASSERT_FALSE(second.ok());
    EXPECT_NE(second.status().message().find("is attached"), std::string::npos) << second.status();
  }
  // The primary is gone: the backup detaches and settles its replica on every worker, through
  // the host (a repair task: replay the last committed batch, clear the commit line).
  ASSERT_TRUE(Eventually([&] { return !(*backup)->Stats().primary_attached; }));
  ASSERT_TRUE(Eventually([&] { return backup_host.repairs() == 1; }));
  EXPECT_EQ(backup_host.promotions(), 0);
  absl::StatusOr<std::string> promoted = (*backup)->Promote();
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_NE(promoted->find("\"promoted\":true"), std::string::npos) << *promoted;
  EXPECT_EQ(backup_host.promotions(), 1);
  EXPECT_TRUE(backup_role.promoted());
  EXPECT_EQ((*backup)->Stats().role, ReplicationRole::kPrimary);
  // A promoted backup follows no one.
  FakeHost late_host(fabric);
  ServerRole late_role(ReplicationRole::kPrimary);
  absl::StatusOr<std::unique_ptr<ReplicationMember>> late =
      Member(late_host, late_role, primary_options);
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.status().message().find("promoted"), std::string::npos) << late.status();
  backup_host.Stop();
  (*backup)->StopThreads();
}

}  // namespace
}  // namespace herd
