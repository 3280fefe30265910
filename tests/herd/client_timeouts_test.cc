// Timeouts that are no evidence of loss (herd/client.h): a request unanswered over the client's
// own absence is not resent for it (once per send), nor one a worker answers as it works through
// its backlog after a silence, and a worker silent past its timeout gets one probe at a time, not
// its whole window again.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "herd/client.h"
#include "tests/herd/client_test_peer.h"
#include "tests/herd/server_fixture.h"

namespace herd::testing {
namespace {

// A bound on every wait for answers: far past anything a loaded test machine needs.
constexpr absl::Duration kGiveUp = absl::Seconds(30);

// A client of `clients` logical clients whose every timeout is `timeout` until it has measured
// a round trip (and never less): long enough that only what a test does times a request out.
std::unique_ptr<Client> Connect(const ServerProcess& server, const std::string& fabric,
                                absl::Duration timeout, uint32_t clients = 16, double uc_loss = 0) {
  ClientOptions options;
  options.server = server.address();
  options.clients = clients;
  options.device.fabric = fabric;
  options.device.faults.uc_loss = uc_loss;
  options.retry_timeout = timeout;
  options.min_retry_timeout = timeout;
  options.request_deadline = absl::Minutes(5);
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Submits GETs of fresh keys from every logical client until every window is full (or `most`
// are outstanding); returns how many.
uint32_t FillWindows(Client& client, uint32_t most) {
  uint32_t submitted = 0;
  uint32_t full_in_a_row = 0;
  for (uint64_t i = 0; submitted < most && full_in_a_row < 1000; ++i) {
    const std::string key = absl::StrCat("key-", i);
    const uint32_t c = static_cast<uint32_t>(i % client.clients());
    if (!client.CanSubmit(c, Client::HashKey(key), 0)) {
      ++full_in_a_row;
      continue;
    }
    full_in_a_row = 0;
    EXPECT_TRUE(client.Submit(c, Op::kGet, key, "", 0, /*tag=*/i).ok());
    ++submitted;
  }
  return submitted;
}

// Polls until `expected` results came (every one answered, none failed by the client).
void PollAll(Client& client, uint32_t expected) {
  std::vector<Result> results(2048);
  uint32_t got = 0;
  const absl::Time give_up = absl::Now() + kGiveUp;
  while (got < expected && absl::Now() < give_up) {
    const size_t n = client.Poll(absl::MakeSpan(results));
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(results[i].status, Status::kNotFound) << "tag " << results[i].tag;
    }
    got += static_cast<uint32_t>(n);
  }
  EXPECT_EQ(got, expected);
}

// Polls until the client has counted `absences` absences (a Poll that takes no answer reads
// the clock only now and then).
void PollUntilAbsences(Client& client, uint64_t absences) {
  std::vector<Result> results(16);
  const absl::Time give_up = absl::Now() + kGiveUp;
  while (client.stats().absences < absences && absl::Now() < give_up) {
    EXPECT_EQ(client.Poll(absl::MakeSpan(results)), 0u);
  }
  ASSERT_EQ(client.stats().absences, absences);
}

// Every window full, then the client away for 5 s (longer than any timeout): the answers
// wait in its CQ, more of them than one Poll takes. None of the requests may be resent, and
// none of their waits (the absence in them) is a round trip.
TEST(ClientTimeouts, TheClientsOwnAbsenceResendsNothing) {
  ServerOptions server_options = SmallServer("timeouts-absence");
  server_options.config.window = 16;  // 16 clients x 2 workers x 16: more than a Poll takes
  ServerProcess server(server_options);
  ASSERT_TRUE(server.ok());
  std::unique_ptr<Client> client = Connect(server, "timeouts-absence", absl::Seconds(1));
  ASSERT_NE(client, nullptr);
  const uint32_t outstanding = FillWindows(*client, ~0u);
  // A Poll takes at most sq_depth answers from the CQ (herd/client.cc).
  ASSERT_GT(outstanding, client->config().sq_depth) << "too few to outlast one Poll";

  ClientTestPeer::BackdateRequests(*client, std::chrono::seconds(5));
  ClientTestPeer::BackdateWatch(*client, std::chrono::seconds(5));
  PollAll(*client, outstanding);
  const ClientStats stats = client->stats();
  EXPECT_EQ(stats.retransmissions, 0u) << "requests resent for the client's own absence";
  EXPECT_GE(stats.absences, 1u);  // more if a loaded machine descheduled this thread
  for (uint32_t worker = 0; worker < client->config().workers; ++worker) {
    EXPECT_FALSE(ClientTestPeer::TimerHasSample(*client, worker))
        << "a wait the absence lengthened was taken for a round trip (worker " << worker << ")";
  }
}

// An application that polls less often than its timeouts: the first absence moves a lost
// request's deadline, the second (the same send) does not, and the request is resent.
TEST(ClientTimeouts, AnAbsenceExcusesASendOnlyOnce) {
  ServerProcess server(SmallServer("timeouts-once"));
  ASSERT_TRUE(server.ok());
  // Every request lost: only a resend can be counted.
  std::unique_ptr<Client> client =
      Connect(server, "timeouts-once", absl::Seconds(1), /*clients=*/1, /*uc_loss=*/1.0);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Submit(0, Op::kGet, "lost", "", 0, /*tag=*/1).ok());

  ClientTestPeer::BackdateRequests(*client, std::chrono::seconds(5));
  ClientTestPeer::BackdateWatch(*client, std::chrono::seconds(5));
  PollUntilAbsences(*client, 1);
  EXPECT_EQ(client->stats().retransmissions, 0u) << "resent though the client was away";

  ClientTestPeer::BackdateRequests(*client, std::chrono::seconds(5));
  ClientTestPeer::BackdateWatch(*client, std::chrono::seconds(5));
  PollUntilAbsences(*client, 2);
  EXPECT_EQ(client->stats().retransmissions, 1u) << "a second absence excused the same send";
}

// Every window full, the workers silent for 5 s since (longer than any timeout), then answering
// all of it while the client looks on: more answers than a Poll takes, so the oldest requests are
// past their deadlines when the first answers come. A worker working through its backlog after a
// silence is not sent it again.
TEST(ClientTimeouts, AWorkerCatchingUpAfterASilenceIsNotSentItsBacklogAgain) {
  ServerOptions server_options = SmallServer("timeouts-backlog");
  server_options.config.window = 16;
  ServerProcess server(server_options);
  ASSERT_TRUE(server.ok());
  std::unique_ptr<Client> client = Connect(server, "timeouts-backlog", absl::Seconds(1));
  ASSERT_NE(client, nullptr);
  const uint32_t outstanding = FillWindows(*client, ~0u);
  ASSERT_GT(outstanding, client->config().sq_depth) << "too few to outlast one Poll";

  ClientTestPeer::BackdateRequests(*client, std::chrono::seconds(5));
  ClientTestPeer::BackdateAnswers(*client, std::chrono::seconds(5));
  PollAll(*client, outstanding);
  // At most a probe per worker: a check that came before the first answers found it silent.
  EXPECT_LE(client->stats().retransmissions, client->config().workers)
      << "a worker's backlog resent as it caught up";
}

// Every answer of the worker comes 200 ms after it was sent, the timeout is 10 ms: to the
// client the worker is silent. One request at a time probes it (its timeout backing off); the
// others wait for its answers instead of going again each timeout (64 each round).
TEST(ClientTimeouts, ASilentWorkerIsProbedNotSentItsWholeWindow) {
  constexpr uint32_t kResponseDelayUs = 200'000;
  constexpr absl::Duration kTimeout = absl::Milliseconds(10);
  // Probe rounds before the first answer: one per doubling timeout (10, 30, 70, 150 ms, then
  // 310: past the delay); 8 allow for a loaded machine's stalls up to 2.5 s. Each probe's
  // answer is one more than the window's receives expect and may push out another answer,
  // which is then resent (the worker no longer silent): at most twice the rounds in all.
  constexpr uint32_t kMaxProbeRounds = 8;
  ServerOptions options = SmallServer("timeouts-silent");
  options.config.workers = 1;
  options.device.faults.delay_us = kResponseDelayUs;
  ServerProcess server(options);
  ASSERT_TRUE(server.ok());
  std::unique_ptr<Client> client = Connect(server, "timeouts-silent", kTimeout);
  ASSERT_NE(client, nullptr);
  const uint32_t outstanding = FillWindows(*client, ~0u);
  ASSERT_EQ(outstanding, client->clients() * client->config().window);

  PollAll(*client, outstanding);
  const ClientStats stats = client->stats();
  EXPECT_GT(stats.retransmissions, 0u) << "no timeout in 200 ms of silence?";
  EXPECT_LE(stats.retransmissions, 2 * kMaxProbeRounds)
      << "a silent worker was sent more than one probe at a time";
  EXPECT_GT(stats.holds, 0u);
}

}  // namespace
}  // namespace herd::testing
