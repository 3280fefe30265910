// rmem_server killed at every step of applying a transaction (a forked server process that the
// pool's step hook stops at that instant, not timing), then restarted on the same pool file:
// the transaction is entirely applied or entirely absent, the client resumes its identity, and
// its retried txn_go is answered as the outcome was (applied once, or never seen).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "rmem/client.h"
#include "rmem/server.h"
#include "tests/rmem/rmem_fixture.h"

namespace rmem {
namespace {

using testing::ServerThread;
using testing::TestServer;
using testing::TmpPath;

constexpr uint64_t kPage = 4096;

std::vector<uint8_t> Filled(uint64_t bytes, uint8_t byte) {
  return std::vector<uint8_t>(bytes, byte);
}

// Starts a server process on `options` whose pool stops it (_exit, as kill -9 would leave the
// file) at the `kill_at`-th step of a commit. Returns its pid and port.
std::pair<pid_t, uint16_t> ForkServer(ServerOptions options, int kill_at) {
  int ports[2];
  if (pipe(ports) != 0) return {-1, 0};
  const pid_t child = fork();
  if (child == 0) {
    close(ports[0]);
    int seen = 0;
    options.pool_hook = [&](CommitStep, uint32_t) {
      if (++seen == kill_at) _exit(0);
    };
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
    if (!server.ok()) _exit(2);
    const uint16_t port = (*server)->port();
    (void)!write(ports[1], &port, sizeof(port));
    std::atomic<bool> stop{false};
    (*server)->Run(stop);
    _exit(1);
  }
  close(ports[1]);
  uint16_t port = 0;
  const bool got = read(ports[0], &port, sizeof(port)) == sizeof(port);
  close(ports[0]);
  return {child, got ? port : 0};
}

ClientOptions ClientFor(const ServerOptions& server, uint16_t port) {
  ClientOptions o;
  o.server = absl::StrFormat("127.0.0.1:%u", port);
  o.device = server.device;
  o.timeout = absl::Seconds(20);
  return o;
}

// The transaction: two page copies and a free (2 + 1 op steps, after the redo's 2 and before
// the record's and the clear's: 7 steps).
TEST(RmemServerKill, AServerKilledAtEveryStepOfATransactionLeavesAllOrNothing) {
  constexpr int kSteps = 7;
  int applied_count = 0;
  for (int kill_at = 1; kill_at <= kSteps; ++kill_at) {
    SCOPED_TRACE(absl::StrFormat("server killed at step %d", kill_at));
    const std::string path = TmpPath(absl::StrFormat("server_kill%d.pool", kill_at));
    unlink(path.c_str());
    const ServerOptions options = TestServer(absl::StrFormat("srvkill%d", kill_at), path);
    const auto [child, port] = ForkServer(options, kill_at);
    ASSERT_GT(child, 0);
    ASSERT_NE(port, 0) << "the server process did not start";
    ClientCredential me;
    {
      absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(ClientFor(options, port));
      ASSERT_TRUE(c.ok()) << c.status();
      RemoteRegion src0 = *(*c)->Alloc(kPage, 1), src1 = *(*c)->Alloc(kPage, 2);
      RemoteRegion dst0 = *(*c)->Alloc(kPage, 3), dst1 = *(*c)->Alloc(kPage, 4);
      RemoteRegion doomed = *(*c)->Alloc(64, 5);
      ASSERT_TRUE((*c)->Put(src0, 0, Filled(kPage, 0xa0).data(), kPage).ok());
      ASSERT_TRUE((*c)->Put(src1, 0, Filled(kPage, 0xb1).data(), kPage).ok());
      ASSERT_TRUE((*c)->Cp(dst0, 0, src0, 0, kPage).ok());
      ASSERT_TRUE((*c)->Cp(dst1, 0, src1, 0, kPage).ok());
      ASSERT_TRUE((*c)->Free(doomed).ok());
      absl::StatusOr<TxnResult> lost = (*c)->TxnGo();
      EXPECT_FALSE(lost.ok()) << "the server died before its reply";
      me = (*c)->credential();
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;

    // Restarted on the same file: a committed transaction is finished first.
    absl::StatusOr<std::unique_ptr<Server>> restarted = Server::Create(options);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    EXPECT_EQ((*restarted)->pool().stats().replayed, kill_at >= 2 && kill_at < kSteps);
    ServerThread server(*std::move(restarted));
    ClientOptions again = ClientFor(options, server.server().port());
    again.resume = me;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(again);
    ASSERT_TRUE(c.ok()) << c.status();
    const bool applied = (*c)->last_txn() == 1;
    EXPECT_EQ(applied, kill_at >= 2) << "the commit point is the second step";
    RemoteRegion dst0 = *(*c)->Alloc(kPage, 3), dst1 = *(*c)->Alloc(kPage, 4);
    std::vector<uint8_t> back(kPage);
    ASSERT_TRUE((*c)->Get(dst0, 0, back.data(), kPage).ok());
    EXPECT_EQ(back, Filled(kPage, applied ? 0xa0 : 0));
    ASSERT_TRUE((*c)->Get(dst1, 0, back.data(), kPage).ok());
    EXPECT_EQ(back, Filled(kPage, applied ? 0xb1 : 0));
    // Tag 5 is free exactly when applied: a region of another size can then take it.
    EXPECT_EQ((*c)->Alloc(128, 5).ok(), applied);
    // The retry is answered as the outcome was: applied once, or never seen.
    absl::StatusOr<TxnResult> retry = (*c)->RetryTxnGo(1);
    if (applied) {
      ASSERT_TRUE(retry.ok()) << retry.status();
      EXPECT_TRUE(retry->duplicate);
    } else {
      EXPECT_EQ(retry.status().code(), absl::StatusCode::kFailedPrecondition) << retry.status();
    }
    applied_count += applied;
  }
  EXPECT_EQ(applied_count, kSteps - 1);
}

}  // namespace
}  // namespace rmem
