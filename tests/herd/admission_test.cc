// The worker's admission rules (herd/admission.h), case by case with no fabric.
#include "herd/admission.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace herd {
namespace {

struct SendCase {
  std::string name;
  uint64_t last_seq;
  uint32_t last_attempt;
  bool held;
  uint64_t seq;
  uint32_t attempt;
  SendKind want;
};

TEST(AdmissionTest, ClassifySendSeparatesOldDuplicateHeldRetransmittedAndNew) {
  const std::vector<SendCase> cases = {
      {"a fresh slot's first request", 0, 0, false, 3, 0, SendKind::kNew},
      {"the next request of the slot", 3, 0, false, 7, 0, SendKind::kNew},
      {"a newer request while an older answer is held", 3, 0, true, 7, 0, SendKind::kNew},
      {"a newer request arriving as a retransmission", 3, 0, false, 7, 2, SendKind::kNew},
      {"an older request's retransmission", 7, 0, false, 3, 5, SendKind::kOld},
      {"an older request, held flag irrelevant", 7, 1, true, 3, 0, SendKind::kOld},
      {"the same send landed twice", 7, 0, false, 7, 0, SendKind::kDuplicate},
      {"an earlier attempt arriving late", 7, 3, false, 7, 1, SendKind::kDuplicate},
      {"an earlier attempt arriving late while held", 7, 3, true, 7, 2, SendKind::kDuplicate},
      {"a retransmission of the newest request", 7, 0, false, 7, 1, SendKind::kRetransmission},
      {"a retransmission whose answer is held", 7, 0, true, 7, 1, SendKind::kHeldRetransmission},
      {"the largest attempt of the wire", 7, 65534, false, 7, 65535, SendKind::kRetransmission},
      {"sequence numbers past 32 bits", uint64_t{1} << 40, 0, false, (uint64_t{1} << 40) + 4, 0,
       SendKind::kNew},
  };
  for (const SendCase& c : cases) {
    EXPECT_EQ(ClassifySend(c.last_seq, c.last_attempt, c.held, c.seq, c.attempt), c.want) << c.name;
  }
}

struct AdmitCase {
  std::string name;
  Status parsed;
  bool owns_key, at_backup, mutation;
  SendKind kind;
  Admission want;
};

TEST(AdmissionTest, AdmissionOfAppliesTheRulesInOrderOfPrecedence) {
  const std::vector<AdmitCase> cases = {
      {"a GET of an owned key", Status::kOk, true, false, false, SendKind::kNew,
       Admission::kExecute},
      {"a PUT of an owned key at a primary", Status::kOk, true, false, true, SendKind::kNew,
       Admission::kExecute},
      {"a parse error is kept, whatever else holds", Status::kKeyTooLong, false, true, true,
       SendKind::kRetransmission, Admission::kKeepStatus},
      {"a key of another worker", Status::kOk, false, false, false, SendKind::kNew,
       Admission::kWrongWorker},
      {"another worker's key beats NOT_PRIMARY at a backup", Status::kOk, false, true, true,
       SendKind::kNew, Admission::kWrongWorker},
      {"a mutation at a backup", Status::kOk, true, true, true, SendKind::kNew,
       Admission::kNotPrimary},
      {"a retransmitted mutation at a backup is NOT_PRIMARY again", Status::kOk, true, true, true,
       SendKind::kRetransmission, Admission::kNotPrimary},
      {"a GET at a backup executes", Status::kOk, true, true, false, SendKind::kNew,
       Admission::kExecute},
      {"a retransmitted mutation replays, never re-applies", Status::kOk, true, false, true,
       SendKind::kRetransmission, Admission::kReplay},
      {"a retransmitted GET runs again", Status::kOk, true, false, false, SendKind::kRetransmission,
       Admission::kExecute},
  };
  for (const AdmitCase& c : cases) {
    EXPECT_EQ(AdmissionOf(c.parsed, c.owns_key, c.at_backup, c.mutation, c.kind), c.want) << c.name;
  }
}

}  // namespace
}  // namespace herd
