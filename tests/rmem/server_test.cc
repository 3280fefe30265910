// rmem_server and its client library end to end (shm fabric; in the guest, rxe0 through
// HERD_VERBS_DEVICE): tag idempotence across client restarts, put/get of every size, commits,
// ownership enforced by the fabric (another client's rkey, a freed region), identities resumed,
// clients killed (kill -9 of a forked process) before and after txn_go, and the shadow layer.
#include "rmem/server.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "rmem/client.h"
#include "rmem/shadow.h"
#include "tests/rmem/rmem_fixture.h"

namespace rmem {
namespace {

using testing::ServerThread;
using testing::TestClient;
using testing::TestServer;

std::unique_ptr<ServerThread> StartServer(const ServerOptions& options) {
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  return std::make_unique<ServerThread>(*std::move(server));
}

std::unique_ptr<Client> Connect(ServerThread& s, const std::string& test,
                                ClientCredential resume = {}) {
  ClientOptions o = TestClient(s.server(), test);
  o.resume = resume;
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

std::vector<uint8_t> Pattern(uint64_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (uint64_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

TEST(RmemService, AllocIsIdempotentPerTagAcrossClientRestarts) {
  auto server = StartServer(TestServer("idem"));
  ASSERT_NE(server, nullptr);
  RemoteRegion first;
  const std::vector<uint8_t> data = Pattern(4096, 3);
  {
    std::unique_ptr<Client> c = Connect(*server, "idem");
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->pool_bytes(), TestServer("idem").pool.pool_bytes);
    absl::StatusOr<RemoteRegion> r = c->Alloc(4000, 11);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->bytes, 4032u);  // rounded up to kRegionAlign
    absl::StatusOr<RemoteRegion> again = c->Alloc(4000, 11);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->addr, r->addr);
    ASSERT_TRUE(c->Put(*r, 0, data.data(), 4000).ok());
    first = *r;
  }
  // A new process of the same program (a new client): the same region, its bytes kept.
  std::unique_ptr<Client> c = Connect(*server, "idem");
  ASSERT_NE(c, nullptr);
  absl::StatusOr<RemoteRegion> r = c->Alloc(4000, 11);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->addr, first.addr);
  std::vector<uint8_t> back(4000);
  ASSERT_TRUE(c->Get(*r, 0, back.data(), back.size()).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), data.data(), back.size()));
  // The tag names a region of one size.
  EXPECT_EQ(c->Alloc(8192, 11).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Alloc(64, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Alloc(uint64_t{1} << 40, 12).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RmemService, PutAndGetMoveEverySizeBothWays) {
  auto server = StartServer(TestServer("putget"));
  ASSERT_NE(server, nullptr);
  ClientOptions o = TestClient(server->server(), "putget");
  o.staging_bytes = 64 << 10;  // so the larger sizes go through the bounce buffer in pieces
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<RemoteRegion> r = (*c)->Alloc(1 << 20, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<uint8_t*> local = (*c)->AllocateLocal(1 << 20);
  ASSERT_TRUE(local.ok());
  for (uint64_t bytes = 64; bytes <= (1 << 20); bytes *= 4) {
    SCOPED_TRACE(absl::StrFormat("%u bytes", bytes));
    const std::vector<uint8_t> data = Pattern(bytes, static_cast<uint8_t>(bytes));
    const uint64_t offset = (1 << 20) - bytes;                    // the region's end
    ASSERT_TRUE((*c)->Put(*r, offset, data.data(), bytes).ok());  // staged
    std::vector<uint8_t> back(bytes);
    ASSERT_TRUE((*c)->Get(*r, offset, back.data(), bytes).ok());
    EXPECT_EQ(back, data);
    std::memset(*local, 0, bytes);
    ASSERT_TRUE((*c)->Get(*r, offset, *local, bytes).ok());  // zero-copy
    EXPECT_EQ(0, std::memcmp(*local, data.data(), bytes));
  }
  uint8_t byte = 0;
  EXPECT_EQ((*c)->Put(*r, 1 << 20, &byte, 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*c)->Get(*r, ~uint64_t{0}, &byte, 2).code(), absl::StatusCode::kOutOfRange);
}

TEST(RmemService, TxnGoAppliesQueuedCopiesAndFreesOnceAndRefusalsDiscardTheQueue) {
  auto server = StartServer(TestServer("txn"));
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> c = Connect(*server, "txn");
  ASSERT_NE(c, nullptr);
  RemoteRegion a = *c->Alloc(4096, 1), b = *c->Alloc(4096, 2), doomed = *c->Alloc(64, 3);
  const std::vector<uint8_t> data = Pattern(4096, 9);
  ASSERT_TRUE(c->Put(a, 0, data.data(), 4096).ok());
  ASSERT_TRUE(c->Cp(b, 0, a, 0, 2048).ok());
  ASSERT_TRUE(c->Cp(b, 2048, a, 2048, 2048).ok());
  ASSERT_TRUE(c->Free(doomed).ok());
  absl::StatusOr<TxnResult> done = c->TxnGo();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->bytes_copied, 4096u);
  EXPECT_EQ(done->freed, 1u);
  EXPECT_FALSE(done->duplicate);
  std::vector<uint8_t> back(4096);
  ASSERT_TRUE(c->Get(b, 0, back.data(), 4096).ok());
  EXPECT_EQ(back, data);
  // The lost-reply retry is answered, not applied again.
  const std::vector<uint8_t> other = Pattern(4096, 77);
  ASSERT_TRUE(c->Put(a, 0, other.data(), 4096).ok());
  absl::StatusOr<TxnResult> retry = c->RetryTxnGo(done->txn_id);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->duplicate);
  ASSERT_TRUE(c->Get(b, 0, back.data(), 4096).ok());
  EXPECT_EQ(back, data);
  // A refused transaction applies nothing, not even its good ops, and leaves nothing queued.
  ASSERT_TRUE(c->Cp(b, 0, a, 0, 64).ok());
  ASSERT_TRUE(c->Cp(b, 4000, a, 0, 200).ok());  // past b's end
  EXPECT_EQ(c->TxnGo().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(c->queued(), 0u);
  ASSERT_TRUE(c->Get(b, 0, back.data(), 4096).ok());
  EXPECT_EQ(back, data);
  // Nothing queued, overlapping copies, a region freed already.
  EXPECT_EQ(c->TxnGo().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c->Cp(a, 64, a, 0, 128).ok());
  EXPECT_EQ(c->TxnGo().status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->Free(doomed).ok());
  EXPECT_EQ(c->TxnGo().status().code(), absl::StatusCode::kPermissionDenied);
  // The client goes on.
  ASSERT_TRUE(c->Cp(b, 0, a, 0, 4096).ok());
  ASSERT_TRUE(c->TxnGo().ok());
  ASSERT_TRUE(c->Get(b, 0, back.data(), 4096).ok());
  EXPECT_EQ(back, other);
}

// Queued ops travel in batches of kMaxOpsPerCommand; a transaction of more is applied whole, and
// one past the pool's max_ops is refused whole.
TEST(RmemService, TransactionsSpanSeveralBatches) {
  ServerOptions so = TestServer("batches");
  so.pool.max_ops = 400;
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> c = Connect(*server, "batches");
  ASSERT_NE(c, nullptr);
  RemoteRegion src = *c->Alloc(64 * 400, 1), dst = *c->Alloc(64 * 400, 2);
  const std::vector<uint8_t> data = Pattern(64 * 400, 5);
  ASSERT_TRUE(c->Put(src, 0, data.data(), data.size()).ok());
  for (uint64_t i = 0; i < 400; ++i) ASSERT_TRUE(c->Cp(dst, i * 64, src, i * 64, 64).ok());
  absl::StatusOr<TxnResult> done = c->TxnGo();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->bytes_copied, 64u * 400);
  std::vector<uint8_t> back(data.size());
  ASSERT_TRUE(c->Get(dst, 0, back.data(), back.size()).ok());
  EXPECT_EQ(back, data);
  absl::Status s;
  for (uint64_t i = 0; i < 401 && s.ok(); ++i) s = c->Cp(dst, i * 64 % (64 * 400), src, 0, 1);
  if (s.ok()) s = c->TxnGo().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(c->queued(), 0u);
}

// The fabric enforces ownership: another client's rkey and address reach nothing (its MRs are
// in another PD), a region not granted cannot be named in a copy, and a freed region's MR is
// gone from every client.
TEST(RmemService, AClientReachesOnlyItsOwnRegions) {
  auto server = StartServer(TestServer("owner"));
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> alice = Connect(*server, "owner");
  std::unique_ptr<Client> mallory = Connect(*server, "owner");
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(mallory, nullptr);
  RemoteRegion secret = *alice->Alloc(4096, 100);
  const std::vector<uint8_t> data = Pattern(4096, 1);
  ASSERT_TRUE(alice->Put(secret, 0, data.data(), 4096).ok());
  RemoteRegion own = *mallory->Alloc(4096, 200);
  // Naming alice's region by tag in a copy, without a grant.
  ASSERT_TRUE(mallory->Cp(own, 0, secret, 0, 4096).ok());
  EXPECT_EQ(mallory->TxnGo().status().code(), absl::StatusCode::kPermissionDenied);
  // Her address and rkey on his QP: refused by the fabric; his connection breaks.
  std::vector<uint8_t> stolen(4096, 0);
  EXPECT_FALSE(mallory->Get(secret, 0, stolen.data(), 4096).ok());
  EXPECT_EQ(stolen, std::vector<uint8_t>(4096, 0));
  EXPECT_FALSE(mallory->Alloc(64, 201).ok());  // broken: reconnect to go on
  std::vector<uint8_t> back(4096);
  ASSERT_TRUE(alice->Get(secret, 0, back.data(), 4096).ok());
  EXPECT_EQ(back, data);

  // A grant by tag, then a free by the other holder: the old MR reaches nothing.
  std::unique_ptr<Client> bob = Connect(*server, "owner");
  ASSERT_NE(bob, nullptr);
  absl::StatusOr<RemoteRegion> shared = bob->Alloc(4096, 100);
  ASSERT_TRUE(shared.ok()) << shared.status();
  ASSERT_TRUE(bob->Get(*shared, 0, back.data(), 4096).ok());
  EXPECT_EQ(back, data);
  ASSERT_TRUE(alice->Free(secret).ok());
  ASSERT_TRUE(alice->TxnGo().ok());
  EXPECT_FALSE(bob->Get(*shared, 0, back.data(), 64).ok());
}

// An identity is resumed with its credential (and only so), and not twice at once.
TEST(RmemService, IdentitiesAreResumedWithTheirSecretOnly) {
  auto server = StartServer(TestServer("resume"));
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> c = Connect(*server, "resume");
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->resumed());
  RemoteRegion a = *c->Alloc(64, 1), b = *c->Alloc(64, 2);
  ASSERT_TRUE(c->Cp(b, 0, a, 0, 64).ok());
  absl::StatusOr<TxnResult> done = c->TxnGo();
  ASSERT_TRUE(done.ok());
  const ClientCredential me = c->credential();
  ClientOptions o = TestClient(server->server(), "resume");
  o.resume = me;
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kFailedPrecondition)
      << "connected twice at once";
  c.reset();
  ASSERT_TRUE(server->WaitFor([](const Server& s) { return s.clients() == 0; }));
  o.resume.secret ^= 1;
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kUnauthenticated);
  o.resume = me;
  absl::StatusOr<std::unique_ptr<Client>> again = Client::Connect(o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->resumed());
  EXPECT_EQ((*again)->last_txn(), done->txn_id);
  // Its grants were the old session's: it re-allocates by tag, then retries.
  ASSERT_TRUE((*again)->Alloc(64, 1).ok());
  absl::StatusOr<TxnResult> retry = (*again)->RetryTxnGo(done->txn_id);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->duplicate);
  ASSERT_TRUE((*again)->Forget().ok());
  again->reset();
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kUnauthenticated);
}

// A forked client queues a transaction's ops (a full batch reaches the server), then is killed
// before (nothing applied, the queue discarded) or after (everything applied) sending txn_go.
void KillClientAround(bool after_txn_go) {
  const std::string test = after_txn_go ? "killafter" : "killbefore";
  auto server = StartServer(TestServer(test));
  ASSERT_NE(server, nullptr);
  constexpr uint64_t kOps = kMaxOpsPerCommand + 10;
  std::unique_ptr<Client> observer = Connect(*server, test);
  ASSERT_NE(observer, nullptr);
  RemoteRegion src = *observer->Alloc(64 * kOps, 1), dst = *observer->Alloc(64 * kOps, 2);
  ASSERT_TRUE(observer->Alloc(64, 3).ok());
  const std::vector<uint8_t> data = Pattern(64 * kOps, 4);
  ASSERT_TRUE(observer->Put(src, 0, data.data(), data.size()).ok());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const ClientOptions o = TestClient(server->server(), test);  // the parent's fabric name
  const pid_t child = fork();
  if (child == 0) {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
    if (!c.ok()) _exit(2);
    RemoteRegion s = *(*c)->Alloc(64 * kOps, 1), d = *(*c)->Alloc(64 * kOps, 2);
    RemoteRegion f = *(*c)->Alloc(64, 3);
    for (uint64_t i = 0; i < kOps; ++i) {
      if (!(*c)->Cp(d, i * 64, s, i * 64, 64).ok()) _exit(3);
    }
    if (!(*c)->Free(f).ok()) _exit(3);
    const char byte = 1;
    if (!after_txn_go) {
      (void)!write(ready[1], &byte, 1);  // a batch is on the server, the rest here
      pause();
    }
    (*c)->set_on_txn_sent([&] {
      (void)!write(ready[1], &byte, 1);  // txn_go has left: killed before any reply
      pause();
    });
    (void)(*c)->TxnGo();
    _exit(4);
  }
  close(ready[1]);  // a child that dies early ends the read
  char byte = 0;
  const ssize_t got = read(ready[0], &byte, 1);
  close(ready[0]);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_EQ(got, 1) << "the child failed: status " << status;
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_TRUE(server->WaitFor([](const Server& s) { return s.counters().left == 1; }));
  std::vector<uint8_t> back(data.size());
  ASSERT_TRUE(observer->Get(dst, 0, back.data(), back.size()).ok());
  if (after_txn_go) {
    EXPECT_EQ(back, data);
    EXPECT_EQ(observer->Alloc(128, 3).status().code(), absl::StatusCode::kOk)
        << "tag 3 was freed: a new region of another size may take it";
  } else {
    EXPECT_EQ(back, std::vector<uint8_t>(data.size(), 0));
    EXPECT_EQ(observer->Alloc(128, 3).status().code(), absl::StatusCode::kFailedPrecondition)
        << "tag 3 is still tied to its 64-byte region";
    server->Stop();
    EXPECT_EQ(server->server().counters().ops_discarded, kMaxOpsPerCommand);
    server->Start();
  }
}

TEST(RmemService, AClientKilledBeforeTxnGoAppliesNothing) { KillClientAround(false); }
TEST(RmemService, AClientKilledAfterSendingTxnGoHasItApplied) { KillClientAround(true); }

// The shadow layer: commits are atomic and survive a client restart; uncommitted changes do not.
TEST(RmemService, ShadowPagesCommitAndRecoverAcrossAClientRestart) {
  auto server = StartServer(TestServer("shadow"));
  ASSERT_NE(server, nullptr);
  constexpr uint64_t kBytes = 64 << 10;
  std::vector<uint8_t> model(kBytes, 0);
  std::mt19937_64 rng(7);
  {
    std::unique_ptr<Client> c = Connect(*server, "shadow");
    ASSERT_NE(c, nullptr);
    absl::StatusOr<ShadowMemory> m = ShadowMemory::Open(c.get(), {42, kBytes, 64});
    ASSERT_TRUE(m.ok()) << m.status();
    for (int round = 0; round < 20; ++round) {
      for (int w = 0; w < 10; ++w) {
        const uint64_t len = 1 + rng() % 300, off = rng() % (kBytes - len);
        std::vector<uint8_t> bytes = Pattern(len, static_cast<uint8_t>(rng()));
        ASSERT_TRUE(m->Write(off, bytes.data(), len).ok());
        std::memcpy(model.data() + off, bytes.data(), len);
      }
      absl::StatusOr<CommitStats> stats = m->Commit();
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_GE(stats->runs, 1u);
      EXPECT_LE(stats->bytes_written, 10u * (300 + 128));  // granules, not pages
      EXPECT_EQ(stats->txn.bytes_copied, stats->bytes_written);
    }
    // A change never committed.
    const uint8_t junk[100] = {1};
    ASSERT_TRUE(m->Write(1000, junk, sizeof(junk)).ok());
    absl::StatusOr<ShadowMemory> clean = ShadowMemory::Open(c.get(), {43, 64, 64});
    ASSERT_TRUE(clean.ok()) << clean.status();
    absl::StatusOr<CommitStats> none = clean->Commit();
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(none->runs, 0u);  // nothing dirty: no transaction
  }
  std::unique_ptr<Client> c = Connect(*server, "shadow");
  ASSERT_NE(c, nullptr);
  absl::StatusOr<ShadowMemory> m = ShadowMemory::Open(c.get(), {42, kBytes, 64});
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->Recover().ok());
  EXPECT_EQ(0, std::memcmp(m->data(), model.data(), kBytes));
}

// Scattered changes: more runs than one doorbell's WRITEs (several doorbells), and more than a
// transaction's max_ops copies (the smallest clean gaps are committed too): still one atomic
// commit of exactly the local buffer.
TEST(RmemService, ShadowCommitsOfManyScatteredRuns) {
  ServerOptions so = TestServer("scattered");
  so.pool.max_ops = 300;
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> c = Connect(*server, "scattered");
  ASSERT_NE(c, nullptr);
  constexpr uint64_t kBytes = 128 << 10;  // 2048 granules
  absl::StatusOr<ShadowMemory> m = ShadowMemory::Open(c.get(), {5, kBytes, 64});
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<uint8_t> model(kBytes, 0);
  for (const uint64_t runs : {uint64_t{250}, uint64_t{700}}) {
    SCOPED_TRACE(absl::StrFormat("%u runs", runs));
    for (uint64_t i = 0; i < runs; ++i) {
      const uint64_t at = i * (kBytes / runs) / 64 * 64;  // one granule in every stretch
      const std::vector<uint8_t> bytes = Pattern(64, static_cast<uint8_t>(i + runs));
      ASSERT_TRUE(m->Write(at, bytes.data(), 64).ok());
      std::memcpy(model.data() + at, bytes.data(), 64);
    }
    absl::StatusOr<CommitStats> stats = m->Commit();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->runs, std::min<uint64_t>(runs, 300)) << "exactly the smallest gaps merged";
    ASSERT_TRUE(m->Recover().ok());
    EXPECT_EQ(0, std::memcmp(m->data(), model.data(), kBytes));
  }
}

// Clients at once: each commits its own shadow buffer, and pairs share a buffer by tag, each
// committing only its own granules; afterwards every buffer holds every client's last commit.
TEST(RmemService, ConcurrentClientsOnDisjointAndSharedTags) {
  auto server = StartServer(TestServer("concurrent"));
  ASSERT_NE(server, nullptr);
  constexpr int kClients = 4;
  constexpr uint64_t kBytes = 16 << 10;
  constexpr int kRounds = 30;
  std::vector<std::vector<uint8_t>> own(kClients, std::vector<uint8_t>(kBytes));
  std::vector<uint8_t> shared(kBytes);  // client i owns granules g with g % kClients == i
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      std::unique_ptr<Client> c = Connect(*server, "concurrent");
      if (c == nullptr) return (void)++failures;
      absl::StatusOr<ShadowMemory> mine = ShadowMemory::Open(c.get(), {uint64_t(10 + i), kBytes});
      absl::StatusOr<ShadowMemory> ours = ShadowMemory::Open(c.get(), {99, kBytes});
      if (!mine.ok() || !ours.ok()) return (void)++failures;
      std::mt19937_64 rng(i);
      for (int r = 0; r < kRounds; ++r) {
        const uint64_t off = rng() % (kBytes - 256);
        const std::vector<uint8_t> bytes = Pattern(256, static_cast<uint8_t>(rng()));
        if (!mine->Write(off, bytes.data(), 256).ok()) ++failures;
        std::memcpy(own[i].data() + off, bytes.data(), 256);
        const uint64_t g = (rng() % (kBytes / 64 / kClients)) * kClients + i;
        if (!ours->Write(g * 64, bytes.data(), 64).ok()) ++failures;
        std::memcpy(shared.data() + g * 64, bytes.data(), 64);  // disjoint per client
        if (!mine->Commit().ok() || !ours->Commit().ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  std::unique_ptr<Client> c = Connect(*server, "concurrent");
  ASSERT_NE(c, nullptr);
  for (int i = 0; i < kClients; ++i) {
    absl::StatusOr<ShadowMemory> m = ShadowMemory::Open(c.get(), {uint64_t(10 + i), kBytes});
    ASSERT_TRUE(m.ok() && m->Recover().ok());
    EXPECT_EQ(0, std::memcmp(m->data(), own[i].data(), kBytes)) << "client " << i;
  }
  absl::StatusOr<ShadowMemory> m = ShadowMemory::Open(c.get(), {99, kBytes});
  ASSERT_TRUE(m.ok() && m->Recover().ok());
  EXPECT_EQ(0, std::memcmp(m->data(), shared.data(), kBytes));
}

}  // namespace
}  // namespace rmem
