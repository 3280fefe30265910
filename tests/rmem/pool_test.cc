// The remote-memory pool (rmem/pool.h): tag-idempotent allocation, transactions applied
// all-or-nothing and at most once, a server killed at every step of applying one (a forked
// process stopped by the step hook, not by timing) and of replaying it, hostile transactions
// and hostile pool files.
#include "rmem/pool.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace rmem {
namespace {

constexpr uint64_t kPoolBytes = 1 << 20;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

PoolOptions FileOptions(const std::string& name) {
  PoolOptions o;
  o.path = TmpPath(name);
  o.pool_bytes = kPoolBytes;
  o.max_regions = 64;
  o.max_clients = 4;
  o.max_ops = 16;
  return o;
}

void Fill(Pool& pool, const Region& r, uint8_t byte) {
  std::memset(pool.data() + r.offset, byte, r.bytes);
}

// A registered client's id (Commit refuses others).
uint64_t Register(Pool& pool) {
  absl::StatusOr<ClientCredential> c = pool.RegisterClient([](uint64_t) { return false; });
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->id : 0;
}

bool AllBytes(const Pool& pool, uint64_t offset, uint64_t bytes, uint8_t byte) {
  for (uint64_t i = 0; i < bytes; ++i) {
    if (pool.data()[offset + i] != byte) return false;
  }
  return true;
}

TEST(Pool, AllocIsIdempotentPerTagAndSurvivesReopen) {
  const PoolOptions o = FileOptions("idempotent.pool");
  Region a, b;
  {
    absl::StatusOr<Pool> pool = Pool::Create(o);
    ASSERT_TRUE(pool.ok()) << pool.status();
    absl::StatusOr<Region> first = pool->Alloc(100, 7);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(first->bytes, 128u);  // rounded up to kRegionAlign
    absl::StatusOr<Region> again = pool->Alloc(100, 7);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->offset, first->offset);
    EXPECT_EQ(again->id, first->id);
    absl::StatusOr<Region> other = pool->Alloc(4096, 8);
    ASSERT_TRUE(other.ok());
    EXPECT_GE(other->offset, first->offset + first->bytes);
    EXPECT_EQ(pool->Alloc(200, 7).status().code(), absl::StatusCode::kFailedPrecondition);
    a = *first;
    b = *other;
  }
  absl::StatusOr<Pool> reopened = Pool::Open(o.path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  absl::StatusOr<Region> a2 = reopened->Alloc(100, 7);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a2->offset, a.offset);
  std::optional<Region> b2 = reopened->FindTag(8);
  ASSERT_TRUE(b2.has_value());
  EXPECT_EQ(b2->offset, b.offset);
  EXPECT_EQ(reopened->stats().regions, 2u);
}

TEST(Pool, AllocRefusesBadRequestsAndReusesFreedExtents) {
  PoolOptions o = FileOptions("alloc_limits.pool");
  o.max_regions = 3;
  absl::StatusOr<Pool> pool = Pool::Create(o);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->Alloc(64, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Alloc(0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Alloc(kPoolBytes + 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Alloc(~uint64_t{0}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Region> half = pool->Alloc(kPoolBytes / 2, 1);
  ASSERT_TRUE(half.ok());
  absl::StatusOr<Region> rest = pool->Alloc(kPoolBytes / 2, 2);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(pool->Alloc(64, 3).status().code(), absl::StatusCode::kResourceExhausted);
  // Free the first half in a transaction: its extent is found again.
  Txn txn{Register(*pool), 1, {TxnOp{OpKind::kFree, 0, 0, 0, half->id, 1}}};
  ASSERT_TRUE(pool->Commit(txn).ok());
  EXPECT_FALSE(pool->FindTag(1).has_value());
  absl::StatusOr<Region> again = pool->Alloc(4096, 3);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->offset, half->offset);
  ASSERT_TRUE(pool->Alloc(64, 4).ok());
  // Three records: the fourth live region has none.
  EXPECT_EQ(pool->Alloc(64, 5).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(Pool, ACommitCopiesThenFreesAndARetryIsAnsweredNotApplied) {
  absl::StatusOr<Pool> pool = Pool::Create(FileOptions("commit.pool"));
  ASSERT_TRUE(pool.ok());
  Region real = *pool->Alloc(4096, 1), shadow = *pool->Alloc(4096, 2),
         scratch = *pool->Alloc(64, 3);
  Fill(*pool, real, 0xaa);
  Fill(*pool, shadow, 0x55);
  Txn txn;
  txn.client_id = Register(*pool);
  txn.txn_id = 1;
  txn.ops = {TxnOp{OpKind::kCopy, shadow.offset, real.offset, 4096},
             TxnOp{OpKind::kFree, 0, 0, 0, scratch.id, scratch.tag}};
  absl::StatusOr<CommitResult> done = pool->Commit(txn);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(done->duplicate);
  EXPECT_EQ(done->bytes_copied, 4096u);
  EXPECT_EQ(done->freed, 1u);
  EXPECT_TRUE(AllBytes(*pool, real.offset, 4096, 0x55));
  EXPECT_FALSE(pool->FindTag(3).has_value());
  // The reply was lost and the client retries: answered, nothing copied again.
  Fill(*pool, shadow, 0x66);
  done = pool->Commit(txn);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->duplicate);
  EXPECT_TRUE(AllBytes(*pool, real.offset, 4096, 0x55));
  // An older id too; the next one is applied.
  txn.txn_id = 2;
  txn.ops = {TxnOp{OpKind::kCopy, shadow.offset, real.offset, 64}};
  ASSERT_TRUE(pool->Commit(txn).ok());
  EXPECT_TRUE(AllBytes(*pool, real.offset, 64, 0x66));
  EXPECT_EQ(pool->stats().commits, 2u);
  EXPECT_EQ(pool->stats().duplicates, 1u);
}

// Ids increase per client: the last one retried is answered as it was (applied or refused),
// an older one is refused, and a refused transaction is never applied later.
TEST(Pool, TransactionIdsAreAnsweredOnceInOrder) {
  PoolOptions o = FileOptions("txn_ids.pool");
  o.max_clients = 2;
  absl::StatusOr<Pool> pool = Pool::Create(o);
  ASSERT_TRUE(pool.ok());
  Region a = *pool->Alloc(4096, 1), b = *pool->Alloc(4096, 2);
  Fill(*pool, a, 1);
  const TxnOp good{OpKind::kCopy, a.offset, b.offset, 64};
  const TxnOp bad{OpKind::kCopy, a.offset, kPoolBytes, 64};
  const auto never = [](uint64_t) { return false; };
  absl::StatusOr<ClientCredential> nine = pool->RegisterClient(never);
  ASSERT_TRUE(nine.ok());
  const uint64_t c9 = nine->id;
  // An unregistered client commits nothing.
  EXPECT_EQ(pool->Commit({c9 + 1, 1, {good}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Txn 5 is refused; its retry is refused the same, even after txn 6 was applied.
  EXPECT_EQ(pool->Commit({c9, 5, {bad}}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool->Commit({c9, 5, {good}}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(AllBytes(*pool, b.offset, 64, 0));
  ASSERT_TRUE(pool->Commit({c9, 6, {good}}).ok());
  EXPECT_TRUE(AllBytes(*pool, b.offset, 64, 1));
  absl::StatusOr<CommitResult> older = pool->Commit({c9, 5, {good}});
  EXPECT_EQ(older.status().code(), absl::StatusCode::kFailedPrecondition) << older.status();
  // A known client's id 0 is refused, not taken for a retry.
  EXPECT_EQ(pool->Commit({c9, 0, {good}}).status().code(), absl::StatusCode::kInvalidArgument);
  // The records survive a restart, and the credential still authenticates.
  pool = absl::UnknownError("closed");
  pool = Pool::Open(o.path);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<uint64_t> last = pool->Authenticate(*nine);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(*last, 6u);
  EXPECT_EQ(pool->Authenticate({c9, nine->secret ^ 1}).status().code(),
            absl::StatusCode::kUnauthenticated);
  absl::StatusOr<CommitResult> retry = pool->Commit({c9, 6, {good}});
  ASSERT_TRUE(retry.ok());
  EXPECT_TRUE(retry->duplicate);
  // Two clients fill the table: a third is refused while both may stay, and takes over the
  // least recently used record when it may go; the forgotten client's retry is then refused,
  // never applied again.
  const uint64_t c10 = Register(*pool);
  ASSERT_TRUE(pool->Commit({c10, 1, {good}}).ok());
  EXPECT_EQ(pool->RegisterClient(never).status().code(), absl::StatusCode::kResourceExhausted);
  absl::StatusOr<ClientCredential> eleven = pool->RegisterClient([](uint64_t) { return true; });
  ASSERT_TRUE(eleven.ok()) << eleven.status();
  EXPECT_EQ(pool->Authenticate(*nine).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(pool->Commit({c9, 6, {good}}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(pool->Commit({c10, 2, {good}}).ok());
  EXPECT_TRUE(pool->Commit({eleven->id, 1, {good}}).ok());
  // A client that leaves for good frees its record.
  EXPECT_TRUE(pool->ForgetClient(*eleven).ok());
  EXPECT_EQ(pool->Authenticate(*eleven).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(pool->RegisterClient(never).ok());
  // And a second process cannot open the pool while this one has it.
  EXPECT_EQ(Pool::Open(o.path).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Pool::Create(o).status().code(), absl::StatusCode::kFailedPrecondition);
}

// The overlap check is sorted: the most ops a pool allows, all independent, are checked fast
// (a quadratic check would take ~2e9 comparisons here), and one overlap among them is found.
TEST(Pool, ManyOpsAreValidatedWithoutQuadraticWork) {
  PoolOptions o = FileOptions("many_ops.pool");
  o.pool_bytes = 64 << 20;
  o.max_ops = kMaxOpsLimit;
  absl::StatusOr<Pool> pool = Pool::Create(o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  Txn txn{1, 1, {}};
  for (uint64_t i = 0; i < kMaxOpsLimit; ++i) {
    txn.ops.push_back(TxnOp{OpKind::kCopy, i * 64, (32 << 20) + i * 64, 64});
  }
  EXPECT_TRUE(pool->Validate(txn).ok());
  txn.ops.back().dst = txn.ops.front().dst + 32;  // meets the first destination
  EXPECT_EQ(pool->Validate(txn).code(), absl::StatusCode::kInvalidArgument);
  txn.ops.back().dst = (32 << 20) - 64;
  txn.ops.back().src = (32 << 20) + 128;  // the last source is another copy's destination
  EXPECT_EQ(pool->Validate(txn).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Pool, HostileTransactionsAreRefusedAndChangeNothing) {
  absl::StatusOr<Pool> pool = Pool::Create(FileOptions("hostile_txn.pool"));
  ASSERT_TRUE(pool.ok());
  Region a = *pool->Alloc(4096, 1), b = *pool->Alloc(4096, 2);
  Fill(*pool, a, 1);
  Fill(*pool, b, 2);
  const uint64_t max = ~uint64_t{0};
  struct Case {
    std::string what;
    Txn txn;
    absl::StatusCode code;
  };
  auto copy = [](uint64_t src, uint64_t dst, uint64_t bytes) {
    return TxnOp{OpKind::kCopy, src, dst, bytes};
  };
  auto free_op = [](uint32_t id, uint64_t tag) { return TxnOp{OpKind::kFree, 0, 0, 0, id, tag}; };
  std::vector<TxnOp> too_many(17, copy(a.offset, b.offset, 1));
  const uint64_t c = Register(*pool);
  const std::vector<Case> cases = {
      {"nothing queued", {1, 1, {}}, absl::StatusCode::kFailedPrecondition},
      {"client id 0", {0, 1, {copy(a.offset, b.offset, 64)}}, absl::StatusCode::kInvalidArgument},
      {"an unregistered client",
       {c + 1, 1, {copy(a.offset, b.offset, 64)}},
       absl::StatusCode::kFailedPrecondition},
      {"txn id 0", {1, 0, {copy(a.offset, b.offset, 64)}}, absl::StatusCode::kInvalidArgument},
      {"too many ops", {1, 1, too_many}, absl::StatusCode::kInvalidArgument},
      {"past the pool",
       {1, 1, {copy(a.offset, kPoolBytes - 32, 64)}},
       absl::StatusCode::kOutOfRange},
      {"a wrapping source", {1, 1, {copy(max - 10, b.offset, 64)}}, absl::StatusCode::kOutOfRange},
      {"a wrapping length", {1, 1, {copy(a.offset, b.offset, max)}}, absl::StatusCode::kOutOfRange},
      {"zero bytes", {1, 1, {copy(a.offset, b.offset, 0)}}, absl::StatusCode::kOutOfRange},
      {"destination overlaps its source",
       {1, 1, {copy(a.offset, a.offset + 64, 128)}},
       absl::StatusCode::kInvalidArgument},
      {"two destinations overlap",
       {1, 1, {copy(a.offset, b.offset, 64), copy(a.offset + 64, b.offset + 32, 64)}},
       absl::StatusCode::kInvalidArgument},
      {"a destination is another copy's source",
       {1, 1, {copy(a.offset, b.offset, 64), copy(b.offset, a.offset + 1024, 64)}},
       absl::StatusCode::kInvalidArgument},
      {"free of no region", {1, 1, {free_op(60, 9)}}, absl::StatusCode::kNotFound},
      {"free of a region id past the table",
       {1, 1, {free_op(1u << 30, 1)}},
       absl::StatusCode::kNotFound},
      {"free with the wrong tag", {1, 1, {free_op(a.id, 99)}}, absl::StatusCode::kNotFound},
      {"a double free",
       {1, 1, {free_op(a.id, 1), free_op(a.id, 1)}},
       absl::StatusCode::kInvalidArgument},
      {"an unknown op",
       {1, 1, {TxnOp{static_cast<OpKind>(9), 0, 0, 64}}},
       absl::StatusCode::kInvalidArgument},
  };
  uint64_t next_id = 0;  // each refusal is recorded: every case gets a new transaction id
  for (const Case& k : cases) {
    Txn txn = k.txn;
    if (txn.client_id == 1) txn.client_id = c;  // 1 stands for the registered client
    if (txn.client_id == c && txn.txn_id != 0) txn.txn_id = ++next_id;
    absl::StatusOr<CommitResult> r = pool->Commit(txn);
    EXPECT_EQ(r.status().code(), k.code) << k.what << ": " << r.status();
  }
  EXPECT_TRUE(AllBytes(*pool, a.offset, 4096, 1));
  EXPECT_TRUE(AllBytes(*pool, b.offset, 4096, 2));
  EXPECT_EQ(pool->stats().regions, 2u);
  EXPECT_EQ(pool->stats().commits, 0u);
  // Refusals are recorded (a retry of txn 1 is refused again); the next id applies.
  EXPECT_FALSE(pool->Commit({c, next_id, {copy(a.offset, b.offset, 64)}}).ok());
  EXPECT_TRUE(pool->Commit({c, next_id + 1, {copy(a.offset, b.offset, 64)}}).ok());
  EXPECT_TRUE(AllBytes(*pool, b.offset, 64, 1));
}

// The transaction every kill test applies, on a fresh pool at `path`: two copies of a
// page-sized shadow onto its real page, a third into a scratch region, and two frees.
struct KillFixture {
  Region real0, shadow0, real1, shadow1, doomed0, doomed1;
  Txn txn;
};

KillFixture MakeKillPool(const std::string& path) {
  PoolOptions o = FileOptions("unused");
  o.path = path;
  absl::StatusOr<Pool> pool = Pool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  KillFixture f;
  f.real0 = *pool->Alloc(4096, 10);
  f.shadow0 = *pool->Alloc(4096, 11);
  f.real1 = *pool->Alloc(4096, 12);
  f.shadow1 = *pool->Alloc(4096, 13);
  f.doomed0 = *pool->Alloc(64, 14);
  f.doomed1 = *pool->Alloc(64, 15);
  Fill(*pool, f.real0, 0x10);
  Fill(*pool, f.shadow0, 0x20);
  Fill(*pool, f.real1, 0x30);
  Fill(*pool, f.shadow1, 0x40);
  f.txn.client_id = Register(*pool);
  f.txn.txn_id = 1;
  f.txn.ops = {TxnOp{OpKind::kCopy, f.shadow0.offset, f.real0.offset, 4096},
               TxnOp{OpKind::kFree, 0, 0, 0, f.doomed0.id, f.doomed0.tag},
               TxnOp{OpKind::kCopy, f.shadow1.offset, f.real1.offset, 4096},
               TxnOp{OpKind::kFree, 0, 0, 0, f.doomed1.id, f.doomed1.tag}};
  return f;
}

// Everything or nothing of the fixture's transaction; returns whether it was applied.
bool ExpectAllOrNothing(const Pool& pool, const KillFixture& f) {
  const bool applied = AllBytes(pool, f.real0.offset, 4096, 0x20);
  const uint8_t real0 = applied ? 0x20 : 0x10, real1 = applied ? 0x40 : 0x30;
  EXPECT_TRUE(AllBytes(pool, f.real0.offset, 4096, real0)) << "applied=" << applied;
  EXPECT_TRUE(AllBytes(pool, f.real1.offset, 4096, real1)) << "applied=" << applied;
  EXPECT_TRUE(AllBytes(pool, f.shadow0.offset, 4096, 0x20));
  EXPECT_TRUE(AllBytes(pool, f.shadow1.offset, 4096, 0x40));
  EXPECT_EQ(pool.FindTag(14).has_value(), !applied);
  EXPECT_EQ(pool.FindTag(15).has_value(), !applied);
  EXPECT_TRUE(pool.FindTag(10).has_value() && pool.FindTag(13).has_value());
  return applied;
}

// Runs `body` in a forked child that dies (_exit, as a kill -9 would leave the file) when the
// hook has been called `kill_at` times; false if it finished first.
template <typename Body>
bool KillAtStep(int kill_at, Body body) {
  const pid_t child = fork();
  if (child == 0) {
    int seen = 0;
    StepHook hook = [&](CommitStep, uint32_t) {
      if (++seen == kill_at) _exit(0);
    };
    body(hook);
    _exit(1);  // finished without reaching the step
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// A commit of 2 copies and 2 frees passes 2 + 4 + 2 = 8 steps: killed after each (and before
// the first), the restarted pool holds all of it or none of it; the retried txn_go then makes
// it all, applying it at most once.
TEST(Pool, AServerKilledAtEveryStepOfACommitLeavesAllOrNothing) {
  constexpr int kSteps = 8;
  int applied_count = 0;
  for (int kill_at = 1; kill_at <= kSteps; ++kill_at) {
    SCOPED_TRACE(absl::StrFormat("killed at step %d", kill_at));
    const std::string path = TmpPath(absl::StrFormat("kill%d.pool", kill_at));
    const KillFixture f = MakeKillPool(path);
    ASSERT_TRUE(KillAtStep(kill_at, [&](StepHook hook) {
      absl::StatusOr<Pool> pool = Pool::Open(path);
      if (!pool.ok()) _exit(2);
      pool->set_step_hook(hook);
      (void)pool->Commit(f.txn);
    }));
    absl::StatusOr<Pool> pool = Pool::Open(path);
    ASSERT_TRUE(pool.ok()) << pool.status();
    const bool applied = ExpectAllOrNothing(*pool, f);
    EXPECT_EQ(applied, kill_at >= 2) << "the commit point is the second step";
    EXPECT_EQ(pool->stats().replayed, kill_at >= 2 && kill_at < kSteps);
    applied_count += applied;
    // The client, not having its reply, retries.
    absl::StatusOr<CommitResult> retry = pool->Commit(f.txn);
    ASSERT_TRUE(retry.ok()) << retry.status();
    EXPECT_EQ(retry->duplicate, applied);
    EXPECT_TRUE(ExpectAllOrNothing(*pool, f));
  }
  EXPECT_EQ(applied_count, kSteps - 1);
}

// Issue 36: a refusal was recorded outside the redo record, its outcome code stored before its
// transaction id: a kill between the two left the client's last APPLIED transaction recorded
// as refused. Now a refusal goes through the redo (write, commit, record, clear): killed after
// each step, the restarted pool holds the applied transaction's record or the refusal's, whole.
TEST(Pool, AServerKilledWhileRecordingARefusalKeepsTheRecordWhole) {
  constexpr int kSteps = 4;  // redo written, committed, recorded, cleared
  for (int kill_at = 1; kill_at <= kSteps; ++kill_at) {
    SCOPED_TRACE(absl::StrFormat("killed at step %d", kill_at));
    const std::string path = TmpPath(absl::StrFormat("refusekill%d.pool", kill_at));
    KillFixture f = MakeKillPool(path);
    {
      absl::StatusOr<Pool> pool = Pool::Open(path);
      ASSERT_TRUE(pool.ok()) << pool.status();
      ASSERT_TRUE(pool->Commit(f.txn).ok());  // transaction 1 applied
    }
    // Transaction 2 frees a region transaction 1 already freed: refused.
    const Txn refused{f.txn.client_id, 2, {TxnOp{OpKind::kFree, 0, 0, 0, f.doomed0.id, 14}}};
    ASSERT_TRUE(KillAtStep(kill_at, [&](StepHook hook) {
      absl::StatusOr<Pool> pool = Pool::Open(path);
      if (!pool.ok()) _exit(2);
      pool->set_step_hook(hook);
      (void)pool->Commit(refused);
    })) << "the refusal passed no step: it is not recorded through the redo";
    absl::StatusOr<Pool> pool = Pool::Open(path);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_TRUE(ExpectAllOrNothing(*pool, f)) << "transaction 1 stays applied";
    // Transaction 1's retry is never answered "refused"; once the refusal is recorded (from the
    // commit point on) transaction 1 is older than the last one.
    absl::StatusOr<CommitResult> retry1 = pool->Commit(f.txn);
    if (kill_at < 2) {
      ASSERT_TRUE(retry1.ok()) << retry1.status();
      EXPECT_TRUE(retry1->duplicate);
    } else {
      EXPECT_EQ(retry1.status().code(), absl::StatusCode::kFailedPrecondition) << retry1.status();
      EXPECT_NE(retry1.status().message().find("older"), std::string::npos) << retry1.status();
    }
    // Transaction 2's retry is refused again, with the refusal's own code.
    const absl::StatusCode refusal = pool->Validate(refused).code();
    ASSERT_NE(refusal, absl::StatusCode::kOk);
    absl::StatusOr<CommitResult> retry2 = pool->Commit(refused);
    EXPECT_EQ(retry2.status().code(), refusal) << retry2.status();
  }
}

// Killed again while replaying (at each replay step), the next restart still finishes it.
TEST(Pool, AServerKilledWhileReplayingFinishesAtTheNextRestart) {
  constexpr int kReplaySteps = 6;  // 4 ops, recorded, cleared
  for (int kill_at = 1; kill_at <= kReplaySteps; ++kill_at) {
    SCOPED_TRACE(absl::StrFormat("replay killed at step %d", kill_at));
    const std::string path = TmpPath(absl::StrFormat("replaykill%d.pool", kill_at));
    const KillFixture f = MakeKillPool(path);
    ASSERT_TRUE(KillAtStep(2, [&](StepHook hook) {  // dies just after the commit point
      absl::StatusOr<Pool> pool = Pool::Open(path);
      if (!pool.ok()) _exit(2);
      pool->set_step_hook(hook);
      (void)pool->Commit(f.txn);
    }));
    ASSERT_TRUE(KillAtStep(kill_at, [&](StepHook hook) {
      absl::StatusOr<Pool> pool = Pool::Open(path, hook);
      _exit(pool.ok() ? 1 : 2);
    }));
    absl::StatusOr<Pool> pool = Pool::Open(path);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_TRUE(ExpectAllOrNothing(*pool, f));
    absl::StatusOr<CommitResult> retry = pool->Commit(f.txn);
    ASSERT_TRUE(retry.ok());
    EXPECT_TRUE(retry->duplicate);
  }
}

void WriteAt(const std::string& path, uint64_t offset, const void* bytes, size_t n) {
  const int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, bytes, n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
  close(fd);
}

TEST(Pool, HostilePoolFilesAreRefusedByName) {
  const PoolOptions o = FileOptions("hostile_file.pool");
  const Layout layout = LayoutFor(o.pool_bytes, o.max_regions, o.max_clients, o.max_ops);
  auto fresh = [&] {
    absl::StatusOr<Pool> pool = Pool::Create(o);
    ASSERT_TRUE(pool.ok());
    ASSERT_TRUE(pool->Alloc(4096, 1).ok());
    ASSERT_TRUE(pool->Alloc(4096, 2).ok());
  };
  auto expect_refused = [&](const std::string& what, absl::StatusCode code) {
    absl::StatusOr<Pool> pool = Pool::Open(o.path);
    EXPECT_EQ(pool.status().code(), code) << what << ": " << pool.status();
    EXPECT_NE(pool.status().message().find(o.path), std::string::npos) << pool.status();
  };
  EXPECT_EQ(Pool::Open(TmpPath("missing.pool")).status().code(), absl::StatusCode::kNotFound);

  fresh();
  ASSERT_EQ(truncate(o.path.c_str(), static_cast<off_t>(layout.file_bytes - 4096)), 0);
  expect_refused("truncated", absl::StatusCode::kDataLoss);
  fresh();
  ASSERT_EQ(truncate(o.path.c_str(), 100), 0);
  expect_refused("shorter than the header", absl::StatusCode::kDataLoss);
  fresh();
  ASSERT_EQ(truncate(o.path.c_str(), static_cast<off_t>(layout.file_bytes + 4096)), 0);
  expect_refused("extended", absl::StatusCode::kDataLoss);
  fresh();
  const uint64_t junk = 0x1234;
  WriteAt(o.path, 0, &junk, 8);
  expect_refused("bad magic", absl::StatusCode::kDataLoss);
  fresh();
  const uint32_t version = 9;
  WriteAt(o.path, 8, &version, 4);
  expect_refused("a newer version", absl::StatusCode::kFailedPrecondition);
  fresh();
  const uint64_t bytes = 1 << 21;
  WriteAt(o.path, 16, &bytes, 8);
  expect_refused("a header whose checksum does not match", absl::StatusCode::kDataLoss);
  // A second record claiming the first's extent, and one past the pool.
  fresh();
  RegionRecord overlapping{3, 0, 4096, kRegionLive, 0};
  WriteAt(o.path, layout.region_offset + 5 * kRegionBytes, &overlapping, sizeof(overlapping));
  expect_refused("overlapping regions", absl::StatusCode::kDataLoss);
  fresh();
  RegionRecord outside{3, kPoolBytes - 64, 4096, kRegionLive, 0};
  WriteAt(o.path, layout.region_offset + 5 * kRegionBytes, &outside, sizeof(outside));
  expect_refused("a region past the pool", absl::StatusCode::kDataLoss);
  fresh();
  RegionRecord same_tag{1, 8192, 64, kRegionLive, 0};
  WriteAt(o.path, layout.region_offset + 5 * kRegionBytes, &same_tag, sizeof(same_tag));
  expect_refused("one tag twice", absl::StatusCode::kDataLoss);
  // A committed redo record whose checksum does not match, and one that matches but names an
  // op past the pool (a forger's: the checksum is not a MAC).
  fresh();
  RedoHead head{};
  head.state = kRedoCommitted;
  head.client_id = 1;
  head.txn_id = 1;
  head.ops = 1;
  RedoOp op{static_cast<uint32_t>(OpKind::kCopy), 0, 0, kPoolBytes, 64};
  head.checksum = RedoChecksum(head, &op) ^ 1;
  WriteAt(o.path, layout.redo_offset + kRedoHeadBytes, &op, sizeof(op));
  WriteAt(o.path, layout.redo_offset, &head, sizeof(head));
  expect_refused("a damaged redo record", absl::StatusCode::kDataLoss);
  head.checksum = RedoChecksum(head, &op);
  WriteAt(o.path, layout.redo_offset, &head, sizeof(head));
  expect_refused("a redo op past the pool", absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace rmem
