// The worker's rules, one test each, driving a Worker directly on the in-process shm fabric: the
// test owns the worker's request region (it writes request bytes straight into slots, as a
// client's WRITE would land), plays the client with a UD QP of its own (responses arrive on its
// receive CQ), and runs Worker::Run on a thread.
//
// "No answer" is never proved by a sleep. The worker consumes a slot's marker after it handled
// the slot (batched or dropped), and posts a batch's responses in order on its one UD QP; the
// shm fabric delivers them in order. So: once a request's marker is consumed (or, for a request
// whose marker stays, after two full round trips of a probe request written after it: the
// second probe's gather starts after the first probe was answered, and a gather with room in its
// batch scans every slot once), a probe's answer comes after any answer the request produced.
// Every response that arrives before the probe's is returned by Barrier(), and must be none.
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/herd/worker_harness.h"

namespace herd::worker_test {
namespace {

TEST(WorkerRulesTest, EachOpIsAnsweredOnceWithItsFieldsEchoedAndItsMarkerConsumed) {
  Harness h(SlotsAndUd());
  const std::string key = KeyOf(kWorkerIndex, 0);
  Request put = Put(0, 1, key, "first value");
  put.attempt = 2;  // a later attempt that is the first to land: executes, and is echoed
  const Response p = h.Call(put);
  EXPECT_EQ(StatusOf(p), Status::kOk);
  EXPECT_EQ(p.header.attempt, 2u);
  EXPECT_EQ(p.header.worker, kWorkerIndex);
  EXPECT_EQ(p.header.value_bytes, 0u);
  EXPECT_EQ(p.src_qp, h.worker_qp().qp_num());
  EXPECT_NE(p.header.version, 0u);
  EXPECT_EQ(h.Marker(0, 1), 0u) << "the marker of an answered request is consumed";

  const Response g = h.Call(Get(0, 2, key));
  EXPECT_EQ(StatusOf(g), Status::kOk);
  EXPECT_EQ(g.value, "first value");
  EXPECT_EQ(g.header.version, p.header.version);
  EXPECT_EQ(g.header.attempt, 0u);
  // The response names its client in the SEND's immediate (the bytes carry no client id).
  const Response other = h.Call(Get(2, 1, key));
  EXPECT_EQ(other.header.client_id, 2u);
  EXPECT_EQ(other.value, "first value");

  const Response c = h.Call(Cas(0, 3, key, p.header.version, "second"));
  EXPECT_EQ(StatusOf(c), Status::kOk);
  EXPECT_GT(c.header.version, p.header.version);
  const Response stale_cas = h.Call(Cas(0, 4, key, p.header.version, "third"));
  EXPECT_EQ(StatusOf(stale_cas), Status::kCasFailed);

  const Response d = h.Call(Delete(0, 5, key));
  EXPECT_EQ(StatusOf(d), Status::kOk);
  EXPECT_EQ(StatusOf(h.Call(Get(0, 6, key))), Status::kNotFound);
  for (uint64_t seq = 1; seq <= 6; ++seq) EXPECT_EQ(h.Marker(0, seq), 0u) << seq;

  EXPECT_TRUE(h.Barrier().empty()) << "a request was answered more than once";
  EXPECT_EQ(h.counters().requests.Get(), 7 + h.probes());
  EXPECT_EQ(h.counters().duplicates.Get(), 0u);
  EXPECT_EQ(h.counters().replays.Get(), 0u);
  EXPECT_EQ(h.stats().inserts.Get(), 1u);
  EXPECT_EQ(h.stats().cas_ok.Get(), 1u);
  EXPECT_EQ(h.stats().cas_failed.Get(), 1u);
  EXPECT_EQ(h.stats().deletes.Get(), 1u);
}

TEST(WorkerRulesTest, ADuplicateLandingIsConsumedNeverExecutedNorAnswered) {
  Harness h(SlotsAndUd());
  const std::string key = KeyOf(kWorkerIndex, 1);
  const Request put = Put(0, 1, key, "once");
  const Response first = h.Call(put);
  ASSERT_EQ(StatusOf(first), Status::kOk);
  // The same bytes land again (same seq, same attempt): a WRITE placed twice.
  h.Land(0, 1, Encode(put));
  ASSERT_TRUE(h.AwaitConsumed(0, 1));
  EXPECT_TRUE(h.Barrier().empty()) << "a duplicate landing was answered";
  EXPECT_EQ(h.counters().duplicates.Get(), 1u);
  EXPECT_EQ(h.stats().inserts.Get(), 1u);
  EXPECT_EQ(h.stats().overwrites.Get(), 0u) << "the duplicate was executed";
  const Response get = h.Call(Get(0, 2, key));
  EXPECT_EQ(get.header.version, first.header.version);
  // An older attempt landing after a newer one is a duplicate too.
  Request put2 = Put(0, 3, key, "newer");
  put2.attempt = 1;
  ASSERT_EQ(StatusOf(h.Call(put2)), Status::kOk);
  put2.attempt = 0;
  h.Land(0, 3, Encode(put2));
  ASSERT_TRUE(h.AwaitConsumed(0, 3));
  EXPECT_TRUE(h.Barrier().empty()) << "an older attempt was answered after a newer one";
  EXPECT_EQ(h.counters().duplicates.Get(), 2u);
  EXPECT_EQ(h.stats().overwrites.Get(), 1u);
}

// An authentic request with a field the worker refuses (here: an expected version on a GET) is
// answered BAD_REQUEST once: its bytes landing again are a duplicate like any other.
TEST(WorkerRulesTest, ABadRequestLandingTwiceIsAnsweredOnce) {
  Harness h(SlotsAndUd());
  Request bad = Get(0, 1, KeyOf(kWorkerIndex, 11));
  bad.value = "a GET carries no value";
  ASSERT_EQ(StatusOf(h.Call(bad)), Status::kBadRequest);
  h.Land(0, 1, Encode(bad));
  ASSERT_TRUE(h.AwaitConsumed(0, 1));
  EXPECT_TRUE(h.Barrier().empty()) << "a duplicate landing of a bad request was answered again";
  EXPECT_EQ(h.counters().duplicates.Get(), 1u);
}

TEST(WorkerRulesTest, RetransmittedMutationsReplayTheirOutcomeAndGetsExecuteAgain) {
  Harness h(SlotsAndUd());
  const std::string key = KeyOf(kWorkerIndex, 2);
  auto retransmit = [&](Request r) {
    ++r.attempt;
    const Response again = h.Call(r);
    EXPECT_EQ(again.header.attempt, r.attempt);
    return again;
  };
  // PUT: the same version, never applied twice.
  const Request put = Put(0, 1, key, "v1");
  const Response p = h.Call(put);
  ASSERT_EQ(StatusOf(p), Status::kOk);
  const Response p2 = retransmit(put);
  EXPECT_EQ(StatusOf(p2), Status::kOk);
  EXPECT_EQ(p2.header.version, p.header.version);
  EXPECT_EQ(h.stats().inserts.Get(), 1u);
  EXPECT_EQ(h.stats().overwrites.Get(), 0u);
  EXPECT_EQ(h.counters().replays.Get(), 1u);
  // A second retransmission replays too.
  Request put_twice = put;
  put_twice.attempt = 1;
  EXPECT_EQ(retransmit(put_twice).header.version, p.header.version);
  EXPECT_EQ(h.counters().replays.Get(), 2u);

  // CAS: a replay says OK with the new version (a re-execution would say CAS_FAILED).
  const Request cas = Cas(0, 2, key, p.header.version, "v2");
  const Response c = h.Call(cas);
  ASSERT_EQ(StatusOf(c), Status::kOk);
  const Response c2 = retransmit(cas);
  EXPECT_EQ(StatusOf(c2), Status::kOk);
  EXPECT_EQ(c2.header.version, c.header.version);
  EXPECT_EQ(h.stats().cas_ok.Get(), 1u);
  EXPECT_EQ(h.stats().cas_failed.Get(), 0u);
  // A failed CAS replays its failure.
  const Request failing = Cas(0, 3, key, p.header.version, "v3");
  const Response f = h.Call(failing);
  ASSERT_EQ(StatusOf(f), Status::kCasFailed);
  EXPECT_EQ(StatusOf(retransmit(failing)), Status::kCasFailed);
  EXPECT_EQ(h.stats().cas_failed.Get(), 1u);

  // DELETE: OK again (a re-execution would say NOT_FOUND).
  const Request del = Delete(0, 4, key);
  ASSERT_EQ(StatusOf(h.Call(del)), Status::kOk);
  EXPECT_EQ(StatusOf(retransmit(del)), Status::kOk);
  EXPECT_EQ(h.stats().deletes.Get(), 1u);
  EXPECT_EQ(h.stats().delete_misses.Get(), 0u);
  EXPECT_EQ(h.counters().replays.Get(), 5u);

  // GET: executed again, never replayed.
  ASSERT_EQ(StatusOf(h.Call(Put(0, 5, key, "v4"))), Status::kOk);
  const Request get = Get(0, 6, key);
  const uint64_t hits = h.stats().get_hits.Get();
  EXPECT_EQ(h.Call(get).value, "v4");
  const Response g2 = retransmit(get);
  EXPECT_EQ(StatusOf(g2), Status::kOk);
  EXPECT_EQ(g2.value, "v4");
  EXPECT_EQ(h.stats().get_hits.Get(), hits + 2);
  EXPECT_EQ(h.counters().replays.Get(), 5u);
  EXPECT_TRUE(h.Barrier().empty());
}

// A client that followed a failover names its old id and session (ClientRoute::resume_*): the
// worker takes over the outcomes recorded under exactly that session, and a retransmission
// (attempt >= 1) replays them instead of applying the mutation again; a resumption naming
// another session takes nothing over; the taken-over outcomes are recorded under the new id and
// session, so a second failover finds them.
TEST(WorkerRulesTest, AResumedSessionReplaysOnlyTheOutcomesOfItsOldSession) {
  Harness h(SlotsAndUd(), nullptr, /*outcome_table=*/true);
  const std::string key = KeyOf(kWorkerIndex, 5);
  const Response put = h.Call(Put(0, 1, key, "v1"));
  ASSERT_EQ(StatusOf(put), Status::kOk);
  const Response failed = h.Call(Cas(0, 2, key, put.header.version + 7, "never"));
  ASSERT_EQ(StatusOf(failed), Status::kCasFailed);
  constexpr uint64_t kFollowerSecret = 0x9999AAAABBBBCCCCULL;
  auto resumed = [&](uint32_t client, uint64_t secret, uint32_t generation, uint32_t from,
                     uint64_t from_session) {
    ClientRoute route = h.MakeRoute(secret, generation);
    route.resume_client = from;
    route.resume_session = from_session;
    h.Publish(client, route);
  };
  auto resend = [](Request r, uint64_t secret) {
    r.secret = secret;
    r.attempt = 1;
    return r;
  };
  // Client 1 resumes client 0's session: both outcomes replay.
  resumed(1, kFollowerSecret, kGeneration + 1, 0, kSecret);
  const Response again = h.Call(resend(Put(1, 1, key, "v1"), kFollowerSecret));
  EXPECT_EQ(StatusOf(again), Status::kOk);
  EXPECT_EQ(again.header.version, put.header.version);
  const Response cas_again =
      h.Call(resend(Cas(1, 2, key, put.header.version + 7, "never"), kFollowerSecret));
  EXPECT_EQ(StatusOf(cas_again), Status::kCasFailed);
  EXPECT_EQ(h.stats().inserts.Get(), 1u);
  EXPECT_EQ(h.stats().overwrites.Get(), 0u);
  EXPECT_EQ(h.stats().cas_failed.Get(), 1u);
  EXPECT_EQ(h.counters().replays.Get(), 2u);
  EXPECT_EQ(h.counters().resumed_outcomes.Get(), 2u);
  // A new request of the follower executes.
  Request next = Put(1, 3, key, "v3");
  next.secret = kFollowerSecret;
  const Response v3 = h.Call(next);
  ASSERT_EQ(StatusOf(v3), Status::kOk);
  EXPECT_GT(v3.header.version, put.header.version);
  // A resumption naming a session that is not the recorded one takes nothing over: its
  // "retransmission" executes (here: a new write of the key).
  constexpr uint64_t kStrangerSecret = 0x1234123412341234ULL;
  resumed(2, kStrangerSecret, kGeneration + 2, 0, kOtherSecret);
  const Response stranger = h.Call(resend(Put(2, 1, key, "v1"), kStrangerSecret));
  EXPECT_EQ(StatusOf(stranger), Status::kOk);
  EXPECT_GT(stranger.header.version, v3.header.version);
  EXPECT_EQ(h.counters().resumed_outcomes.Get(), 2u);
  // A second failover: client 3 resumes the follower (client 1), whose outcomes now include
  // the taken-over CAS failure and its own PUT of seq 3.
  constexpr uint64_t kSecondSecret = 0x7777000077770000ULL;
  resumed(3, kSecondSecret, kGeneration + 3, 1, kFollowerSecret);
  EXPECT_EQ(
      StatusOf(h.Call(resend(Cas(3, 2, key, put.header.version + 7, "never"), kSecondSecret))),
      Status::kCasFailed);
  const Response v3_again = h.Call(resend(Put(3, 3, key, "v3"), kSecondSecret));
  EXPECT_EQ(StatusOf(v3_again), Status::kOk);
  EXPECT_EQ(v3_again.header.version, v3.header.version);
  EXPECT_EQ(h.stats().cas_failed.Get(), 1u);
  EXPECT_TRUE(h.Barrier().empty());
}

// Isolation between sessions comes from per-session memory regions (a session's QPs can write
// only its own block of slots) and per-session secrets (bytes it could not write do not check
// out), so the sequence rules only protect a session from itself: a stale sequence number is
// dropped, and a far-ahead one simply executes in its own slot.
TEST(WorkerRulesTest, StaleSequenceIsDroppedAndFarAheadExecutes) {
  Harness h(SlotsAndUd());
  const std::string key = KeyOf(kWorkerIndex, 3);
  ASSERT_EQ(StatusOf(h.Call(Put(0, 10, key, "ten"))), Status::kOk);
  const uint64_t stale = 10 - kWindow;  // the same slot, an older request
  h.Submit(Put(0, stale, key, "stale"));
  ASSERT_TRUE(h.AwaitConsumed(0, stale));
  EXPECT_TRUE(h.Barrier().empty()) << "a stale sequence number was answered";
  EXPECT_EQ(h.counters().dropped.Get(), 1u);
  EXPECT_EQ(h.stats().overwrites.Get(), 0u);
  const uint64_t far = 1'000'000'000'000ULL;
  const Response r = h.Call(Put(0, far, key, "far"));
  EXPECT_EQ(StatusOf(r), Status::kOk);
  EXPECT_EQ(h.Call(Get(0, far + 1, key)).value, "far");
}

TEST(WorkerRulesTest, ANewSessionReusingAClientIdStartsFresh) {
  Harness h(SlotsAndUd());
  const std::string key = KeyOf(kWorkerIndex, 4);
  for (uint64_t seq = 97; seq <= 100; ++seq) {
    ASSERT_EQ(StatusOf(h.Call(Put(0, seq, key, "old"))), Status::kOk);
  }
  // Seq 1 of the old session is stale.
  h.Submit(Get(0, 1, key));
  ASSERT_TRUE(h.AwaitConsumed(0, 1));
  EXPECT_TRUE(h.Barrier().empty());
  EXPECT_EQ(h.counters().dropped.Get(), 1u);
  // A new session takes client id 0: new generation, new secret.
  h.Publish(0, h.MakeRoute(kOtherSecret, kGeneration + 1));
  Request fresh = Put(0, 1, key, "new");
  fresh.secret = kOtherSecret;
  EXPECT_EQ(StatusOf(h.Call(fresh)), Status::kOk);
  Request get = Get(0, 2, key);
  get.secret = kOtherSecret;
  EXPECT_EQ(h.Call(get).value, "new");
}

TEST(WorkerRulesTest, AnIncompleteRequestWaitsUntilTheRestLands) {
  Harness h(SlotsAndUd());
  const std::string key = KeyOf(kWorkerIndex, 5);
  const std::string value(64, 'v');
  for (int attempt = 0; attempt < kInTimeTries; ++attempt) {
    const uint64_t seq = 1 + static_cast<uint64_t>(attempt);
    const std::vector<uint8_t> bytes = Encode(Put(0, seq, key, value));
    // The header (marker included) and the key land; the value not yet.
    std::vector<uint8_t> torn = bytes;
    const size_t value_at = Pad8(static_cast<uint32_t>(key.size()));
    std::memset(torn.data() + value_at, 0, value.size());
    const uint64_t rejected = h.counters().rejected.Get();
    const uint64_t puts = h.stats().inserts.Get() + h.stats().overwrites.Get();
    const absl::Time landed = absl::Now();
    h.Land(0, seq, torn);
    const std::vector<Response> early = h.Barrier();
    const uint64_t marker_before_rest = h.Marker(0, seq);
    const uint64_t rejected_before_rest = h.counters().rejected.Get();
    const uint64_t puts_before_rest = h.stats().inserts.Get() + h.stats().overwrites.Get();
    h.LandPart(0, seq, bytes, value_at, value.size());  // the rest lands
    // Timed up to the rest's landing: the worker first saw the marker after `landed`, so its
    // grace period cannot have run out before the rest landed (a slow machine or a sanitizer
    // can take longer between the Barrier and this landing than the grace itself).
    const bool in_time = absl::Now() - landed < kInTime;
    if (in_time) {
      EXPECT_TRUE(early.empty()) << "an incomplete request was answered";
      EXPECT_EQ(marker_before_rest, seq) << "the marker of an incomplete request was consumed";
      EXPECT_EQ(rejected_before_rest, rejected);
      EXPECT_EQ(puts_before_rest, puts);
    }
    if (!in_time) {
      // Too slow to tell: the worker may have given up on it. Let it settle, try again.
      ASSERT_TRUE(h.AwaitConsumed(0, seq));
      h.Barrier();
      continue;
    }
    std::optional<Response> r = h.NextResponse();
    ASSERT_TRUE(r.has_value()) << "the completed request was never answered";
    EXPECT_EQ(r->header.seq, seq);
    EXPECT_EQ(StatusOf(*r), Status::kOk);
    EXPECT_EQ(h.Call(Get(0, seq + kWindow * 100, key)).value, value);
    return;
  }
  GTEST_SKIP() << "never completed a request within " << kInTime
               << " of its marker: too slow to test the grace period";
}

TEST(WorkerRulesTest, BytesThatNeverCheckOutAreRejectedAfterTheGracePeriod) {
  Harness h(SlotsAndUd());
  const std::string key = KeyOf(kWorkerIndex, 6);
  std::vector<uint8_t> torn = Encode(Put(0, 1, key, std::string(32, 'x')));
  torn[Pad8(static_cast<uint32_t>(key.size()))] ^= 0xFF;
  const absl::Time landed = absl::Now();
  h.Land(0, 1, torn);
  const absl::Time give_up = absl::Now() + kDeadline;
  while (h.counters().rejected.Get() == 0) {
    ASSERT_LT(absl::Now(), give_up) << "never rejected";
    std::this_thread::yield();
  }
  EXPECT_GE(absl::Now() - landed, kIncompleteGrace) << "rejected before its grace period";
  ASSERT_TRUE(h.AwaitConsumed(0, 1));
  EXPECT_TRUE(h.Barrier().empty()) << "bytes that never checked out were answered";
  EXPECT_EQ(h.counters().rejected.Get(), 1u);
  EXPECT_EQ(h.stats().inserts.Get(), 0u);
  // The slot works again.
  EXPECT_EQ(StatusOf(h.Call(Put(0, 1 + kWindow, key, "ok"))), Status::kOk);
}

TEST(WorkerRulesTest, AnotherSessionsSecretIsNeverExecuted) {
  Harness h(SlotsAndUd());
  const std::string key = KeyOf(kWorkerIndex, 7);
  Request forged = Put(0, 1, key, "forged");
  forged.secret = kOtherSecret;
  h.Submit(forged);
  const absl::Time give_up = absl::Now() + kDeadline;
  while (h.counters().rejected.Get() == 0) {
    ASSERT_LT(absl::Now(), give_up) << "never rejected";
    std::this_thread::yield();
  }
  ASSERT_TRUE(h.AwaitConsumed(0, 1));
  EXPECT_TRUE(h.Barrier().empty()) << "a request under another session's secret was answered";
  EXPECT_EQ(h.stats().inserts.Get(), 0u);
  EXPECT_EQ(h.counters().requests.Get(), h.probes());
  EXPECT_EQ(StatusOf(h.Call(Get(0, 2, key))), Status::kNotFound);
}

TEST(WorkerRulesTest, AKeyOfAnotherWorkersPartitionIsAnsweredWrongWorker) {
  Harness h(SlotsAndUd());
  const std::string key = KeyOf(kWorkerIndex + 1, 0);
  const Request put = Put(0, 1, key, "misrouted");
  const Response r = h.Call(put);
  EXPECT_EQ(StatusOf(r), Status::kWrongWorker);
  EXPECT_EQ(h.stats().inserts.Get(), 0u);
  EXPECT_EQ(h.counters().bad_requests.Get(), 1u);
  // Its retransmission is answered the same, and executes nothing.
  Request again = put;
  again.attempt = 1;
  EXPECT_EQ(StatusOf(h.Call(again)), Status::kWrongWorker);
  EXPECT_EQ(h.stats().inserts.Get(), 0u);
}

TEST(WorkerRulesTest, UdRequestsAreAcceptedOnlyFromTheSessionsQp) {
  Harness h(TestConfig(RequestVerb::kUdSend, ResponseVerb::kUdSend));
  const std::string key = KeyOf(kWorkerIndex, 8);
  ASSERT_EQ(StatusOf(h.Call(Put(0, 1, key, "mine"))), Status::kOk);
  // The same session's bytes (right secret, right client id) from another QP.
  std::unique_ptr<transport::QueuePair> intruder = h.MakeClientUdQp();
  h.SendUd(*intruder, Encode(Put(0, 2, key, "intruder")), 0);
  EXPECT_TRUE(h.Barrier().empty()) << "a UD request from a foreign QP was answered";
  EXPECT_EQ(h.counters().rejected.Get(), 1u);
  EXPECT_EQ(h.stats().overwrites.Get(), 0u);
  // A duplicate UD message (same seq, same attempt) is not executed twice.
  const Request put3 = Put(0, 3, key, "three");
  ASSERT_EQ(StatusOf(h.Call(put3)), Status::kOk);
  h.SendUd(h.client_qp(), Encode(put3), 0);
  EXPECT_TRUE(h.Barrier().empty());
  EXPECT_EQ(h.counters().duplicates.Get(), 1u);
  EXPECT_EQ(h.stats().overwrites.Get(), 1u);
}

// A UD request names its client only in the SEND's immediate (the bytes carry no client id):
// one without an immediate, or naming a client past max_clients, is rejected unread; one
// naming another client is judged under that client's secret, and fails its checksum.
TEST(WorkerRulesTest, AUdRequestIsTheClientItsImmediateNamesOrNothing) {
  Harness h(TestConfig(RequestVerb::kUdSend, ResponseVerb::kUdSend));
  const std::string key = KeyOf(kWorkerIndex, 11);
  ASSERT_EQ(StatusOf(h.Call(Put(0, 1, key, "mine"))), Status::kOk);
  h.SendUd(h.client_qp(), Encode(Put(0, 2, key, "no immediate")), std::nullopt);
  h.SendUd(h.client_qp(), Encode(Put(0, 2, key, "past max_clients")), h.config().max_clients);
  Request other_secret = Put(0, 2, key, "signed with another secret");
  other_secret.secret = kOtherSecret;
  h.SendUd(h.client_qp(), Encode(other_secret), 0);
  EXPECT_TRUE(h.Barrier().empty()) << "a UD request without a valid client was answered";
  EXPECT_EQ(h.counters().rejected.Get(), 3u);
  EXPECT_EQ(h.stats().overwrites.Get(), 0u);
  EXPECT_EQ(StatusOf(h.Call(Get(0, 2, key))), Status::kOk);
}

// A UD message larger than a worker receive buffer (slot_bytes) but within the MTU. On the shm
// fabric (as on verbs), the receive completes with a length error; the worker must keep
// answering. Depends on the transport's handling of an over-long UD receive.
TEST(WorkerRulesTest, AnOversizedUdRequestDoesNotBreakTheWorker) {
  Harness h(TestConfig(RequestVerb::kUdSend, ResponseVerb::kUdSend));
  const std::string key = KeyOf(kWorkerIndex, 9);
  ASSERT_EQ(StatusOf(h.Call(Put(0, 1, key, "before"))), Status::kOk);
  std::vector<uint8_t> big(h.config().slot_bytes + 256, 0);
  const std::vector<uint8_t> real = Encode(Put(0, 2, key, "big"));
  std::memcpy(big.data() + big.size() - real.size(), real.data(), real.size());
  h.SendUd(h.client_qp(), big, 0);
  const Request after = Get(0, 3, key);
  h.Submit(after);
  std::optional<Response> r = h.NextResponse(absl::Seconds(5));
  ASSERT_TRUE(r.has_value()) << "the worker stopped answering after an oversized UD request "
                                "(its QP state: "
                             << transport::ToString(h.worker_qp().state()) << ")";
  EXPECT_EQ(r->header.seq, after.seq);
  EXPECT_EQ(r->value, "before");
}

TEST(WorkerRulesTest, WriteResponsesCarryAChecksumUnderTheSessionSecret) {
  Harness h(TestConfig(RequestVerb::kUcWrite, ResponseVerb::kUcWrite));
  const std::string key = KeyOf(kWorkerIndex, 10);
  const Request put = Put(2, 1, key, "written back");
  h.Submit(put);
  std::optional<ParsedResponse> p = h.AwaitWriteResponse(2, 1, kSecret);
  ASSERT_TRUE(p.has_value()) << "no WRITE response, or its checksum does not verify";
  EXPECT_EQ(static_cast<Status>(p->header.status), Status::kOk);
  EXPECT_EQ(p->header.seq, 1u);
  EXPECT_NE(p->header.checksum, 0u);
  const uint32_t bytes = h.config().response_slot_bytes();
  ParsedResponse other;
  EXPECT_FALSE(ParseResponse(h.ResponseSlot(2, 1), bytes, kOtherSecret, &other));

  const Request get = Get(2, 2, key);
  h.Submit(get);
  std::optional<ParsedResponse> g = h.AwaitWriteResponse(2, 2, kSecret);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(g->value), g->header.value_bytes),
            "written back");
  EXPECT_EQ(g->header.version, p->header.version);
  // A flipped value bit no longer verifies.
  uint8_t* slot = h.ResponseSlot(2, 2);
  slot[bytes - ResponseBytes(g->header.value_bytes)] ^= 1;
  EXPECT_FALSE(ParseResponse(slot, bytes, kSecret, &other));
}

}  // namespace
}  // namespace herd::worker_test
