// ServerRole (herd/replication/role.h): what a server is in its replication group and what it
// may become. Each transition at most once, refused ones change nothing, and every question the
// server asks (primary? serving? takes writes?) answered from the same state.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "herd/replication/role.h"

namespace herd {
namespace {

enum class Step { kPromote, kFence };

struct Row {
  const char* name;
  ReplicationRole configured;
  std::vector<Step> steps;
  std::vector<bool> accepted;  // per step
  // Then:
  ReplicationRole current;
  bool promoted, fenced, primary, serving_primary, takes_writes;
};

TEST(ServerRole, EachTransitionAtMostOnceAndEveryAnswerFromOneState) {
  using R = ReplicationRole;
  // clang-format off
  const Row table[] = {
      // name, configured, steps, accepted; current, promoted, fenced, primary, serving, writes
      {"alone", R::kNone, {}, {}, R::kNone, false, false, false, false, true},
      {"alone is never promoted or fenced", R::kNone, {Step::kPromote, Step::kFence},
       {false, false}, R::kNone, false, false, false, false, true},
      {"a primary", R::kPrimary, {}, {}, R::kPrimary, false, false, true, true, true},
      {"a primary is not promoted", R::kPrimary, {Step::kPromote}, {false},
       R::kPrimary, false, false, true, true, true},
      {"a fenced primary", R::kPrimary, {Step::kFence}, {true},
       R::kPrimary, false, true, true, false, false},
      {"fenced once", R::kPrimary, {Step::kFence, Step::kFence}, {true, false},
       R::kPrimary, false, true, true, false, false},
      {"a backup", R::kBackup, {}, {}, R::kBackup, false, false, false, false, false},
      {"a promoted backup", R::kBackup, {Step::kPromote}, {true},
       R::kPrimary, true, false, true, true, true},
      {"promoted once", R::kBackup, {Step::kPromote, Step::kPromote}, {true, false},
       R::kPrimary, true, false, true, true, true},
      {"a promoted backup fenced", R::kBackup, {Step::kPromote, Step::kFence}, {true, true},
       R::kPrimary, true, true, true, false, false},
      {"a backup whose takeover failed", R::kBackup, {Step::kFence}, {true},
       R::kBackup, false, true, false, false, false},
      {"a fenced backup is never promoted", R::kBackup, {Step::kFence, Step::kPromote},
       {true, false}, R::kBackup, false, true, false, false, false},
  };
  // clang-format on
  for (const Row& row : table) {
    SCOPED_TRACE(row.name);
    ServerRole role(row.configured);
    ASSERT_EQ(row.steps.size(), row.accepted.size());
    for (size_t i = 0; i < row.steps.size(); ++i) {
      const bool accepted = row.steps[i] == Step::kPromote ? role.Promote() : role.Fence();
      EXPECT_EQ(accepted, row.accepted[i]) << "step " << i;
    }
    EXPECT_EQ(role.configured(), row.configured);
    EXPECT_EQ(role.current(), row.current);
    EXPECT_EQ(role.promoted(), row.promoted);
    EXPECT_EQ(role.fenced(), row.fenced);
    EXPECT_EQ(role.primary(), row.primary);
    EXPECT_EQ(role.serving_primary(), row.serving_primary);
    EXPECT_EQ(role.takes_writes(), row.takes_writes);
    EXPECT_EQ(role.replicated(), row.configured != R::kNone);
  }
}

TEST(ServerRole, NamesParseBackAndOthersAreRefused) {
  for (ReplicationRole role :
       {ReplicationRole::kNone, ReplicationRole::kPrimary, ReplicationRole::kBackup}) {
    absl::StatusOr<ReplicationRole> parsed = ParseReplicationRole(ReplicationRoleName(role));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, role);
  }
  for (const char* bad : {"", "Primary", "master", "backup "}) {
    absl::StatusOr<ReplicationRole> parsed = ParseReplicationRole(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace herd
