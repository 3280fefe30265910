// The history checker on hand-built histories: legal ones pass, and each rule, broken on
// purpose, is reported under its own name.
#include <iostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/herd/history.h"

namespace herd::testing::history {
namespace {

constexpr uint32_t kKey = 7;
constexpr uint32_t kValueBytes = 100;

// Builds events; times are in microseconds.
class Builder {
 public:
  Event& Put(uint32_t writer, int64_t from_us, int64_t to_us, Status status, uint64_t version) {
    return Write(Op::kPut, writer, from_us, to_us, status, version);
  }
  Event& Delete(uint32_t writer, int64_t from_us, int64_t to_us, Status status, uint64_t version) {
    return Write(Op::kDelete, writer, from_us, to_us, status, version);
  }
  Event& Cas(uint32_t writer, int64_t from_us, int64_t to_us, uint64_t expected, Status status,
             uint64_t version) {
    Event& e = Write(Op::kCas, writer, from_us, to_us, status, version);
    e.expected_version = expected;
    return e;
  }
  // A GET that returned the value of `source` (a PUT/CAS built here) at `version`.
  Event& GetValue(const Event& source, int64_t from_us, int64_t to_us, uint64_t version) {
    Event& e = Get(from_us, to_us, Status::kOk, version);
    RecordRead(EncodeValue({source.key, source.writer, source.seq, source.value_bytes}), &e);
    return e;
  }
  Event& GetRaw(std::string_view value, int64_t from_us, int64_t to_us, uint64_t version) {
    Event& e = Get(from_us, to_us, Status::kOk, version);
    RecordRead(value, &e);
    return e;
  }
  Event& GetNotFound(int64_t from_us, int64_t to_us) {
    return Get(from_us, to_us, Status::kNotFound, 0);
  }
  CheckResult Check() const {
    CheckResult r = history::Check(events_);
    std::cout << r.Summary() << "\n";
    return r;
  }
  std::vector<Event>& events() { return events_; }
  Event& Get(int64_t from_us, int64_t to_us, Status status, uint64_t version) {
    return Add(Op::kGet, /*writer=*/99, from_us, to_us, status, version);
  }

 private:
  Event& Add(Op op, uint32_t writer, int64_t from_us, int64_t to_us, Status status,
             uint64_t version) {
    Event e;
    e.invoke_ns = from_us * 1000;
    e.complete_ns = status == Status::kTimedOut ? kNever : to_us * 1000;
    e.key = kKey;
    e.writer = writer;
    e.seq = next_seq_++;
    e.op = op;
    e.status = status;
    e.version = version;
    e.attempts = 1;
    events_.push_back(e);
    return events_.back();
  }
  Event& Write(Op op, uint32_t writer, int64_t from_us, int64_t to_us, Status status,
               uint64_t version) {
    Event& e = Add(op, writer, from_us, to_us, status, version);
    if (op != Op::kDelete) e.value_bytes = kValueBytes;
    return e;
  }
  std::vector<Event> events_;
  uint64_t next_seq_ = 1;
};

// Events are copied out of the builder's vector before it grows (references would dangle).
#define EXPECT_ONLY(result, rule)                                                           \
  do {                                                                                      \
    const CheckResult& r_ = (result);                                                       \
    EXPECT_GE(r_.Count(rule), 1u) << "expected " << RuleName(rule) << "\n" << r_.Summary(); \
    EXPECT_EQ(r_.Count(rule), r_.violations.size()) << "other rules too\n" << r_.Summary(); \
  } while (0)

TEST(Value, RoundTripsAndSaysWhatItIs) {
  for (uint32_t length : {kValueHeaderBytes, 25u, 31u, 32u, 33u, 200u, 440u}) {
    const ValueId id{3, 12, 99, length};
    const std::string v = EncodeValue(id);
    ASSERT_EQ(v.size(), length);
    absl::StatusOr<ValueId> back = DecodeValue(v);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->key, 3u);
    EXPECT_EQ(back->writer, 12u);
    EXPECT_EQ(back->seq, 99u);
    EXPECT_EQ(back->length, length);
  }
}

TEST(Value, TornMixedTruncatedAndGarbageValuesAreDetected) {
  const std::string a = EncodeValue({1, 2, 3, 200});
  const std::string b = EncodeValue({1, 2, 4, 200});  // the same writer's next value
  // Torn: the first half of one write, the second of the other (every split point).
  for (size_t cut = 1; cut < a.size(); ++cut) {
    const std::string torn = a.substr(0, cut) + b.substr(cut);
    if (torn == a || torn == b) continue;  // the cut is in bytes both share
    EXPECT_FALSE(DecodeValue(torn).ok()) << "cut at " << cut;
  }
  EXPECT_FALSE(DecodeValue(a.substr(0, 199)).ok());
  EXPECT_FALSE(DecodeValue(a + "x").ok());
  EXPECT_FALSE(DecodeValue(std::string(64, '\0')).ok());
  EXPECT_FALSE(DecodeValue("").ok());
  std::string flipped = a;
  flipped[150] ^= 1;
  EXPECT_FALSE(DecodeValue(flipped).ok());
}

TEST(Serialization, RoundTripsAndRefusesCorruption) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 5);
  h.GetRaw("garbage value", 20, 30, 5);
  h.Cas(2, 40, 50, 5, Status::kTimedOut, 0);
  const std::string bytes = Serialize(h.events());
  absl::StatusOr<std::vector<Event>> back = Parse(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(Describe((*back)[i]), Describe(h.events()[i]));
  EXPECT_FALSE((*back)[1].read_well_formed);
  EXPECT_EQ((*back)[1].read_error, h.events()[1].read_error);
  EXPECT_FALSE(Parse(bytes.substr(0, bytes.size() - 1)).ok());
  EXPECT_FALSE(Parse(bytes + "x").ok());
  EXPECT_FALSE(Parse("nope").ok());
}

TEST(Check, ALegalSequentialHistoryPasses) {
  Builder h;
  h.GetNotFound(0, 5);
  const Event a = h.Put(1, 10, 20, Status::kOk, 3);
  h.GetValue(a, 30, 40, 3);
  const Event c = h.Cas(2, 50, 60, 3, Status::kOk, 8);
  h.Cas(1, 70, 80, 3, Status::kCasFailed, 8);
  h.GetValue(c, 90, 100, 8);
  h.Delete(3, 110, 120, Status::kOk, 9);
  h.GetNotFound(130, 140);
  h.Delete(3, 150, 160, Status::kNotFound, 0);
  h.Cas(2, 170, 180, 8, Status::kNotFound, 0);
  const Event b = h.Put(1, 190, 200, Status::kOk, 12);
  h.GetValue(b, 210, 220, 12);
  const CheckResult r = h.Check();
  EXPECT_TRUE(r.ok()) << r.Summary();
  EXPECT_EQ(r.operations, 12u);
  EXPECT_EQ(r.values_read, 3u);
  EXPECT_EQ(r.writes, 4u);
}

TEST(Check, AReadConcurrentWithAWriteMaySeeEitherSide) {
  Builder h;
  const Event a = h.Put(1, 0, 10, Status::kOk, 1);
  const Event b = h.Put(2, 20, 100, Status::kOk, 2);
  h.GetValue(a, 30, 40, 1);  // b not yet in effect
  h.GetValue(b, 50, 60, 2);  // b in effect before it was acknowledged
  h.Delete(3, 55, 120, Status::kOk, 3);
  h.GetNotFound(110, 130);    // the DELETE may have taken effect
  h.GetValue(b, 70, 115, 2);  // ... or not yet
  const CheckResult r = h.Check();
  EXPECT_TRUE(r.ok()) << r.Summary();
}

TEST(Check, TimedOutWritesMayOrMayNotHaveTakenEffect) {
  Builder h;
  const Event a = h.Put(1, 0, 10, Status::kOk, 1);
  const Event lost = h.Put(2, 20, 0, Status::kTimedOut, 0);
  h.GetValue(lost, 500, 510, 4);  // it took effect, late
  h.GetValue(lost, 520, 530, 4);
  h.Delete(3, 600, 0, Status::kTimedOut, 0);
  h.GetNotFound(700, 710);  // explained by the timed-out DELETE
  (void)a;
  const CheckResult r = h.Check();
  EXPECT_TRUE(r.ok()) << r.Summary();
  EXPECT_EQ(r.unknown, 2u);
}

TEST(Check, ATornValueIsMalformed) {
  Builder h;
  const Event a = h.Put(1, 0, 10, Status::kOk, 1);
  std::string torn = EncodeValue({kKey, a.writer, a.seq, kValueBytes});
  torn[60] ^= 0x40;
  h.GetRaw(torn, 20, 30, 1);
  EXPECT_ONLY(h.Check(), Rule::kMalformedValue);
}

TEST(Check, AnotherKeysValueIsMalformed) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 1);
  h.GetRaw(EncodeValue({kKey + 1, 1, 1, kValueBytes}), 20, 30, 1);
  EXPECT_ONLY(h.Check(), Rule::kMalformedValue);
}

TEST(Check, AValueOfAnotherVersionIsAMismatch) {
  Builder h;
  const Event a = h.Put(1, 0, 10, Status::kOk, 1);
  h.Put(2, 20, 30, Status::kOk, 2);
  h.GetValue(a, 20, 40, 2);  // concurrent with both, but reports b's version with a's value
  EXPECT_ONLY(h.Check(), Rule::kValueVersionMismatch);
}

TEST(Check, ReadingAnOlderVersionAfterANewerOneIsAcknowledgedIsStale) {
  Builder h;
  const Event a = h.Put(1, 0, 10, Status::kOk, 1);
  h.Put(2, 20, 30, Status::kOk, 2);
  h.GetValue(a, 40, 50, 1);
  EXPECT_ONLY(h.Check(), Rule::kStaleRead);
}

TEST(Check, ReadingAnOlderVersionAfterAnotherReadSawANewerOneIsStale) {
  Builder h;
  const Event a = h.Put(1, 0, 10, Status::kOk, 1);
  const Event b = h.Put(2, 20, 100, Status::kOk, 2);
  h.GetValue(b, 30, 40, 2);
  h.GetValue(a, 50, 60, 1);  // b still unacknowledged, but a read already saw it
  EXPECT_ONLY(h.Check(), Rule::kStaleRead);
}

TEST(Check, SeeingAWriteBeforeItWasInvokedIsAReadFromTheFuture) {
  Builder h;
  h.GetRaw(EncodeValue({kKey, 1, 1, kValueBytes}), 0, 10, 1);
  h.Put(1, 20, 30, Status::kOk, 1);  // seq 2 in the builder: rebuild below
  h.events()[1].seq = 1;
  // The PUT is also out of order: a read had seen its version before it was invoked.
  const CheckResult r = h.Check();
  EXPECT_EQ(r.Count(Rule::kFutureRead), 1u) << r.Summary();
  EXPECT_EQ(r.Count(Rule::kFutureRead) + r.Count(Rule::kWriteOrder), r.violations.size());
}

TEST(Check, AWriteOlderInVersionThanOneCompletedBeforeItIsOutOfOrder) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 5);
  h.Put(2, 20, 30, Status::kOk, 3);
  EXPECT_ONLY(h.Check(), Rule::kWriteOrder);
}

TEST(Check, NotFoundAfterAnAcknowledgedPutIsALostWrite) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 1);
  h.GetNotFound(20, 30);
  h.Delete(2, 40, 50, Status::kNotFound, 0);  // also claims absence
  const CheckResult r = h.Check();
  EXPECT_ONLY(r, Rule::kLostWrite);
  EXPECT_EQ(r.Count(Rule::kLostWrite), 2u);
}

TEST(Check, NotFoundAfterAPutThatFollowedTheDeleteIsALostWrite) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 1);
  h.Delete(2, 20, 30, Status::kOk, 2);
  h.Put(1, 40, 50, Status::kOk, 3);
  h.GetNotFound(60, 70);
  EXPECT_ONLY(h.Check(), Rule::kLostWrite);
}

TEST(Check, TwoWritesWithOneVersionAreDuplicates) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 4);
  h.Put(2, 0, 10, Status::kOk, 4);
  EXPECT_ONLY(h.Check(), Rule::kDuplicateVersion);
}

TEST(Check, ACasThatSucceedsOverAnotherWriteBreaksItsPrecondition) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 1);
  h.Put(2, 20, 30, Status::kOk, 2);
  h.Cas(3, 40, 50, /*expected=*/1, Status::kOk, 3);
  EXPECT_ONLY(h.Check(), Rule::kPrecondition);
}

TEST(Check, ACasThatFailsOnItsExpectedVersionBreaksItsPrecondition) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 1);
  h.Cas(3, 40, 50, /*expected=*/1, Status::kCasFailed, 1);
  EXPECT_ONLY(h.Check(), Rule::kPrecondition);
}

TEST(Check, ACasOrDeleteThatSucceedsOnADeletedKeyBreaksItsPrecondition) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 1);
  h.Delete(2, 20, 30, Status::kOk, 2);
  h.Delete(2, 40, 50, Status::kOk, 3);
  h.Cas(3, 60, 70, /*expected=*/3, Status::kOk, 4);
  const CheckResult r = h.Check();
  EXPECT_ONLY(r, Rule::kPrecondition);
  EXPECT_EQ(r.Count(Rule::kPrecondition), 2u);
}

TEST(Check, ACasFailureNamingAVersionNoWriteProducedIsUnknown) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 1);
  h.Cas(3, 40, 50, /*expected=*/1, Status::kCasFailed, 7);
  EXPECT_ONLY(h.Check(), Rule::kUnknownVersion);
}

TEST(Check, AnAcknowledgedWriteSeenUnderAnotherVersionWasAppliedTwice) {
  Builder h;
  const Event a = h.Put(1, 0, 10, Status::kOk, 1);
  h.Put(2, 20, 30, Status::kOk, 2);
  h.GetValue(a, 40, 50, 3);  // a again, over b: a retransmission applied a second time
  EXPECT_ONLY(h.Check(), Rule::kDoubleApply);
}

TEST(Check, ATimedOutWriteSeenUnderTwoVersionsWasAppliedTwice) {
  Builder h;
  const Event a = h.Put(1, 0, 0, Status::kTimedOut, 0);
  h.GetValue(a, 40, 50, 3);
  h.GetValue(a, 60, 70, 5);
  EXPECT_ONLY(h.Check(), Rule::kDoubleApply);
}

TEST(Check, AFailedCasWhoseValueIsSeenWasApplied) {
  Builder h;
  h.Put(1, 0, 10, Status::kOk, 1);
  const Event c = h.Cas(2, 20, 30, /*expected=*/5, Status::kCasFailed, 1);
  h.GetValue(c, 40, 50, 1);
  const CheckResult r = h.Check();
  EXPECT_GE(r.Count(Rule::kDoubleApply), 1u) << r.Summary();
}

TEST(Check, AnErrorStatusForAWellFormedRequestIsUnexpected) {
  Builder h;
  h.Put(1, 0, 10, Status::kBadRequest, 0);
  h.Put(1, 20, 30, Status::kNotFound, 0);
  h.Get(40, 50, Status::kCasFailed, 0);
  const CheckResult r = h.Check();
  EXPECT_ONLY(r, Rule::kUnexpectedStatus);
  EXPECT_EQ(r.Count(Rule::kUnexpectedStatus), 3u);
}

}  // namespace
}  // namespace herd::testing::history
