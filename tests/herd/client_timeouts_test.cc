// Timeouts that are no evidence of loss (herd/client.h): a request unanswered over the client's
// own absence is not resent for it (once per send), nor one a worker answers as it works through
// its backlog after a silence, and a worker silent past its timeout gets one probe at a time, not
// its whole window again. And what must still hold: a lost request is resent, and every request
// ends within request_deadline, and requests held for a probe that was answered are resent.
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
// Timeouts longer than any step of a test on a loaded machine, so that only what the test does
// times a request out; and the time a test moves the client's clock readings back by.
constexpr absl::Duration kLongTimeout = absl::Seconds(50);
constexpr std::chrono::seconds kAway{100};

struct Knobs {
  absl::Duration timeout = kLongTimeout;  // the first timeout, and the floor
  uint32_t clients = 16;
  double uc_loss = 0;  // of the client's requests
  absl::Duration request_deadline = absl::Minutes(10);
};

std::unique_ptr<Client> Connect(const std::string& server, const std::string& fabric,
                                const Knobs& knobs) {
  ClientOptions options;
  options.server = server;
  options.clients = knobs.clients;
  options.device.fabric = fabric;
  options.device.faults.uc_loss = knobs.uc_loss;
  options.retry_timeout = knobs.timeout;
  options.min_retry_timeout = knobs.timeout;
  options.request_deadline = knobs.request_deadline;
  options.max_attempts = 100'000;  // only request_deadline ends a request
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Submits GETs of fresh keys from every logical client until every window is full; returns how
// many.
uint32_t FillWindows(Client& client) {
  uint32_t submitted = 0;
  uint32_t full_in_a_row = 0;
  for (uint64_t i = 0; full_in_a_row < 1000; ++i) {
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

// Polls until `expected` results came; every one must have `status`.
void PollAll(Client& client, uint32_t expected, Status status = Status::kNotFound) {
  std::vector<Result> results(2048);
  uint32_t got = 0;
  const absl::Time give_up = absl::Now() + kGiveUp;
  while (got < expected && absl::Now() < give_up) {
    const size_t n = client.Poll(absl::MakeSpan(results));
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(results[i].status, status) << "tag " << results[i].tag;
    }
    got += static_cast<uint32_t>(n);
  }
  EXPECT_EQ(got, expected);
}

// Polls until `done` (a Poll that takes no answer reads the clock only now and then).
template <typename Done>
void PollUntil(Client& client, Done done) {
  std::vector<Result> results(16);
  const absl::Time give_up = absl::Now() + kGiveUp;
  while (!done() && absl::Now() < give_up) {
    ASSERT_EQ(client.Poll(absl::MakeSpan(results)), 0u);
  }
  ASSERT_TRUE(done());
}

// Every window full, then the client away (longer than any timeout): the answers wait in its CQ,
// more of them than one Poll takes. None of the requests may be resent, and none of their waits
// (the absence in them) is a round trip.
TEST(ClientTimeouts, TheClientsOwnAbsenceResendsNothing) {
  ServerOptions server_options = SmallServer("timeouts-absence");
  server_options.config.window = 16;  // 16 clients x 2 workers x 16: more than a Poll takes
  ServerProcess server(server_options);
  ASSERT_TRUE(server.ok());
  std::unique_ptr<Client> client = Connect(server.address(), "timeouts-absence", Knobs{});
  ASSERT_NE(client, nullptr);
  const uint32_t outstanding = FillWindows(*client);
  // A Poll takes at most sq_depth answers from the CQ (herd/client.cc).
  ASSERT_GT(outstanding, client->config().sq_depth) << "too few to outlast one Poll";

  ClientTestPeer::BackdateRequests(*client, kAway);
  ClientTestPeer::BackdateWatch(*client, kAway);
  PollAll(*client, outstanding);
  const ClientStats stats = client->stats();
  EXPECT_EQ(stats.retransmissions, 0u) << "requests resent for the client's own absence";
  EXPECT_GE(stats.absences, 1u);
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
      Connect(server.address(), "timeouts-once", Knobs{.clients = 1, .uc_loss = 1.0});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Submit(0, Op::kGet, "lost", "", 0, /*tag=*/1).ok());

  ClientTestPeer::BackdateRequests(*client, kAway);
  ClientTestPeer::BackdateWatch(*client, kAway);
  PollUntil(*client, [&] { return client->stats().absences == 1; });
  EXPECT_EQ(client->stats().retransmissions, 0u) << "resent though the client was away";

  ClientTestPeer::BackdateRequests(*client, kAway);
  ClientTestPeer::BackdateWatch(*client, kAway);
  PollUntil(*client, [&] { return client->stats().retransmissions > 0; });
  EXPECT_EQ(client->stats().retransmissions, 1u);
  EXPECT_EQ(client->stats().absences, 1u) << "a second absence excused the same send";
}

// However its deadline was excused, a request ends at request_deadline.
TEST(ClientTimeouts, AnExcusedRequestStillEndsAtItsRequestDeadline) {
  ServerProcess server(SmallServer("timeouts-deadline"));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<Client> client =
      Connect(server.address(), "timeouts-deadline",
              Knobs{.clients = 1, .uc_loss = 1.0, .request_deadline = absl::Seconds(1)});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Submit(0, Op::kGet, "lost", "", 0, /*tag=*/1).ok());
  // Submitted long ago, and the client away since: the absence moves its deadline past now,
  // but its request deadline passed long ago.
  ClientTestPeer::BackdateRequests(*client, kAway);
  ClientTestPeer::BackdateWatch(*client, kAway);
  PollAll(*client, 1, Status::kTimedOut);
}

// Every window full, the workers silent since (longer than any timeout), then answering all of
// it while the client looks on: more answers than a Poll takes, so the oldest requests are past
// their deadlines when the first answers come. A worker working through its backlog after a
// silence is not sent it again.
TEST(ClientTimeouts, AWorkerCatchingUpAfterASilenceIsNotSentItsBacklogAgain) {
  ServerOptions server_options = SmallServer("timeouts-backlog");
  server_options.config.window = 16;
  ServerProcess server(server_options);
  ASSERT_TRUE(server.ok());
  std::unique_ptr<Client> client = Connect(server.address(), "timeouts-backlog", Knobs{});
  ASSERT_NE(client, nullptr);
  const uint32_t outstanding = FillWindows(*client);
  ASSERT_GT(outstanding, client->config().sq_depth) << "too few to outlast one Poll";

  ClientTestPeer::BackdateRequests(*client, kAway);
  ClientTestPeer::BackdateAnswers(*client, kAway);
  ClientTestPeer::WatchNow(*client);  // the client was watching all along
  PollAll(*client, outstanding);
  const ClientStats stats = client->stats();
  // At most a probe per worker: a check that came before the first answers found it silent.
  EXPECT_LE(stats.retransmissions, client->config().workers)
      << "a worker's backlog resent as it caught up";
  // The rule that kept them: the silence's end excused them, unless that check came first (then
  // they were held for its probe, and the answers came before the probe's timeout).
  if (stats.holds == 0) {
    EXPECT_GE(stats.silences, 1u);
  }
  EXPECT_EQ(stats.absences, 0u);
}

// Every answer of the worker comes 200 ms after it was sent, the timeout is 10 ms: to the
// client the worker is silent. One request at a time probes it (its timeout backing off); the
// others wait for its answers instead of going again each timeout (64 each round).
TEST(ClientTimeouts, ASilentWorkerIsProbedNotSentItsWholeWindow) {
  constexpr uint32_t kResponseDelayUs = 200'000;
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
  std::unique_ptr<Client> client =
      Connect(server.address(), "timeouts-silent", Knobs{.timeout = absl::Milliseconds(10)});
  ASSERT_NE(client, nullptr);
  const uint32_t outstanding = FillWindows(*client);
  ASSERT_EQ(outstanding, client->clients() * client->config().window);

  PollAll(*client, outstanding);
  const ClientStats stats = client->stats();
  EXPECT_GT(stats.retransmissions, 0u) << "no timeout in 200 ms of silence?";
  EXPECT_LE(stats.retransmissions, 2 * kMaxProbeRounds)
      << "a silent worker was sent more than one probe at a time";
  EXPECT_GT(stats.holds, 0u);
}

// A quarter of the requests lost, every window full, nothing else for the worker to answer:
// after the first answers it falls silent with the lost ones outstanding. Its probe is
// answered, so the requests held for it are resent (held one probe round and a doubled wait
// each, most of them timed out at the 5 s request deadline).
TEST(ClientTimeouts, RequestsHeldForAnAnsweredProbeAreResent) {
  ServerOptions options = SmallServer("timeouts-held");
  options.config.workers = 1;
  ServerProcess server(options);
  ASSERT_TRUE(server.ok());
  std::unique_ptr<Client> client = Connect(server.address(), "timeouts-held",
                                           Knobs{.timeout = absl::Milliseconds(10),
                                                 .uc_loss = 0.25,
                                                 .request_deadline = absl::Seconds(5)});
  ASSERT_NE(client, nullptr);
  const uint32_t outstanding = FillWindows(*client);
  PollAll(*client, outstanding);  // each answered (NOT_FOUND), none TIMED_OUT
  EXPECT_GT(client->stats().holds, 0u) << "no request was held: the worker never fell silent?";
}

}  // namespace
}  // namespace herd::testing
