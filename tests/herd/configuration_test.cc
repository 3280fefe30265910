// The configuration rules (herd/replication/configuration.h), one test per rule, each failing
// without it: a promotion that would lose acknowledged writes or make a second primary is
// refused; a new primary starts with no backups; only the epoch's primary changes its backups;
// the stored form round-trips and a damaged one is refused.
#include "herd/replication/configuration.h"

#include "gtest/gtest.h"

namespace herd {
namespace {

// A primary's incarnation: the session it registered under (coordinator.h).
constexpr uint64_t kPrimarySession = 0x100000a2b3c4d5e6;
constexpr uint64_t kCandidateSession = 0x100000a2b3c4d5f0;

Configuration Three() { return Configuration{4, "p", {"b1", "b2"}, kPrimarySession}; }

TEST(ConfigurationTest, EncodeDecodeRoundTrips) {
  for (Configuration c : {Three(), Configuration{1, "solo", {}, 7}, Configuration{2, "q", {}}}) {
    absl::StatusOr<Configuration> back = Configuration::Decode(c.Encode());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, c);
  }
}

TEST(ConfigurationTest, TheFormWithoutASessionStillDecodes) {
  // Stored before incarnations were recorded: the primary is known by name alone.
  absl::StatusOr<Configuration> old = Configuration::Decode("epoch 4\nprimary p\nbackups b1,b2\n");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(*old, (Configuration{4, "p", {"b1", "b2"}, 0}));
}

TEST(ConfigurationTest, DamagedFormsAreRefused) {
  for (const char* text : {"", "epoch 4\nprimary p\n", "epoch 4\nprimary p\nbackups b1\nextra x\n",
                           "epoch x\nprimary p\nbackups b1\n", "epoch 0\nprimary p\nbackups\n",
                           "epoch 4\nprimary p\nbackups b1,b1\n", "epoch 4\nprimary p\nbackups p\n",
                           "epoch 4\nprimary \nbackups\n", "epoch 4\nprimary p/q\nbackups\n",
                           "primary p\nepoch 4\nbackups\n", "epoch 4\nprimary p\nbackups b1",
                           "epoch 4\nprimary p\nbackups b1\nsession 0\n",
                           "epoch 4\nprimary p\nbackups b1\nsession x\n",
                           "epoch 4\nprimary p\nsession 5\nbackups b1\n"}) {
    EXPECT_FALSE(Configuration::Decode(text).ok()) << text;
  }
}

TEST(ConfigurationTest, MemberNamesAreNodeNames) {
  EXPECT_TRUE(CheckMemberName("b-1_x.y").ok());
  for (const char* bad : {"", ".", "..", "a/b", "a b", "a,b"}) {
    EXPECT_FALSE(CheckMemberName(bad).ok()) << bad;
  }
  EXPECT_FALSE(CheckMemberName(std::string(kMaxMemberNameBytes + 1, 'a')).ok());
}

TEST(ConfigurationTest, PromotionTakesAnInSyncBackupAndNoBackups) {
  absl::StatusOr<Configuration> next =
      PromoteIn(Three(), "b2", kCandidateSession, PrimaryPresence::kGone);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->epoch, 5u);
  EXPECT_EQ(next->primary, "b2");
  EXPECT_EQ(next->primary_session, kCandidateSession);  // the new primary's incarnation
  // b1 may hold a chain b2 lacks (or lack one b2 holds): it rejoins by state transfer.
  EXPECT_TRUE(next->backups.empty());
}

TEST(ConfigurationTest, PromotionOfABackupNotInSyncIsRefused) {
  // The second-failure scenario: after b1 took over (epoch 5, no backups), b2 is no backup of
  // epoch 5: it holds the old primary's state and would lose what b1 acknowledged.
  const Configuration after = *PromoteIn(Three(), "b1", kCandidateSession, PrimaryPresence::kGone);
  absl::StatusOr<Configuration> second =
      PromoteIn(after, "b2", kCandidateSession, PrimaryPresence::kGone);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(PromoteIn(Three(), "stranger", kCandidateSession, PrimaryPresence::kGone).ok());
}

TEST(ConfigurationTest, PromotionPastALivePrimaryIsRefusedUnlessForced) {
  EXPECT_EQ(PromoteIn(Three(), "b1", kCandidateSession, PrimaryPresence::kLive).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(PromoteIn(Three(), "b1", kCandidateSession, PrimaryPresence::kLiveButForced).ok());
  EXPECT_EQ(PromoteIn(Three(), "p", kCandidateSession, PrimaryPresence::kGone).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(ConfigurationTest, APrimaryIsLiveOnlyInTheIncarnationTheConfigurationNames) {
  const absl::StatusOr<MemberInfo> none = absl::NotFoundError("member p");
  EXPECT_EQ(*PresenceOf(Three(), none), PrimaryPresence::kGone);
  MemberInfo registered{"127.0.0.1:1", "127.0.0.1:2", kPrimarySession};
  EXPECT_EQ(*PresenceOf(Three(), registered), PrimaryPresence::kLive);
  // The same name registered by another session: a later life of the server (restarted), not
  // the primary this configuration names, which is gone (its session ended).
  registered.session = kPrimarySession + 1;
  EXPECT_EQ(*PresenceOf(Three(), registered), PrimaryPresence::kGone);
  // A configuration that recorded no incarnation knows its primary by name alone.
  Configuration unrecorded = Three();
  unrecorded.primary_session = 0;
  EXPECT_EQ(*PresenceOf(unrecorded, registered), PrimaryPresence::kLive);
  // Nothing known: no answer either way.
  EXPECT_EQ(PresenceOf(Three(), absl::UnavailableError("connection loss")).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(ConfigurationTest, OnlyThePrimaryRenewsItsIncarnation) {
  absl::StatusOr<Configuration> renewed = RenewIncarnationIn(Three(), "p", kCandidateSession);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(renewed->epoch, 5u);
  EXPECT_EQ(renewed->primary, "p");
  EXPECT_EQ(renewed->backups, Three().backups);
  EXPECT_EQ(renewed->primary_session, kCandidateSession);
  EXPECT_EQ(RenewIncarnationIn(Three(), "b1", kCandidateSession).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(RenewIncarnationIn(Three(), "p", 0).ok());
  EXPECT_FALSE(RenewIncarnationIn(Three(), "p", kPrimarySession).ok());
}

TEST(ConfigurationTest, BackupChangesKeepThePrimarysIncarnation) {
  EXPECT_EQ(DropBackupIn(Three(), "p", "b1")->primary_session, kPrimarySession);
  EXPECT_EQ(AddBackupIn(Three(), "p", "b3")->primary_session, kPrimarySession);
}

TEST(ConfigurationTest, OnlyTheEpochsPrimaryChangesItsBackups) {
  absl::StatusOr<Configuration> dropped = DropBackupIn(Three(), "p", "b1");
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(dropped->epoch, 5u);
  EXPECT_EQ(dropped->backups, std::vector<std::string>{"b2"});
  EXPECT_FALSE(DropBackupIn(Three(), "b2", "b1").ok());  // not the primary
  EXPECT_FALSE(DropBackupIn(Three(), "p", "b9").ok());
  absl::StatusOr<Configuration> added = AddBackupIn(*dropped, "p", "b1");
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(added->epoch, 6u);
  EXPECT_TRUE(added->HasBackup("b1"));
  EXPECT_FALSE(AddBackupIn(*dropped, "b2", "b1").ok());
  EXPECT_FALSE(AddBackupIn(*dropped, "p", "b2").ok());  // already one
  EXPECT_FALSE(AddBackupIn(*dropped, "p", "p").ok());
}

// A fenced primary may drop its copy only once a configuration newer than its own names
// another primary, live in the incarnation that configuration names. Backups listed under its
// own name do not count (one may never have been told it is in sync), nor does an older
// configuration (a lagging server's read), nor a newer primary that is not live (it died or
// stopped after its promotion was committed, maybe before its takeover ended).
TEST(ConfigurationTest, OnlyANewerLivePrimaryIsATakeover) {
  const absl::StatusOr<MemberInfo> none = absl::NotFoundError("no registration");
  // Three(): epoch 4, primary p, backups b1 and b2.
  EXPECT_EQ(SuccessionOf(Three(), "p", 4, none), Succession::kNone);
  absl::StatusOr<Configuration> added = AddBackupIn(Three(), "p", "b3");
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(SuccessionOf(*added, "p", 4, none), Succession::kNone);  // its own change, answer lost
  Configuration alone{4, "p", {}, kPrimarySession};
  EXPECT_EQ(SuccessionOf(alone, "p", 4, none), Succession::kNone);

  absl::StatusOr<Configuration> taken =
      PromoteIn(Three(), "b2", kCandidateSession, PrimaryPresence::kGone);
  ASSERT_TRUE(taken.ok());
  MemberInfo b2;
  b2.session = kCandidateSession;
  EXPECT_EQ(SuccessionOf(*taken, "p", 4, b2), Succession::kTakenOver);
  EXPECT_EQ(SuccessionOf(*taken, "p", 3, b2), Succession::kTakenOver);
  // The new primary gone, or its name held by another session (a later life, empty).
  EXPECT_EQ(SuccessionOf(*taken, "p", 4, none), Succession::kUnknown);
  MemberInfo later_life = b2;
  later_life.session = kCandidateSession + 1;
  EXPECT_EQ(SuccessionOf(*taken, "p", 4, later_life), Succession::kUnknown);
  EXPECT_EQ(SuccessionOf(*taken, "p", 4, absl::UnavailableError("lost")), Succession::kUnknown);

  // p became primary at epoch 5 (a takeover); a read from a server still at epoch 4, whose
  // primary was another member, is stale, not a takeover; and one epoch has one primary.
  Configuration earlier{4, "q", {"p"}, kCandidateSession};
  MemberInfo q;
  q.session = kCandidateSession;
  EXPECT_EQ(SuccessionOf(earlier, "p", 5, q), Succession::kUnknown);
  EXPECT_EQ(SuccessionOf(earlier, "p", 4, q), Succession::kUnknown);
  Configuration own_earlier{4, "p", {}, kPrimarySession};
  EXPECT_EQ(SuccessionOf(own_earlier, "p", 5, none), Succession::kUnknown);
  EXPECT_EQ(SuccessionName(Succession::kTakenOver), "taken_over");
}

TEST(ConfigurationTest, MemberInfoRoundTrips) {
  MemberInfo info{"127.0.0.1:4000", "127.0.0.1:4001"};
  absl::StatusOr<MemberInfo> back = MemberInfo::Decode(info.Encode());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->client_address, info.client_address);
  EXPECT_EQ(back->replication_address, info.replication_address);
  EXPECT_FALSE(MemberInfo::Decode("client x\n").ok());
}

}  // namespace
}  // namespace herd
