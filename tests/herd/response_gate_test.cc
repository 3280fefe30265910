// The worker's ResponseGate contract (herd/response_gate.h), one rule per test, on the worker
// harness: a fake gate holds the mutations of chosen keys until the test releases them. "No
// answer" is proved with the harness's Barrier() (probe round trips), never with a sleep.
#include "herd/response_gate.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/herd/worker_harness.h"

namespace herd::worker_test {
namespace {

// Holds every mutation of the keys it was given; releases them when the test says so. With
// `holds_reads`, also every GET that found its key, and misses too while set_hold_misses (a
// replicated primary's GETs of writes not yet safe; Barrier()'s probes are misses). The worker
// calls Hold/HoldRead/EndBatch/Release on its thread; the test thread calls the rest.
class FakeGate : public ResponseGate {
 public:
  explicit FakeGate(const std::vector<std::string>& held_keys, bool holds_reads = false)
      : holds_reads_(holds_reads) {
    for (const std::string& key : held_keys) held_hashes_.insert(mica::KeyHash(key));
  }

  bool HoldsReads() const override { return holds_reads_; }
  bool ReadsCaughtUp() const override { return caught_up_.load(); }
  bool ReadMustWait(bool found, uint64_t version, uint64_t keyhash) const override {
    read_offers_.fetch_add(1);
    (void)version, (void)keyhash;
    return reads_wait_.load() && (found || hold_misses_.load());
  }
  void HoldRead(const HeldId& id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    held_reads_.push_back(id);
  }

  bool Hold(const ExecutedMutation& m) override {
    offered_.fetch_add(1);
    if (pause_.load()) {  // the worker waits here, mid-batch, until Resume()
      paused_.store(true);
      while (pause_.load()) std::this_thread::yield();
    }
    if (!held_hashes_.contains(m.keyhash)) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    held_.push_back(m);
    return true;
  }
  void EndBatch() override { batches_.fetch_add(1); }
  uint32_t Release(absl::Span<HeldId> released) override {
    std::lock_guard<std::mutex> lock(mutex_);
    uint32_t n = 0;
    while (n < released.size() && !to_release_.empty()) {
      released[n++] = to_release_.front();
      to_release_.erase(to_release_.begin());
    }
    return n;
  }

  // Test thread.
  std::vector<ExecutedMutation> held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }
  // Waits until `n` mutations were held (something that must happen: a deadline, not a sleep).
  bool AwaitHeld(size_t n) {
    return AwaitCount([this] { return held().size(); }, n);
  }
  // Releases everything held so far (mutations, then reads; and forgets it).
  void ReleaseAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const ExecutedMutation& m : held_) to_release_.push_back(m.id);
    for (const HeldId& id : held_reads_) to_release_.push_back(id);
    held_.clear();
    held_reads_.clear();
  }
  std::vector<HeldId> held_reads() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_reads_;
  }
  bool AwaitHeldReads(size_t n) {
    return AwaitCount([this] { return held_reads().size(); }, n);
  }
  // The worker's next Hold() waits until Resume(): requests that land meanwhile are all there
  // when it scans next, so they form one batch.
  void PauseInNextHold() { pause_.store(true); }
  bool AwaitPaused() {
    return AwaitCount([this] { return paused_.load() ? size_t{1} : size_t{0}; }, 1);
  }
  void Resume() { pause_.store(false); }
  bool AwaitBatches(uint64_t n) {
    return AwaitCount([this] { return static_cast<size_t>(batches()); }, n);
  }
  void set_reads_wait(bool wait) { reads_wait_.store(wait); }
  void set_caught_up(bool caught_up) { caught_up_.store(caught_up); }
  void set_hold_misses(bool hold) { hold_misses_.store(hold); }
  uint64_t read_offers() const { return read_offers_.load(); }
  // Releases an arbitrary id (a gate's bug, or a stale one).
  void ReleaseId(const HeldId& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    to_release_.push_back(id);
  }
  uint64_t offered() const { return offered_.load(); }

 private:
  template <typename CountFn>
  static bool AwaitCount(CountFn count, size_t n) {
    const absl::Time give_up = absl::Now() + kDeadline;
    while (count() < n) {
      if (absl::Now() > give_up) return false;
      std::this_thread::yield();
    }
    return true;
  }

 public:
  uint64_t batches() const { return batches_.load(); }

 private:
  const bool holds_reads_;
  std::atomic<bool> reads_wait_{true};
  std::atomic<bool> caught_up_{false};
  std::atomic<bool> hold_misses_{false};
  std::atomic<bool> pause_{false};
  std::atomic<bool> paused_{false};
  mutable std::atomic<uint64_t> read_offers_{0};
  std::vector<HeldId> held_reads_;
  absl::flat_hash_set<uint64_t> held_hashes_;
  std::atomic<uint64_t> offered_{0};
  std::atomic<uint64_t> batches_{0};
  std::mutex mutex_;
  std::vector<ExecutedMutation> held_;
  std::vector<HeldId> to_release_;
};

Config UdRequests() { return TestConfig(RequestVerb::kUdSend, ResponseVerb::kUdSend); }

class ResponseGateTest : public ::testing::TestWithParam<bool> {  // true: UD requests
 protected:
  Config TheConfig() const { return GetParam() ? UdRequests() : SlotsAndUd(); }
};

TEST_P(ResponseGateTest, AHeldMutationIsAnsweredOnlyOnReleaseAndGetsAreNotHeld) {
  const std::string held_key = KeyOf(kWorkerIndex, 0);
  const std::string other_key = KeyOf(kWorkerIndex, 1);
  FakeGate gate({held_key});
  Harness h(TheConfig(), &gate);
  ASSERT_EQ(StatusOf(h.Call(Put(1, 1, other_key, "free"))), Status::kOk);  // not held

  h.Barrier();
  const uint64_t posted_before = h.worker().ud_progress(0).posted.load();
  h.Submit(Put(0, 1, held_key, "v1"));
  ASSERT_TRUE(gate.AwaitHeld(1));
  const ExecutedMutation m = gate.held()[0];
  EXPECT_EQ(m.id.client, 0u);
  EXPECT_EQ(m.id.seq, 1u);
  EXPECT_EQ(m.op, Op::kPut);
  EXPECT_EQ(m.status, Status::kOk);

  // GETs go on: of the held key (it reads the applied value) and of another key.
  const Response get_held = h.Call(Get(1, 2, held_key));
  EXPECT_EQ(StatusOf(get_held), Status::kOk);
  EXPECT_EQ(get_held.value, "v1");
  EXPECT_EQ(StatusOf(h.Call(Get(1, 3, other_key))), Status::kOk);
  EXPECT_TRUE(h.Barrier().empty()) << "a held response was answered";
  // The held response reserved no send-queue entry: only the two GETs' and the probes'.
  EXPECT_EQ(h.worker().ud_progress(0).posted.load() - posted_before, 2u + 2u);
  EXPECT_EQ(h.counters().held.Get(), 1u);

  gate.ReleaseAll();
  std::optional<Response> answer = h.NextResponse();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->header.client_id, 0u);
  EXPECT_EQ(answer->header.seq, 1u);
  EXPECT_EQ(StatusOf(*answer), Status::kOk);
  EXPECT_EQ(answer->header.version, m.version);
  EXPECT_TRUE(h.Barrier().empty()) << "answered twice";
  EXPECT_EQ(h.counters().released.Get(), 1u);
  EXPECT_GT(gate.batches(), 0u);
}

TEST_P(ResponseGateTest, ARetransmissionWhileHeldIsNeitherReappliedNorAnswered) {
  const std::string key = KeyOf(kWorkerIndex, 0);
  FakeGate gate({key});
  Harness h(TheConfig(), &gate);
  Request put = Put(0, 1, key, "once");
  h.Submit(put);
  ASSERT_TRUE(gate.AwaitHeld(1));
  const uint64_t version = gate.held()[0].version;
  put.attempt = 1;
  h.Submit(put);
  if (!GetParam()) {
    ASSERT_TRUE(h.AwaitConsumed(0, 1));
  }
  EXPECT_TRUE(h.Barrier().empty());
  EXPECT_EQ(h.counters().held_retransmissions.Get(), 1u);
  EXPECT_EQ(gate.offered(), 1u) << "the retransmission was executed again";

  gate.ReleaseAll();
  std::optional<Response> answer = h.NextResponse();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->header.seq, 1u);
  EXPECT_EQ(answer->header.attempt, 1u) << "the release answers the newest attempt";
  EXPECT_EQ(answer->header.version, version);
  EXPECT_TRUE(h.Barrier().empty());

  // Released: a later retransmission is a replay from the dedupe table, still not re-applied.
  put.attempt = 2;
  const Response replay = h.Call(put);
  EXPECT_EQ(StatusOf(replay), Status::kOk);
  EXPECT_EQ(replay.header.version, version);
  EXPECT_EQ(h.counters().replays.Get(), 1u);
  EXPECT_EQ(gate.offered(), 1u);
}

TEST_P(ResponseGateTest, AReleaseForASlotThatMovedOnAnswersNothing) {
  const std::string key = KeyOf(kWorkerIndex, 0);
  FakeGate gate({key});
  Harness h(TheConfig(), &gate);
  h.Submit(Put(0, 1, key, "old session"));
  ASSERT_TRUE(gate.AwaitHeld(1));
  // A new session takes client id 0 and uses slot 1 itself.
  h.Publish(0, h.MakeRoute(kSecret, kGeneration + 1));
  EXPECT_EQ(StatusOf(h.Call(Get(0, 1, KeyOf(kWorkerIndex, 1)))), Status::kNotFound);

  gate.ReleaseAll();
  // Forged ids as a buggy gate might name them: out of range, never held.
  gate.ReleaseId(HeldId{kMaxClients, 0, kGeneration, 1});
  gate.ReleaseId(HeldId{0, kWindow, kGeneration + 1, 1});
  gate.ReleaseId(HeldId{1, 2, kGeneration, 2});
  EXPECT_TRUE(h.Barrier().empty()) << "a stale or forged release was answered";
  EXPECT_EQ(h.counters().released.Get(), 0u);
}

// A gate caught up as a batch begins (nothing unreleased) is not asked about the batch's GETs
// ahead of its first mutation: they are answered at once, from their staging buffers, even by a
// gate that would hold every read it is asked about.
TEST_P(ResponseGateTest, ACaughtUpGateIsNotAskedAboutGetsAheadOfAMutation) {
  const std::string key = KeyOf(kWorkerIndex, 0);
  FakeGate gate({}, /*holds_reads=*/true);
  Harness h(TheConfig(), &gate);
  ASSERT_EQ(StatusOf(h.Call(Put(0, 1, key, "value"))), Status::kOk);
  gate.set_caught_up(true);
  const uint64_t offers = gate.read_offers();
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    const Response r = h.Call(Get(1, seq, key));
    EXPECT_EQ(StatusOf(r), Status::kOk);
    EXPECT_EQ(r.value, "value");
  }
  EXPECT_EQ(gate.read_offers(), offers) << "a caught-up gate was asked about a lone GET";
  EXPECT_EQ(h.counters().reads_held.Get(), 0u);
  // Not caught up: the same GET is asked about, and held.
  gate.set_caught_up(false);
  h.Submit(Get(1, 4, key));
  ASSERT_TRUE(gate.AwaitHeldReads(1));
  EXPECT_GT(gate.read_offers(), offers);
  gate.ReleaseAll();
  std::optional<Response> released = h.NextResponse();
  ASSERT_TRUE(released.has_value());
  EXPECT_EQ(released->value, "value");
}

// A GET behind a mutation in its own batch may read that mutation's write, which no backup holds
// yet: it is asked about though the gate was caught up as the batch began. The worker is paused
// inside the gate while six requests land, so they form one batch: GETs around two PUTs. UD
// requests keep their arrival order (exactly the GETs after the first PUT are asked); the slot
// scan starts wherever its cursor stopped, and in every rotation some GET follows a PUT.
TEST_P(ResponseGateTest, AGetBehindAMutationOfItsBatchIsAskedThoughTheGateCaughtUp) {
  const std::string held_key = KeyOf(kWorkerIndex, 0);
  const std::string read_key = KeyOf(kWorkerIndex, 1);
  FakeGate gate({held_key}, /*holds_reads=*/true);
  Harness h(TheConfig(), &gate);
  ASSERT_EQ(StatusOf(h.Call(Put(1, 1, read_key, "read me"))), Status::kOk);
  gate.set_caught_up(true);
  gate.PauseInNextHold();
  struct ResumeOnExit {  // a failed assertion must not leave the worker paused at teardown
    FakeGate& gate;
    ~ResumeOnExit() { gate.Resume(); }
  } resume_on_exit{gate};
  h.Submit(Put(0, 1, held_key, "pauses the worker"));
  ASSERT_TRUE(gate.AwaitPaused());
  const uint64_t batches = gate.batches();  // the paused batch has not ended
  // Clients 1..6 in arrival order: GET PUT GET GET PUT GET.
  const std::vector<bool> is_put = {false, true, false, false, true, false};
  for (uint32_t i = 0; i < is_put.size(); ++i) {
    const uint32_t client = 1 + i;
    const uint64_t seq = client == 1 ? 2 : 1;
    h.Submit(is_put[i] ? Put(client, seq, KeyOf(kWorkerIndex, 10 + i), "other key")
                       : Get(client, seq, read_key));
  }
  gate.Resume();
  const size_t asked = GetParam() ? 3 : 1;  // UD: the GETs of clients 3, 4 and 6
  // Every read the batch holds is held by its end.
  ASSERT_TRUE(gate.AwaitBatches(batches + 2));
  ASSERT_GE(gate.held_reads().size(), asked) << "no GET behind a mutation was asked about";
  gate.ReleaseAll();
  int get_answers = 0;
  for (size_t i = 0; i < 1 + is_put.size(); ++i) {
    std::optional<Response> r = h.NextResponse();
    ASSERT_TRUE(r.has_value()) << "answer " << i << " missing";
    EXPECT_EQ(StatusOf(*r), Status::kOk);
    if (r->header.client_id >= 1 && !is_put[r->header.client_id - 1]) {
      ++get_answers;
      EXPECT_EQ(r->value, "read me");
    }
  }
  EXPECT_EQ(get_answers, 4);
  ASSERT_EQ(gate.batches(), batches + 2) << "the six requests did not form one batch";
  if (GetParam()) {
    EXPECT_EQ(h.counters().reads_held.Get(), 3u) << "the GET ahead of both PUTs was held";
  } else {
    EXPECT_GE(h.counters().reads_held.Get(), 1u);
  }
}

TEST_P(ResponseGateTest, AHeldGetIsAnsweredOnReleaseWithWhatItReadThenAndOnlyOnce) {
  const std::string key = KeyOf(kWorkerIndex, 0);
  FakeGate gate({key}, /*holds_reads=*/true);
  Harness h(TheConfig(), &gate);
  h.Submit(Put(0, 1, key, "first"));
  ASSERT_TRUE(gate.AwaitHeld(1));
  const uint64_t first_version = gate.held()[0].version;
  h.Submit(Get(1, 1, key));
  ASSERT_TRUE(gate.AwaitHeldReads(1));
  // A retransmission while held is consumed; the release answers this newest attempt.
  Request get = Get(1, 1, key);
  get.attempt = 1;
  h.Submit(get);
  if (!GetParam()) {
    ASSERT_TRUE(h.AwaitConsumed(1, 1));
  }
  // The key changes after the GET read it: the held answer keeps what it read.
  h.Submit(Put(2, 1, key, "second"));
  ASSERT_TRUE(gate.AwaitHeld(2));
  EXPECT_TRUE(h.Barrier().empty()) << "a held response was answered";
  EXPECT_EQ(h.counters().reads_held.Get(), 1u);
  EXPECT_EQ(gate.held_reads().size(), 1u) << "the retransmission was executed again";

  gate.ReleaseAll();
  std::vector<Response> answers;
  for (int i = 0; i < 3; ++i) {
    std::optional<Response> r = h.NextResponse();
    ASSERT_TRUE(r.has_value()) << "answer " << i << " missing";
    answers.push_back(*r);
  }
  EXPECT_TRUE(h.Barrier().empty()) << "answered twice";
  bool got_read = false;
  for (const Response& r : answers) {
    if (r.header.client_id != 1) continue;
    got_read = true;
    EXPECT_EQ(StatusOf(r), Status::kOk);
    EXPECT_EQ(r.value, "first");
    EXPECT_EQ(r.header.version, first_version);
    EXPECT_EQ(r.header.seq, 1u);
    EXPECT_EQ(r.header.attempt, 1u);
  }
  EXPECT_TRUE(got_read);
  // Released: a later retransmission of the GET reads again (and sees the newer value).
  get.attempt = 2;
  gate.set_reads_wait(false);
  const Response again = h.Call(get);
  EXPECT_EQ(StatusOf(again), Status::kOk);
  EXPECT_EQ(again.value, "second");
}

TEST_P(ResponseGateTest, AHeldMissIsAnsweredNotFoundOnRelease) {
  const std::string key = KeyOf(kWorkerIndex, 0);
  FakeGate gate({}, /*holds_reads=*/true);
  Harness h(TheConfig(), &gate);
  gate.set_hold_misses(true);
  h.Submit(Get(0, 1, key));
  ASSERT_TRUE(gate.AwaitHeldReads(1));
  gate.set_hold_misses(false);  // the probes' misses go
  EXPECT_TRUE(h.Barrier().empty());
  gate.ReleaseAll();
  std::optional<Response> r = h.NextResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(StatusOf(*r), Status::kNotFound);
  EXPECT_EQ(r->value, "");
}

TEST_P(ResponseGateTest, GetsThatNeedNotWaitAreAnsweredInTheirBatch) {
  const std::string key = KeyOf(kWorkerIndex, 0);
  FakeGate gate({}, /*holds_reads=*/true);
  gate.set_reads_wait(false);
  Harness h(TheConfig(), &gate);
  ASSERT_EQ(StatusOf(h.Call(Put(0, 1, key, "v"))), Status::kOk);
  const Response got = h.Call(Get(0, 2, key));
  EXPECT_EQ(StatusOf(got), Status::kOk);
  EXPECT_EQ(got.value, "v");
  EXPECT_GE(gate.read_offers(), 1u);
  EXPECT_EQ(h.counters().reads_held.Get(), 0u);
}

TEST_P(ResponseGateTest, ForgedReadReleasesAnswerNothingAndFreeNothing) {
  const std::string key = KeyOf(kWorkerIndex, 0);
  FakeGate gate({}, /*holds_reads=*/true);
  Harness h(TheConfig(), &gate);
  ASSERT_EQ(StatusOf(h.Call(Put(0, 1, key, "v"))), Status::kOk);
  h.Submit(Get(0, 2, key));
  ASSERT_TRUE(gate.AwaitHeldReads(1));
  const HeldId real = gate.held_reads()[0];
  HeldId forged = real;
  forged.read = real.read + 1;  // a buffer never held
  gate.ReleaseId(forged);
  HeldId out_of_range = real;
  out_of_range.read = UINT32_MAX - 1;
  gate.ReleaseId(out_of_range);
  EXPECT_TRUE(h.Barrier().empty()) << "a forged release was answered";
  gate.ReleaseAll();
  gate.ReleaseId(real);  // twice: the second finds the buffer free
  std::optional<Response> r = h.NextResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->header.seq, 2u);
  EXPECT_EQ(r->value, "v");
  EXPECT_TRUE(h.Barrier().empty()) << "answered twice";
}

INSTANTIATE_TEST_SUITE_P(RequestVerbs, ResponseGateTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "UdRequests" : "WriteRequests";
                         });

TEST(ResponseGateWriteResponsesTest, AReleasedWriteResponseCarriesTheSessionChecksum) {
  const std::string key = KeyOf(kWorkerIndex, 0);
  FakeGate gate({key});
  Harness h(TestConfig(RequestVerb::kUcWrite, ResponseVerb::kUcWrite), &gate);
  Request put = Put(0, 1, key, "written back");
  h.Submit(put);
  ASSERT_TRUE(gate.AwaitHeld(1));
  put.attempt = 1;
  h.Submit(put);
  ASSERT_TRUE(h.AwaitConsumed(0, 1));
  gate.ReleaseAll();
  std::optional<ParsedResponse> r = h.AwaitWriteResponse(0, 1, kSecret);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(static_cast<Status>(r->header.status), Status::kOk);
  EXPECT_EQ(r->header.attempt, 1u);
}

}  // namespace
}  // namespace herd::worker_test

namespace herd::worker_test {
namespace {

TEST(ResponseGateHeldReadsTest, WithEveryHeldReadBufferTakenAGetGoesUnansweredUntilOneIsFree) {
  Config config = SlotsAndUd();
  config.postlist = 1;  // Worker::kHeldReadBatches buffers
  FakeGate gate({}, /*holds_reads=*/true);
  Harness h(config, &gate);
  constexpr uint32_t kBuffers = 8;  // kHeldReadBatches x postlist
  const std::string key = KeyOf(kWorkerIndex, 0);
  // Written first, so that the GETs find it (a miss is not held: Barrier()'s probes are).
  constexpr uint32_t kWriter = kMaxClients - 2;
  constexpr uint32_t kReaders = kMaxClients - 2;  // ids 0..kReaders-1
  ASSERT_EQ(StatusOf(h.Call(Put(kWriter, 1, key, "v"))), Status::kOk);
  for (uint32_t i = 0; i < kBuffers; ++i) {
    h.Submit(Get(i % kReaders, 1 + i / kReaders, key));
  }
  ASSERT_TRUE(gate.AwaitHeldReads(kBuffers));
  // One more: no buffer, no answer, and no hold either.
  const uint32_t extra_client = kBuffers % kReaders;
  const uint64_t extra_seq = 1 + kBuffers / kReaders;
  h.Submit(Get(extra_client, extra_seq, key));
  ASSERT_TRUE(h.AwaitConsumed(extra_client, extra_seq));
  EXPECT_TRUE(h.Barrier().empty());
  EXPECT_EQ(h.counters().reads_unanswered.Get(), 1u);
  EXPECT_EQ(gate.held_reads().size(), kBuffers);
  gate.ReleaseAll();
  for (uint32_t i = 0; i < kBuffers; ++i) {
    ASSERT_TRUE(h.NextResponse().has_value()) << i;
  }
  // Its retransmission reads again, into a freed buffer, and is answered once released.
  Request again = Get(extra_client, extra_seq, key);
  again.attempt = 1;
  h.Submit(again);
  ASSERT_TRUE(gate.AwaitHeldReads(1));
  gate.ReleaseAll();
  std::optional<Response> r = h.NextResponse();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->header.client_id, extra_client);
  EXPECT_EQ(r->header.attempt, 1u);
  EXPECT_EQ(StatusOf(*r), Status::kOk);
  EXPECT_EQ(r->value, "v");
}

}  // namespace
}  // namespace herd::worker_test
