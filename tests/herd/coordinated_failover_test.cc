// Coordinated replication (issue 35) through the failures that broke the uncoordinated store, each
// a test that fails on its old behaviour (9e9820a): a backup left behind by a promotion serving
// the dead primary's state, a second failure promoting a backup that misses acknowledged writes,
// two promotions both accepted, and a promoted primary that takes no backups (so kill, promote,
// restart and rejoin cannot repeat). Real processes, a real ZooKeeper.
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "herd/join.h"
#include "tests/herd/coordinated_cluster.h"

namespace herd {
namespace {

using testing::CoordinatedCluster;

// Until the primary's registration expires, a manual promotion is refused (a second primary).
absl::StatusOr<std::string> PromoteWhenAllowed(const std::string& address) {
  const absl::Time give_up = absl::Now() + testing::kClusterDeadline;
  absl::StatusOr<std::string> promoted = RequestPromotion(address, absl::Seconds(10));
  while (!promoted.ok() &&
         promoted.status().message().find("still registered") != std::string::npos &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
    promoted = RequestPromotion(address, absl::Seconds(10));
  }
  return promoted;
}

bool HasBackups(const Configuration& c, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (!c.HasBackup(n)) return false;
  }
  return true;
}

class CoordinatedFailoverTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(cluster_.ok()) << cluster_.zk_status(); }
  // p primary, b1 and b2 backups in sync.
  void StartThree(bool auto_failover) {
    ASSERT_TRUE(cluster_.Start("p", ReplicationRole::kPrimary, auto_failover));
    ASSERT_TRUE(cluster_.Start("b1", ReplicationRole::kBackup, auto_failover));
    ASSERT_TRUE(cluster_.Start("b2", ReplicationRole::kBackup, auto_failover));
    ASSERT_TRUE(cluster_.AwaitConfiguration([](const Configuration& c) {
      return c.primary == "p" && HasBackups(c, {"b1", "b2"});
    }));
  }
  CoordinatedCluster cluster_{absl::StrCat("coordinated-", getpid())};
};

// The orphaned backup: kill the primary, promote b1, write there; b2 never answers the dead
// primary's value again (it detaches, refuses reads, and serves again only once b1 brought it up
// to date). Uncoordinated, b2 answered "v1" for as long as it ran.
TEST_F(CoordinatedFailoverTest, TheBackupNotPromotedNeverServesTheOldState) {
  StartThree(/*auto_failover=*/false);
  std::unique_ptr<Client> writer = cluster_.Connect("p");
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->Put("k", "v1").ok());
  writer.reset();
  cluster_.Kill("p");
  absl::StatusOr<std::string> promoted = PromoteWhenAllowed(cluster_.Address("b1"));
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  std::unique_ptr<Client> primary = cluster_.Connect("b1");
  ASSERT_NE(primary, nullptr);
  ASSERT_TRUE(primary->Put("k", "v2").ok());
  std::unique_ptr<Client> reader = cluster_.Connect("b2");
  ASSERT_NE(reader, nullptr);
  const absl::Time give_up = absl::Now() + testing::kClusterDeadline;
  int busy = 0;
  while (true) {
    absl::StatusOr<Value> v = reader->Get("k");
    if (v.ok()) {
      ASSERT_EQ(v->value, "v2") << "b2 served the dead primary's state";
      break;
    }
    ++busy;  // BACKUP_BUSY until b1's state transfer completes
    ASSERT_LT(absl::Now(), give_up) << v.status();
  }
  EXPECT_TRUE(cluster_.AwaitConfiguration(
      [](const Configuration& c) { return c.primary == "b1" && c.HasBackup("b2"); }));
  EXPECT_FALSE(reader->Put("k", "v3").ok());  // NOT_PRIMARY: only b1 takes writes
}

// The second failure: b1 took over (its epoch has no backups), b2 was away (paused) and never
// rejoined; b1 dies. Promoting b2 would lose what b1 acknowledged: refused, and b2 answers no
// read of the old state. Uncoordinated, b2 was promoted and handed out the lost versions again.
TEST_F(CoordinatedFailoverTest, ASecondFailurePromotesNoBackupThatMissesAcknowledgedWrites) {
  StartThree(/*auto_failover=*/false);
  std::unique_ptr<Client> writer = cluster_.Connect("p");
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->Put("k", "v1").ok());
  writer.reset();
  // Joined before the failover: once promoted, b1's control thread tries to attach the paused
  // b2 (it waits for its welcome), and a join would wait behind it.
  std::unique_ptr<Client> primary = cluster_.Connect("b1");
  ASSERT_NE(primary, nullptr);
  cluster_.Pause("b2");
  cluster_.Kill("p");
  ASSERT_TRUE(PromoteWhenAllowed(cluster_.Address("b1")).ok());
  ASSERT_TRUE(primary->Put("k", "v2").ok());
  primary.reset();
  cluster_.Kill("b1");
  cluster_.Resume("b2");
  ASSERT_TRUE(cluster_.AwaitUnregistered("b1"));
  absl::StatusOr<std::string> second = RequestPromotion(cluster_.Address("b2"), absl::Seconds(10));
  ASSERT_FALSE(second.ok()) << *second;
  EXPECT_NE(second.status().message().find("would lose acknowledged writes"), std::string::npos)
      << second.status();
  // Its reads: never the old state (its lease lapsed with its primary, and no new primary
  // attaches it without a state transfer).
  std::unique_ptr<Client> reader = cluster_.Connect("b2");
  ASSERT_NE(reader, nullptr);
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<Value> v = reader->Get("k");
    ASSERT_FALSE(v.ok() && v->value == "v1") << "b2 served a write b1 overwrote";
  }
  absl::StatusOr<Configuration> c = cluster_.Read();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->primary, "b1");  // the cluster waits for b1 (its data) rather than lose it
}

// Two promotions at once: exactly one wins the conditional write; the other is refused and
// rejoins the winner. Uncoordinated, both became primaries.
TEST_F(CoordinatedFailoverTest, OfTwoPromotionsExactlyOneWins) {
  StartThree(/*auto_failover=*/false);
  cluster_.Kill("p");
  ASSERT_TRUE(cluster_.AwaitUnregistered("p"));
  absl::StatusOr<std::string> results[2] = {absl::UnknownError(""), absl::UnknownError("")};
  const std::string addresses[2] = {cluster_.Address("b1"), cluster_.Address("b2")};
  {
    std::thread a([&] { results[0] = RequestPromotion(addresses[0], absl::Seconds(20)); });
    std::thread b([&] { results[1] = RequestPromotion(addresses[1], absl::Seconds(20)); });
    a.join();
    b.join();
  }
  ASSERT_NE(results[0].ok(), results[1].ok())
      << results[0].status() << " / " << results[1].status();
  const std::string winner = results[0].ok() ? "b1" : "b2";
  const std::string loser = results[0].ok() ? "b2" : "b1";
  absl::StatusOr<Configuration> c = cluster_.Read();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->primary, winner);
  ASSERT_TRUE(cluster_.AwaitConfiguration(
      [&](const Configuration& now) { return now.primary == winner && now.HasBackup(loser); }));
  std::unique_ptr<Client> at_loser = cluster_.Connect(loser);
  ASSERT_NE(at_loser, nullptr);
  absl::StatusOr<uint64_t> put = at_loser->Put("k", "x");
  ASSERT_FALSE(put.ok());
  EXPECT_NE(put.status().message().find("NOT_PRIMARY"), std::string::npos) << put.status();
}

// Kill the primary, let a backup take over automatically, restart the dead one (it rejoins as a
// backup), repeat: every acknowledged write survives every round, and the cluster ends each round
// with two backups again. Uncoordinated, the promoted backup took none.
TEST_F(CoordinatedFailoverTest, KillPromoteRestartRejoinRepeats) {
  StartThree(/*auto_failover=*/true);
  constexpr int kRounds = 3;
  std::string primary = "p";
  uint64_t last_version = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::unique_ptr<Client> writer = cluster_.Connect(primary);
    ASSERT_NE(writer, nullptr);
    absl::StatusOr<uint64_t> put = writer->Put("k", absl::StrCat("round", round));
    ASSERT_TRUE(put.ok()) << put.status();
    EXPECT_GT(*put, last_version);  // versions never reused across epochs
    last_version = *put;
    writer.reset();
    absl::StatusOr<Configuration> before = cluster_.Read();
    ASSERT_TRUE(before.ok());
    cluster_.Kill(primary);
    const std::string dead = primary;
    ASSERT_TRUE(cluster_.AwaitConfiguration(
        [&](const Configuration& c) { return c.epoch > before->epoch && c.primary != dead; }));
    primary = cluster_.Read()->primary;
    ASSERT_TRUE(cluster_.Start(dead, ReplicationRole::kBackup));
    ASSERT_TRUE(cluster_.AwaitConfiguration([&](const Configuration& c) {
      return c.primary == primary && c.backups.size() == 2;
    })) << "round "
        << round;
    std::unique_ptr<Client> reader = cluster_.Connect(primary);
    ASSERT_NE(reader, nullptr);
    absl::StatusOr<Value> v = reader->Get("k");
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->value, absl::StrCat("round", round));
    EXPECT_EQ(v->version, last_version);
  }
}

// A cluster that exists refuses a second --role=primary (its empty store is no copy of the
// cluster's); and a member name is one server's.
TEST_F(CoordinatedFailoverTest, ASecondPrimaryOrATakenNameIsRefusedAtStart) {
  ASSERT_TRUE(cluster_.Start("p", ReplicationRole::kPrimary));
  absl::StatusOr<std::unique_ptr<Server>> second =
      Server::Create(cluster_.Options("q", ReplicationRole::kPrimary, true));
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("--role=backup"), std::string::npos) << second.status();
  // A server alone has no role in a cluster: refused, not half started.
  absl::StatusOr<std::unique_ptr<Server>> alone =
      Server::Create(cluster_.Options("r", ReplicationRole::kNone, true));
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("--coordinator needs --role"), std::string::npos)
      << alone.status();
}

}  // namespace
}  // namespace herd
