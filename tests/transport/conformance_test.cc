// The transport conformance suite: every backend must pass it. It runs on the shm fabric
// everywhere, and on a verbs device wherever one exists (skipped, saying so, where none does).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>

#include "tests/transport/fabric_fixture.h"

namespace transport::testing {
namespace {

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    a_ = MakeNode(GetParam());
    b_ = MakeNode(GetParam());
    if (a_ == nullptr || b_ == nullptr) {
      GTEST_SKIP() << "no " << GetParam() << " device on this machine (set HERD_VERBS_DEVICE, "
                   << "or run scripts/rxe_vm.sh for Soft-RoCE)";
    }
  }
  // Only the shm fabric sees the receiving side of a silent UD/UC drop and counts it at the
  // sender; a NIC cannot know.
  bool CountsDrops() const { return IsShmBackend(GetParam()); }
  std::unique_ptr<Node> a_, b_;
};

SendWr Write(const Node& from, size_t offset, uint32_t length, const Node& to, size_t remote,
             Sge* sge) {
  *sge = from.sge(offset, length);
  SendWr wr;
  wr.wr_id = 7;
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.opcode = Opcode::kWrite;
  wr.flags = kSignaled;
  wr.remote_addr = to.addr(remote);
  wr.rkey = to.mr->rkey();
  return wr;
}

// A signalled SEND of [offset, offset + length) of `from`.
SendWr Send(const Node& from, size_t offset, uint32_t length, uint64_t wr_id, Sge* sge) {
  *sge = from.sge(offset, length);
  SendWr wr;
  wr.wr_id = wr_id;
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.flags = kSignaled;
  return wr;
}

TEST_P(Conformance, RcWriteLandsInRemoteMemory) {
  auto qa = MakeQp(*a_, QpType::kRc);
  auto qb = MakeQp(*b_, QpType::kRc);
  ConnectPair(*qa, *qb);
  for (int i = 0; i < 100; ++i) a_->bytes()[i] = static_cast<uint8_t>(i);
  Sge sge;
  SendWr wr = Write(*a_, 0, 100, *b_, 1000, &sge);
  ASSERT_TRUE(Post(*qa, wr).ok());
  auto done = PollN(*a_->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kSuccess);
  EXPECT_EQ(done[0].wr_id, 7u);
  EXPECT_EQ(done[0].opcode, CompletionOpcode::kWrite);
  EXPECT_EQ(std::memcmp(b_->bytes() + 1000, a_->bytes(), 100), 0);
}

TEST_P(Conformance, RcSendWithImmCarriesEverythingToTheReceiver) {
  auto qa = MakeQp(*a_, QpType::kRc);
  auto qb = MakeQp(*b_, QpType::kRc);
  ConnectPair(*qa, *qb);
  ASSERT_TRUE(PostRecv(*qb, *b_, 99, 0, 256).ok());
  std::memcpy(a_->bytes(), "hello", 5);
  Sge sge = a_->sge(0, 5);
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = Opcode::kSendWithImm;
  wr.imm_data = 0xabcd;
  ASSERT_TRUE(Post(*qa, wr).ok());
  auto got = PollN(*b_->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, CompletionStatus::kSuccess);
  EXPECT_EQ(got[0].wr_id, 99u);
  EXPECT_EQ(got[0].opcode, CompletionOpcode::kRecvWithImm);
  EXPECT_TRUE(got[0].has_imm);
  EXPECT_EQ(got[0].imm_data, 0xabcdu);
  EXPECT_EQ(got[0].byte_len, 5u);
  EXPECT_EQ(got[0].qp_num, qb->qp_num());
  EXPECT_EQ(std::memcmp(b_->bytes(), "hello", 5), 0);
  // Unsignalled: no send completion. A later signalled WR on the same QP completes after it
  // would have; it must be the first and only one.
  constexpr uint64_t kMarker = 4242;
  Sge marker_sge;
  SendWr marker = Write(*a_, 0, 8, *b_, 1024, &marker_sge);
  marker.wr_id = kMarker;
  ASSERT_TRUE(Post(*qa, marker).ok());
  const std::vector<Completion> sent = PollThrough(*a_->send_cq, kMarker);
  ASSERT_EQ(sent.size(), 1u) << "an unsignalled SEND completed";
  EXPECT_EQ(sent[0].wr_id, kMarker);
}

TEST_P(Conformance, RcSendsArriveInOrder) {
  auto qa = MakeQp(*a_, QpType::kRc);
  auto qb = MakeQp(*b_, QpType::kRc);
  ConnectPair(*qa, *qb);
  constexpr int kMessages = 32;
  for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(PostRecv(*qb, *b_, i, i * 8, 8).ok());
  SendWr wrs[kMessages];
  Sge sges[kMessages];
  for (int i = 0; i < kMessages; ++i) {
    a_->bytes()[i] = static_cast<uint8_t>(i);
    sges[i] = a_->sge(i, 1);
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].next = i + 1 < kMessages ? &wrs[i + 1] : nullptr;
  }
  SendWr* bad = nullptr;
  ASSERT_TRUE(qa->PostSend(&wrs[0], &bad).ok());
  auto got = PollN(*b_->recv_cq, kMessages);
  ASSERT_EQ(got.size(), static_cast<size_t>(kMessages));
  for (int i = 0; i < kMessages; ++i) {
    EXPECT_EQ(got[i].wr_id, static_cast<uint64_t>(i));
    EXPECT_EQ(b_->bytes()[i * 8], i);
  }
  // One chain, one doorbell.
  EXPECT_EQ(qa->counters().doorbells.Get(), 1u);
  EXPECT_EQ(qa->counters().wrs.Get(), static_cast<uint64_t>(kMessages));
}

TEST_P(Conformance, RcSendWithoutReceiveEndsInRnrErrorAndFlushes) {
  auto qa = MakeQp(*a_, QpType::kRc);
  auto qb = MakeQp(*b_, QpType::kRc);
  ConnectPair(*qa, *qb, /*rnr_retry=*/2);
  Sge sge = a_->sge(0, 8);
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ASSERT_TRUE(Post(*qa, wr).ok());
  auto done = PollN(*a_->send_cq, 1);  // errors complete even when unsignalled
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kRnrRetryExceeded);
  EXPECT_EQ(qa->state(), QpState::kError);
  ASSERT_TRUE(Post(*qa, wr).ok());
  done = PollN(*a_->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kFlushed);
}

TEST_P(Conformance, RcRemoteAccessViolationsFailAndBreakTheQp) {
  struct Case {
    const char* what;
    uint32_t rkey_delta;
    size_t remote_offset;
    uint32_t length;
  };
  for (const Case& c :
       {Case{"bad rkey", 0x55, 0, 8}, Case{"out of bounds", 0, kNodeMemoryBytes - 4, 8}}) {
    auto qa = MakeQp(*a_, QpType::kRc);
    auto qb = MakeQp(*b_, QpType::kRc);
    ConnectPair(*qa, *qb);
    Sge sge;
    SendWr wr = Write(*a_, 0, c.length, *b_, c.remote_offset, &sge);
    wr.rkey += c.rkey_delta;
    ASSERT_TRUE(Post(*qa, wr).ok());
    auto done = PollN(*a_->send_cq, 1);
    ASSERT_EQ(done.size(), 1u) << c.what;
    EXPECT_EQ(done[0].status, CompletionStatus::kRemoteAccessError) << c.what;
    EXPECT_EQ(qa->state(), QpState::kError) << c.what;
  }
}

TEST_P(Conformance, RcWriteWithoutRemoteWriteAccessFails) {
  auto read_only = MakeNode(GetParam(), kLocalWrite | kRemoteRead);
  auto qa = MakeQp(*a_, QpType::kRc);
  auto qb = MakeQp(*read_only, QpType::kRc);
  ConnectPair(*qa, *qb);
  Sge sge;
  SendWr wr = Write(*a_, 0, 8, *read_only, 0, &sge);
  ASSERT_TRUE(Post(*qa, wr).ok());
  auto done = PollN(*a_->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kRemoteAccessError);
}

TEST_P(Conformance, RcReadAndAtomics) {
  auto qa = MakeQp(*a_, QpType::kRc);
  auto qb = MakeQp(*b_, QpType::kRc);
  ConnectPair(*qa, *qb);
  std::memcpy(b_->bytes() + 64, "remote bytes", 12);
  Sge sge = a_->sge(0, 12);
  SendWr read;
  read.sg_list = &sge;
  read.num_sge = 1;
  read.opcode = Opcode::kRead;
  read.flags = kSignaled;
  read.remote_addr = b_->addr(64);
  read.rkey = b_->mr->rkey();
  ASSERT_TRUE(Post(*qa, read).ok());
  auto done = PollN(*a_->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kSuccess);
  EXPECT_EQ(std::memcmp(a_->bytes(), "remote bytes", 12), 0);

  uint64_t counter = 40;
  std::memcpy(b_->bytes() + 128, &counter, 8);
  Sge result = a_->sge(256, 8);
  SendWr add;
  add.sg_list = &result;
  add.num_sge = 1;
  add.opcode = Opcode::kFetchAdd;
  add.flags = kSignaled;
  add.remote_addr = b_->addr(128);
  add.rkey = b_->mr->rkey();
  add.compare_add = 2;
  ASSERT_TRUE(Post(*qa, add).ok());
  ASSERT_EQ(PollN(*a_->send_cq, 1).at(0).status, CompletionStatus::kSuccess);
  uint64_t value;
  std::memcpy(&value, a_->bytes() + 256, 8);
  EXPECT_EQ(value, 40u);  // the original
  std::memcpy(&value, b_->bytes() + 128, 8);
  EXPECT_EQ(value, 42u);

  SendWr cas = add;
  cas.opcode = Opcode::kCompareSwap;
  cas.compare_add = 41;  // wrong: no swap
  cas.swap = 100;
  ASSERT_TRUE(Post(*qa, cas).ok());
  ASSERT_EQ(PollN(*a_->send_cq, 1).at(0).status, CompletionStatus::kSuccess);
  std::memcpy(&value, b_->bytes() + 128, 8);
  EXPECT_EQ(value, 42u);
  cas.compare_add = 42;
  ASSERT_TRUE(Post(*qa, cas).ok());
  ASSERT_EQ(PollN(*a_->send_cq, 1).at(0).status, CompletionStatus::kSuccess);
  std::memcpy(&value, b_->bytes() + 128, 8);
  EXPECT_EQ(value, 100u);

  // A misaligned atomic: the shm fabric (like ConnectX) completes it with an error; rxe refuses
  // it at post time. Either way it never executes.
  add.remote_addr = b_->addr(129);
  const absl::Status posted = Post(*qa, add);
  if (posted.ok()) {
    EXPECT_EQ(PollN(*a_->send_cq, 1).at(0).status, CompletionStatus::kRemoteInvalidRequest);
  } else {
    EXPECT_EQ(posted.code(), absl::StatusCode::kInvalidArgument) << posted;
    EXPECT_FALSE(IsShmBackend(GetParam()));
  }
  std::memcpy(&value, b_->bytes() + 128, 8);
  EXPECT_EQ(value, 100u);
}

// Protection domains: an inbound WRITE arriving on a QP may touch only regions registered in
// that QP's PD, as a NIC enforces (a server gives each client session its own PD and slots).
// QP in PD A, region in PD B of the same device: RC fails with a remote access error, UC is
// dropped silently (counted on shm); through a QP in PD B the same region works.
TEST_P(Conformance, RemoteAccessIsConfinedToTheQpsProtectionDomain) {
  constexpr uint32_t kBytes = 16;
  constexpr uint8_t kUntouched = 0x5a;
  auto pd_b = b_->device->AllocatePd();
  ASSERT_TRUE(pd_b.ok()) << pd_b.status();
  auto memory_b = SharedMemory::Allocate(kNodeMemoryBytes);
  ASSERT_TRUE(memory_b.ok()) << memory_b.status();
  std::memset(memory_b->data(), kUntouched, kNodeMemoryBytes);
  auto mr_b = (*pd_b)->RegisterMemory(memory_b->data(), memory_b->size(), kAllAccess);
  ASSERT_TRUE(mr_b.ok()) << mr_b.status();
  std::memset(a_->bytes(), 'p', kBytes);
  Sge sge;
  auto into_pd_b = [&](SendWr wr) {
    wr.remote_addr = reinterpret_cast<uint64_t>(memory_b->data());
    wr.rkey = (*mr_b)->rkey();
    return wr;
  };

  // RC, QP in PD A: a remote access error.
  auto rc_a = MakeQp(*a_, QpType::kRc);
  auto rc_b = MakeQp(*b_, QpType::kRc);
  ConnectPair(*rc_a, *rc_b);
  SendWr wr = into_pd_b(Write(*a_, 0, kBytes, *b_, 0, &sge));
  ASSERT_TRUE(Post(*rc_a, wr).ok());
  std::vector<Completion> done = PollN(*a_->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kRemoteAccessError) << ToString(done[0].status);
  EXPECT_EQ(memory_b->data()[0], kUntouched);

  // UC, QP in PD A: dropped. A later WRITE of the same QP into PD A's region lands, so the first
  // one was processed (and refused) before it.
  auto uc_a = MakeQp(*a_, QpType::kUc);
  auto uc_b = MakeQp(*b_, QpType::kUc);
  ConnectPair(*uc_a, *uc_b);
  wr = into_pd_b(Write(*a_, 0, kBytes, *b_, 0, &sge));
  ASSERT_TRUE(Post(*uc_a, wr).ok());
  Sge marker_sge;
  SendWr marker = Write(*a_, 0, kBytes, *b_, 512, &marker_sge);
  ASSERT_TRUE(Post(*uc_a, marker).ok());
  ASSERT_EQ(PollN(*a_->send_cq, 2).size(), 2u);
  volatile uint8_t* landed = b_->bytes() + 512 + kBytes - 1;
  const absl::Time give_up = absl::Now() + kCompletionDeadline;
  while (*landed != 'p' && absl::Now() < give_up) {
  }
  ASSERT_EQ(*landed, 'p');
  EXPECT_EQ(memory_b->data()[0], kUntouched);
  if (CountsDrops()) {
    EXPECT_EQ(uc_a->counters().dropped.Get(), 1u);
    EXPECT_EQ(uc_b->counters().dropped.Get(), 1u);
  }

  // RC through a QP in PD B: the same region works.
  QpConfig config;
  config.type = QpType::kRc;
  config.send_cq = b_->send_cq.get();
  config.recv_cq = b_->recv_cq.get();
  auto rc_in_b = (*pd_b)->CreateQp(config);
  ASSERT_TRUE(rc_in_b.ok()) << rc_in_b.status();
  auto rc_a2 = MakeQp(*a_, QpType::kRc);
  ConnectPair(*rc_a2, **rc_in_b);
  wr = into_pd_b(Write(*a_, 0, kBytes, *b_, 0, &sge));
  ASSERT_TRUE(Post(*rc_a2, wr).ok());
  done = PollN(*a_->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kSuccess) << ToString(done[0].status);
  EXPECT_EQ(memory_b->data()[kBytes - 1], 'p');
}

TEST_P(Conformance, UcReadFailsAndBreaksTheQp) {
  auto qa = MakeQp(*a_, QpType::kUc);
  auto qb = MakeQp(*b_, QpType::kUc);
  ConnectPair(*qa, *qb);
  Sge sge = a_->sge(0, 8);
  SendWr read;
  read.sg_list = &sge;
  read.num_sge = 1;
  read.opcode = Opcode::kRead;
  read.remote_addr = b_->addr();
  read.rkey = b_->mr->rkey();
  ASSERT_TRUE(Post(*qa, read).ok());
  auto done = PollN(*a_->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kLocalQpOperationError);
  EXPECT_EQ(qa->state(), QpState::kError);
}

TEST_P(Conformance, UcWriteAndWriteWithImm) {
  auto qa = MakeQp(*a_, QpType::kUc);
  auto qb = MakeQp(*b_, QpType::kUc);
  ConnectPair(*qa, *qb);
  std::memcpy(a_->bytes(), "uc-write", 8);
  Sge sge;
  SendWr wr = Write(*a_, 0, 8, *b_, 512, &sge);
  wr.opcode = Opcode::kWriteWithImm;
  wr.imm_data = 5;
  // No receive posted: UC drops the whole message silently; the sender still succeeds.
  ASSERT_TRUE(Post(*qa, wr).ok());
  EXPECT_EQ(PollN(*a_->send_cq, 1).at(0).status, CompletionStatus::kSuccess);
  if (CountsDrops()) {
    EXPECT_EQ(qa->counters().dropped.Get(), 1u);
  }
  EXPECT_NE(std::memcmp(b_->bytes() + 512, "uc-write", 8), 0);
  // With a receive posted, the data lands and the receive carries the immediate.
  ASSERT_TRUE(PostRecv(*qb, *b_, 3, 0, 0).ok());
  ASSERT_TRUE(Post(*qa, wr).ok());
  auto got = PollN(*b_->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].opcode, CompletionOpcode::kRecvWithImm);
  EXPECT_EQ(got[0].imm_data, 5u);
  EXPECT_EQ(std::memcmp(b_->bytes() + 512, "uc-write", 8), 0);
  EXPECT_EQ(qa->state(), QpState::kRts);
}

// The UD payload limit is the MTU the device reports: the shm fabric's is settable (256 here),
// a verbs port's is its active MTU (1024 on rxe over a 1500-byte netdev).
TEST_P(Conformance, UdSendsCarryGrhAndSourceAndObeyTheMtu) {
  auto small_mtu = MakeNode(GetParam(), kAllAccess, /*mtu=*/256);
  ASSERT_NE(small_mtu, nullptr);
  const uint32_t oversize = small_mtu->device->port().active_mtu + 44;
  auto qa = MakeQp(*a_, QpType::kUd);
  auto qb = MakeQp(*b_, QpType::kUd);
  auto qc = MakeQp(*small_mtu, QpType::kUd);
  ConnectConfig ud;
  for (QueuePair* qp : {qa.get(), qb.get(), qc.get()}) ASSERT_TRUE(qp->Connect(ud).ok());
  ASSERT_TRUE(PostRecv(*qb, *b_, 1, 0, kGrhBytes + oversize).ok());
  ASSERT_TRUE(PostRecv(*qc, *small_mtu, 2, 0, kGrhBytes + oversize).ok());
  auto ah_b = *a_->pd->CreateAddressHandle(AddressInfo{0, b_->device->port().gid});
  auto ah_c = *a_->pd->CreateAddressHandle(AddressInfo{0, small_mtu->device->port().gid});
  std::memset(a_->bytes(), 'u', oversize);
  Sge sge = a_->sge(0, 200);
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = Opcode::kSend;
  wr.flags = kSignaled;
  wr.ah = ah_b.get();
  wr.remote_qpn = qb->qp_num();
  wr.remote_qkey = ud.qkey;
  ASSERT_TRUE(Post(*qa, wr).ok());  // one UD QP, two peers
  wr.ah = ah_c.get();
  wr.remote_qpn = qc->qp_num();
  sge = a_->sge(0, oversize);
  ASSERT_TRUE(Post(*qa, wr).ok());  // over the MTU: dropped
  auto got = PollN(*b_->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].byte_len, kGrhBytes + 200);
  EXPECT_EQ(got[0].src_qp, qa->qp_num());
  EXPECT_EQ(b_->bytes()[kGrhBytes], 'u');
  EXPECT_EQ(b_->bytes()[kGrhBytes + 199], 'u');
  // The oversize SEND took no receive: a later one that fits, from the same QP, is the first
  // (and only) thing the small-MTU receiver gets.
  constexpr uint32_t kFits = 24;
  sge = a_->sge(0, kFits);
  ASSERT_TRUE(Post(*qa, wr).ok());
  got = PollN(*small_mtu->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 2u);
  EXPECT_EQ(got[0].byte_len, kGrhBytes + kFits) << "the oversize SEND was delivered";
  if (CountsDrops()) {
    EXPECT_EQ(qa->counters().dropped.Get(), 1u);
  }
  auto sent = PollN(*a_->send_cq, 3);  // the three SENDs were signalled
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].status, CompletionStatus::kSuccess);
  // shm and rxe complete the oversize SEND as sent; some NICs report a local length error.
  EXPECT_TRUE(sent[1].status == CompletionStatus::kSuccess ||
              (!CountsDrops() && sent[1].status == CompletionStatus::kLocalLengthError))
      << ToString(sent[1].status);
  EXPECT_EQ(sent[2].status, CompletionStatus::kSuccess);
}

// A UD message within the MTU but larger than the posted receive buffer is the sender's
// problem: one hostile client must not break a server's QP. shm drops it before it takes the
// receive, counts it at the receiver, and the QP goes on delivering. A NIC may instead complete
// the receive in error (rxe does, and puts the QP in the error state); it accepts both and
// says which.
TEST_P(Conformance, AUdMessageLargerThanTheReceiveBufferIsDroppedAndTheQpStaysUsable) {
  constexpr uint32_t kBuffer = 64;  // payload bytes the receive holds (after the GRH area)
  constexpr uint32_t kOversize = 200;
  constexpr uint32_t kFits = 32;
  auto qa = MakeQp(*a_, QpType::kUd);
  auto qb = MakeQp(*b_, QpType::kUd);
  ConnectConfig ud;
  ASSERT_TRUE(qa->Connect(ud).ok());
  ASSERT_TRUE(qb->Connect(ud).ok());
  ASSERT_TRUE(PostRecv(*qb, *b_, 1, 0, kGrhBytes + kBuffer).ok());
  ASSERT_TRUE(PostRecv(*qb, *b_, 2, 1024, kGrhBytes + kBuffer).ok());
  auto ah = *a_->pd->CreateAddressHandle(AddressInfo{0, b_->device->port().gid});
  std::memset(a_->bytes(), 'o', kOversize);
  std::memset(a_->bytes() + 4096, 'f', kFits);
  Sge sge = a_->sge(0, kOversize);
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.flags = kSignaled;
  wr.ah = ah.get();
  wr.remote_qpn = qb->qp_num();
  wr.remote_qkey = ud.qkey;
  ASSERT_TRUE(Post(*qa, wr).ok());
  sge = a_->sge(4096, kFits);
  ASSERT_TRUE(Post(*qa, wr).ok());
  ASSERT_EQ(PollN(*a_->send_cq, 2).size(), 2u);
  std::vector<Completion> got = PollN(*b_->recv_cq, 1);
  ASSERT_GE(got.size(), 1u);
  if (!IsShmBackend(GetParam()) && got[0].status != CompletionStatus::kSuccess) {
    // A NIC's way: the oversize message consumed a receive, in error. rxe (kernel 6.1) reports
    // LOC_QP_OP_ERR and moves the UD QP to the error state, flushing the rest: so a receiver
    // cannot rely on the fabric here, and herd sizes its workers' UD receives to the path MTU,
    // so no message a sender can get through the network is ever too large for them.
    std::printf("oversize UD receive completed with %s; receiver QP %s\n", ToString(got[0].status),
                ToString(qb->state()));
    return;
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, CompletionStatus::kSuccess) << ToString(got[0].status);
  EXPECT_EQ(got[0].byte_len, kGrhBytes + kFits);
  const size_t at = got[0].wr_id == 1 ? 0 : 1024;
  EXPECT_EQ(b_->bytes()[at + kGrhBytes], 'f');
  EXPECT_NE(qb->state(), QpState::kError);
  if (CountsDrops()) {
    EXPECT_EQ(got[0].wr_id, 1u);  // the oversize message never took a receive
    EXPECT_EQ(qb->counters().dropped.Get(), 1u);
  }
}

// A UD receive names its sender: the source QP in the completion, the sender's device in the
// GRH area (QP numbers are unique per device only, so the two together are its identity).
TEST_P(Conformance, AUdReceiveNamesTheSendersDeviceAndQp) {
  auto qa = MakeQp(*a_, QpType::kUd);
  auto qb = MakeQp(*b_, QpType::kUd);
  ConnectConfig ud;
  ASSERT_TRUE(qa->Connect(ud).ok());
  ASSERT_TRUE(qb->Connect(ud).ok());
  ASSERT_TRUE(PostRecv(*qb, *b_, 7, 0, kGrhBytes + 64).ok());
  auto ah = *a_->pd->CreateAddressHandle(AddressInfo{0, b_->device->port().gid});
  Sge sge = a_->sge(0, 16);
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.ah = ah.get();
  wr.remote_qpn = qb->qp_num();
  wr.remote_qkey = ud.qkey;
  ASSERT_TRUE(Post(*qa, wr).ok());
  const std::vector<Completion> got = PollN(*b_->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].src_qp, qa->qp_num());
  const PortInfo receiver = b_->device->port();
  EXPECT_EQ(SourceGidOfGrh(b_->bytes(), receiver.grh_is_ipv4), a_->device->port().gid);
}

TEST_P(Conformance, UdWithoutReceiveOrWithWrongQkeyIsDropped) {
  auto qa = MakeQp(*a_, QpType::kUd);
  auto qb = MakeQp(*b_, QpType::kUd);
  ConnectConfig ud;
  ASSERT_TRUE(qa->Connect(ud).ok());
  ASSERT_TRUE(qb->Connect(ud).ok());
  auto ah = *a_->pd->CreateAddressHandle(AddressInfo{0, b_->device->port().gid});
  Sge sge = a_->sge(0, 8);
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.ah = ah.get();
  wr.remote_qpn = qb->qp_num();
  wr.remote_qkey = ud.qkey;
  wr.flags = kSignaled;
  ASSERT_TRUE(Post(*qa, wr).ok());  // no receive posted
  // Sent (and so dropped) before the receive below exists, on a NIC or an asynchronous fabric.
  ASSERT_EQ(PollN(*a_->send_cq, 1).size(), 1u);
  ASSERT_TRUE(PostRecv(*qb, *b_, 1, 0, 128).ok());
  wr.remote_qkey = ud.qkey + 1;
  ASSERT_TRUE(Post(*qa, wr).ok());  // wrong qkey
  // Neither took the receive: a later SEND with the right qkey (and its own length), from the
  // same QP, is the first thing it gets.
  constexpr uint32_t kLater = 12;
  wr.remote_qkey = ud.qkey;
  sge = a_->sge(0, kLater);
  ASSERT_TRUE(Post(*qa, wr).ok());
  const std::vector<Completion> got = PollN(*b_->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].byte_len, kGrhBytes + kLater) << "a dropped SEND was delivered";
  if (CountsDrops()) {
    EXPECT_EQ(qa->counters().dropped.Get(), 2u);
  }
}

// Fault injection (shm only): a UD QP loses about the configured fraction of its SENDs, counted
// as drops; the receiver sees exactly the rest; a reliable QP on the same device loses nothing.
TEST_P(Conformance, InjectedUdLossDropsTheConfiguredFraction) {
  if (!IsShmBackend(GetParam())) GTEST_SKIP() << "fault injection is a shm fabric feature";
  constexpr int kSends = 2000;
  constexpr double kLoss = 0.25;
  auto lossy =
      MakeNode(GetParam(), kAllAccess, 4096, "test", FaultOptions{.ud_loss = kLoss, .seed = 7});
  ASSERT_NE(lossy, nullptr);
  auto qa = MakeQp(*lossy, QpType::kUd, kSends);
  QpConfig receiver;
  receiver.type = QpType::kUd;
  receiver.send_cq = b_->send_cq.get();
  receiver.recv_cq = b_->recv_cq.get();
  receiver.max_recv_wr = kSends;
  auto qb = *b_->pd->CreateQp(receiver);
  ASSERT_TRUE(qa->Connect(ConnectConfig{}).ok());
  ASSERT_TRUE(qb->Connect(ConnectConfig{}).ok());
  for (int i = 0; i < kSends; ++i) ASSERT_TRUE(PostRecv(*qb, *b_, i, 0, kGrhBytes + 8).ok());
  auto ah = *lossy->pd->CreateAddressHandle(AddressInfo{0, b_->device->port().gid});
  Sge sge = lossy->sge(0, 8);
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.ah = ah.get();
  wr.remote_qpn = qb->qp_num();
  wr.remote_qkey = ConnectConfig{}.qkey;
  size_t received = 0;
  constexpr int kRound = 100;  // drain between rounds: the receive CQ holds 256
  constexpr uint64_t kLast = 1;
  for (int i = 0; i < kSends; i += kRound) {
    for (int j = 0; j < kRound; ++j) {
      // The round's last SEND is signalled: the shm fabric executes a QP's WRs in order and
      // completes a SEND after delivering (or dropping) it, so once it completed, every SEND of
      // the round has arrived or never will.
      wr.flags = j + 1 == kRound ? uint32_t{kSignaled} : 0u;
      wr.wr_id = j + 1 == kRound ? kLast : 0;
      ASSERT_TRUE(Post(*qa, wr).ok());
    }
    ASSERT_EQ(PollThrough(*lossy->send_cq, kLast).size(), 1u);
    Completion drained[16];
    for (size_t k; (k = b_->recv_cq->Poll(absl::MakeSpan(drained, 16))) > 0;) received += k;
  }
  const uint64_t dropped = qa->counters().dropped.Get();
  EXPECT_GT(dropped, kSends * kLoss * 0.7);
  EXPECT_LT(dropped, kSends * kLoss * 1.3);
  EXPECT_EQ(received, kSends - dropped);

  auto rc_a = MakeQp(*lossy, QpType::kRc);
  auto rc_b = MakeQp(*b_, QpType::kRc);
  ConnectPair(*rc_a, *rc_b);
  constexpr int kWrites = 50;  // unsignalled: stays within the send queue's 64
  for (int i = 0; i < kWrites; ++i) {
    SendWr write = Write(*lossy, 0, 8, *b_, 64, &sge);
    ASSERT_TRUE(Post(*rc_a, write).ok());
  }
  EXPECT_EQ(rc_a->counters().dropped.Get(), 0u);
}

// The asynchronous mode with an injected delay (shm only): a WR takes effect only after its
// delay, a non-inline WRITE sends the bytes its buffer holds when it EXECUTES (reusing the buffer
// before the completion corrupts the message, as on a NIC), an inline one those of the post.
TEST_P(Conformance, DelayedWrsReadNonInlineBuffersWhenTheyExecute) {
  if (!IsShmBackend(GetParam())) GTEST_SKIP() << "fault injection is a shm fabric feature";
  constexpr uint32_t kDelayUs = 50000;  // far longer than the test's few stores take
  auto slow = MakeNode(GetParam(), kAllAccess, 4096, "test", FaultOptions{.delay_us = kDelayUs});
  ASSERT_NE(slow, nullptr);
  auto qa = MakeQp(*slow, QpType::kRc);
  auto qb = MakeQp(*b_, QpType::kRc);
  ConnectPair(*qa, *qb);
  std::memset(slow->bytes(), 'a', 16);
  Sge sge_plain, sge_inline;
  SendWr plain = Write(*slow, 0, 8, *b_, 0, &sge_plain);
  plain.flags = 0;  // unsignalled: the inline WRITE's completion below covers both
  SendWr inlined = Write(*slow, 8, 8, *b_, 8, &sge_inline);
  inlined.flags = kSignaled | kInline;
  const absl::Time posted = absl::Now();
  ASSERT_TRUE(Post(*qa, plain).ok());
  ASSERT_TRUE(Post(*qa, inlined).ok());
  std::memset(slow->bytes(), 'b', 16);  // both buffers reused before any completion
  EXPECT_EQ(b_->bytes()[0], 0) << "a delayed WRITE took effect at post time";
  const std::vector<Completion> done = PollN(*slow->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kSuccess);
  EXPECT_GE(absl::Now() - posted, absl::Microseconds(kDelayUs));
  EXPECT_EQ(std::string(reinterpret_cast<char*>(b_->bytes()), 8), std::string(8, 'b'))
      << "a non-inline WRITE reads its buffer when it executes";
  EXPECT_EQ(std::string(reinterpret_cast<char*>(b_->bytes() + 8), 8), std::string(8, 'a'))
      << "an inline WRITE carries the bytes of its post";

  // Forcing the QP into ERR flushes what is still pending: it never executes.
  SendWr late = Write(*slow, 0, 8, *b_, 16, &sge_plain);
  ASSERT_TRUE(Post(*qa, late).ok());
  qa->SetError();
  const std::vector<Completion> flushed = PollN(*slow->send_cq, 1);
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_EQ(flushed[0].status, CompletionStatus::kFlushed);
  EXPECT_EQ(b_->bytes()[16], 0);
}

// Delay jitter (shm only): each post waits a random extra delay, drawn per post, yet a QP's WRs
// still execute in order; two QPs posted to at the same moment drift apart (one replica's link
// ahead of another's), which a fixed delay never does.
TEST_P(Conformance, JitteredWrsKeepEachQpsOrderAndLetQpsDrift) {
  if (!IsShmBackend(GetParam())) GTEST_SKIP() << "fault injection is a shm fabric feature";
  constexpr uint32_t kJitterUs = 5000;
  constexpr int kWrsPerQp = 24;  // signalled, within the send queue and the CQ
  auto jittery =
      MakeNode(GetParam(), kAllAccess, 4096, "test", FaultOptions{.delay_jitter_us = kJitterUs});
  ASSERT_NE(jittery, nullptr);
  std::unique_ptr<QueuePair> qps[2], peers[2];
  for (int q = 0; q < 2; ++q) {
    qps[q] = MakeQp(*jittery, QpType::kRc);
    peers[q] = MakeQp(*b_, QpType::kRc);
    ConnectPair(*qps[q], *peers[q]);
  }
  Sge sges[2][kWrsPerQp];
  for (int i = 0; i < kWrsPerQp; ++i) {
    for (int q = 0; q < 2; ++q) {  // alternately: with no jitter they would complete in step
      SendWr wr = Write(*jittery, 0, 8, *b_, 64 * q, &sges[q][i]);
      wr.wr_id = static_cast<uint64_t>(q) << 32 | static_cast<uint64_t>(i);
      ASSERT_TRUE(Post(*qps[q], wr).ok());
    }
  }
  const std::vector<Completion> done = PollN(*jittery->send_cq, 2 * kWrsPerQp);
  ASSERT_EQ(done.size(), 2u * kWrsPerQp);
  int completed[2] = {0, 0};
  int widest_gap = 0;
  for (const Completion& c : done) {
    EXPECT_EQ(c.status, CompletionStatus::kSuccess);
    const int q = static_cast<int>(c.wr_id >> 32);
    EXPECT_EQ(static_cast<int>(c.wr_id & 0xffffffff), completed[q]) << "QP " << q << " reordered";
    ++completed[q];
    widest_gap = std::max(widest_gap, std::abs(completed[0] - completed[1]));
  }
  EXPECT_GE(widest_gap, 2) << "two jittered QPs stayed in step";
}

// Device counters: the sum over every QP and CQ of the device, destroyed ones included, kept
// identically by both backends.
TEST_P(Conformance, DeviceCountersSumEveryQpAndCqIncludingDestroyedOnes) {
  const CounterSnapshot before = a_->device->counters();
  auto qb = MakeQp(*b_, QpType::kRc);
  auto qa = MakeQp(*a_, QpType::kRc);
  ConnectPair(*qa, *qb);
  Sge sges[3];
  SendWr chain[3];
  for (int i = 0; i < 3; ++i) {
    chain[i] = Write(*a_, 8 * i, 8, *b_, 8 * i, &sges[i]);
    chain[i].flags = i == 2 ? uint32_t{kSignaled} : 0u;
    chain[i].next = i < 2 ? &chain[i + 1] : nullptr;
  }
  SendWr* bad = nullptr;
  ASSERT_TRUE(qa->PostSend(chain, &bad).ok());
  ASSERT_EQ(PollN(*a_->send_cq, 1).size(), 1u);
  const CounterSnapshot live = a_->device->counters();
  EXPECT_EQ(live.doorbells - before.doorbells, 1u);
  EXPECT_EQ(live.wrs - before.wrs, 3u);
  EXPECT_EQ(live.signaled_wrs - before.signaled_wrs, 1u);
  EXPECT_EQ(live.bytes - before.bytes, 24u);
  EXPECT_EQ(live.completions - before.completions, 1u);
  EXPECT_GE(live.polls - before.polls, 1u);
  // The same totals once the QP is gone: its counters stay with the device.
  qa.reset();
  const CounterSnapshot after = a_->device->counters();
  EXPECT_EQ(after.doorbells, live.doorbells);
  EXPECT_EQ(after.wrs, live.wrs);
  EXPECT_EQ(after.bytes, live.bytes);
  EXPECT_EQ(after.completions, live.completions);
}

// A server retires a departed client's QP while its worker keeps polling the send CQ that QP
// shared: the poll may be handling that QP's completions at that very moment. Under ASan a
// poll touching the destroyed QP is a use-after-free; afterwards the CQ still accounts exactly.
TEST_P(Conformance, DestroyingAQpWhileAnotherThreadPollsItsSendCqIsSafe) {
  constexpr int kRounds = 100;
  constexpr int kWritesPerRound = 8;  // one chain, every WR signalled
  // Deep enough for every completion the rounds make: a poller the scheduler starves (a loaded
  // machine) must not overrun it. (With the node's 256-deep CQ it did: 68 completions lost, and
  // the check below failed.)
  constexpr uint32_t kCqDepth = kRounds * kWritesPerRound + 64;
  auto send_cq = a_->device->CreateCq(kCqDepth);
  ASSERT_TRUE(send_cq.ok()) << send_cq.status();
  CompletionQueue& cq = **send_cq;
  auto make_qp = [&](uint32_t max_send_wr) {
    QpConfig config;
    config.type = QpType::kUc;
    config.send_cq = &cq;
    config.recv_cq = a_->recv_cq.get();
    config.max_send_wr = max_send_wr;
    config.max_send_sge = 2;
    auto qp = a_->pd->CreateQp(config);
    EXPECT_TRUE(qp.ok()) << qp.status();
    return *std::move(qp);
  };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> polled{0}, failed{0};
  std::thread poller([&] {
    Completion buffer[16];
    while (!stop.load(std::memory_order_relaxed)) {
      const size_t n = cq.Poll(absl::MakeSpan(buffer, 16));
      for (size_t i = 0; i < n; ++i) {
        // A destroyed QP's leftovers are successes (or flushes where the provider flushes).
        if (buffer[i].status != CompletionStatus::kSuccess &&
            buffer[i].status != CompletionStatus::kFlushed) {
          failed.fetch_add(1, std::memory_order_relaxed);
        }
      }
      polled.fetch_add(n, std::memory_order_relaxed);
    }
  });
  for (int round = 0; round < kRounds; ++round) {
    auto qa = make_qp(64);
    auto qb = MakeQp(*b_, QpType::kUc);
    ConnectPair(*qa, *qb);
    Sge sges[kWritesPerRound];
    SendWr chain[kWritesPerRound];
    for (int i = 0; i < kWritesPerRound; ++i) {
      chain[i] = Write(*a_, 8 * i, 8, *b_, 8 * i, &sges[i]);
      chain[i].next = i + 1 < kWritesPerRound ? &chain[i + 1] : nullptr;
    }
    SendWr* bad = nullptr;
    ASSERT_TRUE(qa->PostSend(chain, &bad).ok());
    // Destroyed at once: its completions are polled before, during or after this.
  }
  stop = true;
  poller.join();
  EXPECT_EQ(failed.load(), 0u);
  EXPECT_LE(polled.load(), uint64_t{kRounds} * kWritesPerRound);
  // The CQ and its device still account exactly for a new QP: a full queue, reaped, is free.
  auto qa = make_qp(/*max_send_wr=*/4);
  auto qb = MakeQp(*b_, QpType::kUc);
  ConnectPair(*qa, *qb);
  Sge sge;
  SendWr wr = Write(*a_, 0, 8, *b_, 0, &sge);
  wr.wr_id = 1234;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Post(*qa, wr).ok()) << i;
  EXPECT_EQ(Post(*qa, wr).code(), absl::StatusCode::kResourceExhausted);
  size_t ours = 0;  // the destroyed QPs' leftovers may still come first
  const absl::Time give_up = absl::Now() + kCompletionDeadline;
  while (ours < 4 && absl::Now() < give_up) {
    for (const Completion& c : PollN(cq, 1, kQuietPeriod)) {
      if (c.wr_id == 1234 && c.status == CompletionStatus::kSuccess) ++ours;
    }
  }
  EXPECT_EQ(ours, 4u);
  EXPECT_TRUE(Post(*qa, wr).ok());
}

// An RC SEND waiting for its receiver (RNR) holds back only its own QP: the device's other QPs
// keep moving, and the SEND goes through once a receive is posted. On a NIC this is the
// hardware's RNR NAK and retry timer; the synchronous shm fabric, which executes WRs inside
// PostSend, hands an RNR'd WR to its progress thread (issue 36: it slept up to a second inside
// PostSend, so a client's Poll could block on one peer, and then failed the WR).
TEST_P(Conformance, AnRnrWaitHoldsBackOnlyItsOwnQp) {
  auto waiting = MakeQp(*a_, QpType::kRc);
  auto receiver = MakeQp(*b_, QpType::kRc);
  ConnectPair(*waiting, *receiver);  // rnr_retry 7: retry for as long as it takes
  auto other = MakeQp(*a_, QpType::kRc);
  auto other_peer = MakeQp(*b_, QpType::kRc);
  ConnectPair(*other, *other_peer);
  std::memcpy(a_->bytes() + 512, "late", 4);
  Sge send_sge;
  SendWr send = Send(*a_, 512, 4, /*wr_id=*/1, &send_sge);
  ASSERT_TRUE(Post(*waiting, send).ok());
  Sge write_sge;
  SendWr write = Write(*a_, 0, 8, *b_, 0, &write_sge);
  write.wr_id = 2;
  ASSERT_TRUE(Post(*other, write).ok());
  std::vector<Completion> first = PollN(*a_->send_cq, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].wr_id, 2u) << "the WRITE on the other QP waited behind the RNR";
  EXPECT_EQ(first[0].status, CompletionStatus::kSuccess);
  ASSERT_TRUE(PostRecv(*receiver, *b_, 77, 1024, 64).ok());
  std::vector<Completion> sent = PollN(*a_->send_cq, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].wr_id, 1u);
  EXPECT_EQ(sent[0].status, CompletionStatus::kSuccess);
  std::vector<Completion> received = PollN(*b_->recv_cq, 1);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].wr_id, 77u);
  EXPECT_EQ(std::memcmp(b_->bytes() + 1024, "late", 4), 0);
}

// ... and holds back every later WR of its own QP: an RC QP executes in order, so a WRITE
// posted behind an RNR'd SEND lands only after it (the synchronous shm fabric queues it behind
// the SEND instead of executing it inside PostSend).
TEST_P(Conformance, WrsBehindAnRnrWaitKeepTheirOrder) {
  auto waiting = MakeQp(*a_, QpType::kRc);
  auto receiver = MakeQp(*b_, QpType::kRc);
  ConnectPair(*waiting, *receiver);  // rnr_retry 7: retry for as long as it takes
  std::memcpy(a_->bytes() + 512, "first", 5);
  std::memcpy(a_->bytes(), "second..", 8);
  std::memset(b_->bytes(), 0, 8);
  Sge send_sge;
  SendWr send = Send(*a_, 512, 5, /*wr_id=*/1, &send_sge);
  ASSERT_TRUE(Post(*waiting, send).ok());
  Sge write_sge;
  SendWr write = Write(*a_, 0, 8, *b_, 0, &write_sge);
  write.wr_id = 2;
  ASSERT_TRUE(Post(*waiting, write).ok());
  EXPECT_NE(std::memcmp(b_->bytes(), "second..", 8), 0)
      << "the WRITE landed before the SEND it was posted behind";
  ASSERT_TRUE(PostRecv(*receiver, *b_, 77, 1024, 64).ok());
  std::vector<Completion> sent = PollN(*a_->send_cq, 2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].wr_id, 1u);
  EXPECT_EQ(sent[1].wr_id, 2u);
  for (const Completion& c : sent) EXPECT_EQ(c.status, CompletionStatus::kSuccess);
  EXPECT_EQ(std::memcmp(b_->bytes() + 1024, "first", 5), 0);
  EXPECT_EQ(std::memcmp(b_->bytes(), "second..", 8), 0);
  // Drained: the QP executes inline again (on the synchronous fabric, inside PostSend).
  std::memcpy(a_->bytes(), "third...", 8);
  write.wr_id = 3;
  ASSERT_TRUE(Post(*waiting, write).ok());
  std::vector<Completion> third = PollN(*a_->send_cq, 1);
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].wr_id, 3u);
  EXPECT_EQ(std::memcmp(b_->bytes(), "third...", 8), 0);
}

TEST_P(Conformance, ABadLossProbabilityIsRejected) {
  if (!IsShmBackend(GetParam())) GTEST_SKIP() << "fault injection is a shm fabric feature";
  DeviceOptions options;
  options.faults.ud_loss = 1.5;
  EXPECT_EQ(OpenDevice(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(Conformance, UdRejectsRdmaOpcodesAtPostTime) {
  auto qa = MakeQp(*a_, QpType::kUd);
  ASSERT_TRUE(qa->Connect(ConnectConfig{}).ok());
  Sge sge;
  SendWr wr = Write(*a_, 0, 8, *b_, 0, &sge);
  SendWr* bad = nullptr;
  EXPECT_EQ(qa->PostSend(&wr, &bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad, &wr);
}

// A chain refused partway (the send queue fills at its fifth WR) counts exactly what it posted:
// four WRs, their bytes, which of them were signalled and inline, and one doorbell; the rest
// is handed back through `bad`. Every backend keeps its counters identically (the shm fabric
// counted no doorbell for such a chain).
TEST_P(Conformance, APartlyRefusedChainCountsWhatItPostedAndOneDoorbell) {
  auto qa = MakeQp(*a_, QpType::kRc, /*max_send_wr=*/4);
  auto qb = MakeQp(*b_, QpType::kRc);
  ConnectPair(*qa, *qb);
  constexpr int kChain = 6;
  Sge sges[kChain];
  SendWr chain[kChain];
  for (int i = 0; i < kChain; ++i) {
    chain[i] = Write(*a_, 16 * i, 8 + i, *b_, 16 * i, &sges[i]);
    chain[i].flags = (i == 1 ? uint32_t{kSignaled} : 0u) | (i % 2 == 0 ? uint32_t{kInline} : 0u);
    chain[i].next = i + 1 < kChain ? &chain[i + 1] : nullptr;
  }
  SendWr* bad = nullptr;
  EXPECT_EQ(qa->PostSend(chain, &bad).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bad, &chain[4]);
  const QpCounters& c = qa->counters();
  EXPECT_EQ(c.wrs.Get(), 4u);
  EXPECT_EQ(c.bytes.Get(), uint64_t{8 + 9 + 10 + 11});
  EXPECT_EQ(c.signaled_wrs.Get(), 1u);
  EXPECT_EQ(c.inline_wrs.Get(), 2u);
  EXPECT_EQ(c.doorbells.Get(), 1u);
  // A chain refused at its first WR posts nothing: no doorbell.
  EXPECT_EQ(qa->PostSend(&chain[4], &bad).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bad, &chain[4]);
  EXPECT_EQ(c.wrs.Get(), 4u);
  EXPECT_EQ(c.doorbells.Get(), 1u);
}

TEST_P(Conformance, SendQueueDepthIsEnforcedUntilASignalledCompletionIsPolled) {
  auto qa = MakeQp(*a_, QpType::kRc, /*max_send_wr=*/4);
  auto qb = MakeQp(*b_, QpType::kRc);
  ConnectPair(*qa, *qb);
  Sge sge;
  SendWr wr = Write(*a_, 0, 8, *b_, 0, &sge);
  wr.flags = 0;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Post(*qa, wr).ok()) << i;
  EXPECT_EQ(Post(*qa, wr).code(), absl::StatusCode::kResourceExhausted);
  // Unsignalled: nothing to reap. A signalled WRITE of another QP on the same CQ, posted later,
  // is the only completion there.
  constexpr uint64_t kMarker = 4242;
  auto marker_qa = MakeQp(*a_, QpType::kRc);
  auto marker_qb = MakeQp(*b_, QpType::kRc);
  ConnectPair(*marker_qa, *marker_qb);
  Sge marker_sge;
  SendWr marker = Write(*a_, 64, 8, *b_, 64, &marker_sge);
  marker.wr_id = kMarker;
  ASSERT_TRUE(Post(*marker_qa, marker).ok());
  const std::vector<Completion> reaped = PollThrough(*a_->send_cq, kMarker);
  ASSERT_EQ(reaped.size(), 1u) << "an unsignalled WRITE completed";
  // Nothing can be signalled while the queue is full; a fresh QP shows the recovery path.
  auto qc = MakeQp(*a_, QpType::kRc, 4);
  auto qd = MakeQp(*b_, QpType::kRc);
  ConnectPair(*qc, *qd);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Post(*qc, wr).ok());
  wr.flags = kSignaled;
  ASSERT_TRUE(Post(*qc, wr).ok());
  EXPECT_EQ(Post(*qc, wr).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(PollN(*a_->send_cq, 1).size(), 1u);  // reaping the signalled WR frees all four
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Post(*qc, wr).ok()) << i;
  EXPECT_EQ(qc->counters().signaled_wrs.Get(), 5u);
}

TEST_P(Conformance, InlineSendsNeedNoRegisteredBuffer) {
  auto qa = MakeQp(*a_, QpType::kRc);
  auto qb = MakeQp(*b_, QpType::kRc);
  ConnectPair(*qa, *qb);
  char payload[16] = "inline payload";
  Sge sge{reinterpret_cast<uint64_t>(payload), sizeof(payload), 0};
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = Opcode::kWrite;
  wr.flags = kInline | kSignaled;
  wr.remote_addr = b_->addr(0);
  wr.rkey = b_->mr->rkey();
  ASSERT_TRUE(Post(*qa, wr).ok());
  ASSERT_EQ(PollN(*a_->send_cq, 1).at(0).status, CompletionStatus::kSuccess);
  EXPECT_STREQ(reinterpret_cast<const char*>(b_->bytes()), "inline payload");
  EXPECT_EQ(qa->counters().inline_wrs.Get(), 1u);
  // Too long for max_inline_data: refused at post time.
  char big[200] = {};
  sge = Sge{reinterpret_cast<uint64_t>(big), sizeof(big), 0};
  SendWr* bad = nullptr;
  EXPECT_EQ(qa->PostSend(&wr, &bad).code(), absl::StatusCode::kInvalidArgument);
  // Not inline and not registered: a local protection error (rxe reports it as a local QP
  // operation error).
  wr.flags = kSignaled;
  ASSERT_TRUE(Post(*qa, wr).ok());
  const CompletionStatus status = PollN(*a_->send_cq, 1).at(0).status;
  EXPECT_TRUE(status == CompletionStatus::kLocalProtectionError ||
              (!IsShmBackend(GetParam()) && status == CompletionStatus::kLocalQpOperationError))
      << ToString(status);
}

// A poller that sees a WRITE's last 8 bytes must see every byte before them.
TEST_P(Conformance, WriteMakesItsLastEightBytesVisibleLast) {
  auto qa = MakeQp(*a_, QpType::kUc);
  auto qb = MakeQp(*b_, QpType::kUc);
  ConnectPair(*qa, *qb);
  constexpr uint32_t kSlot = 1024;
  constexpr int kRounds = 2000;
  std::atomic<bool> torn{false};
  std::atomic<int> consumed{0};
  std::atomic<bool> stop{false};  // set when a post fails, so the poller never waits forever
  volatile uint8_t* slot = b_->bytes();
  std::thread poller([&] {
    for (int round = 1; round <= kRounds; ++round) {
      const auto marker = static_cast<uint8_t>(round);
      while (slot[kSlot - 1] != marker) {
        if (stop.load(std::memory_order_relaxed)) return;
      }
      for (uint32_t i = 0; i < kSlot; ++i) {
        if (slot[i] != marker) torn = true;
      }
      consumed.store(round, std::memory_order_release);
    }
  });
  Sge sge;
  for (int round = 1; round <= kRounds; ++round) {
    std::memset(a_->bytes(), round & 0xff, kSlot);
    SendWr wr = Write(*a_, 0, kSlot, *b_, 0, &sge);
    const bool posted = Post(*qa, wr).ok() && PollN(*a_->send_cq, 1).size() == 1;
    EXPECT_TRUE(posted) << round;
    if (!posted) {
      stop = true;
      break;
    }
    while (consumed.load(std::memory_order_acquire) != round) {
    }
  }
  poller.join();
  EXPECT_FALSE(torn);
}

// fabric.h's READ promise on shm: each 64-byte line as of one instant. A writer thread stores a
// round number into every word of two lines, word by word in ascending order, round after
// round; at any instant a line therefore holds round r + 1 in a prefix of its words and r in
// the rest. A READ racing it must return only such lines: a line whose words are not
// non-increasing, or span more than one round, was copied across two instants. The reader runs
// with slow READs (pauses inside the copy, where the writer gets ahead) and without.
TEST_P(Conformance, ReadReturnsEachVersionedLineAsOfOneInstant) {
  if (!IsShmBackend(GetParam())) {
    GTEST_SKIP() << "a NIC's READ of a line is the NIC's business (fabric.h); rxe promises none";
  }
  constexpr uint32_t kLines = 2;
  constexpr uint32_t kWordsPerLine = 8;
  constexpr int kReads = 400;
  auto* words = reinterpret_cast<uint64_t*>(b_->bytes());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rounds{0};
  std::thread writer([&] {
    for (uint64_t round = 1; !stop.load(std::memory_order_relaxed); ++round) {
      for (uint32_t w = 0; w < kLines * kWordsPerLine; ++w) {
        std::atomic_ref<uint64_t>(words[w]).store(round, std::memory_order_release);
      }
      rounds.store(round, std::memory_order_relaxed);
    }
  });
  for (const uint32_t slow_read_us : {0u, 20u}) {
    auto reader =
        MakeNode(GetParam(), kAllAccess, 4096, "test", FaultOptions{.slow_read_us = slow_read_us});
    ASSERT_NE(reader, nullptr);
    auto qa = MakeQp(*reader, QpType::kRc);
    auto qb = MakeQp(*b_, QpType::kRc);
    ConnectPair(*qa, *qb);
    int torn_lines = 0;
    Sge sge = reader->sge(0, kLines * kWordsPerLine * 8);
    for (int i = 0; i < kReads && torn_lines == 0; ++i) {
      SendWr read;
      read.sg_list = &sge;
      read.num_sge = 1;
      read.opcode = Opcode::kRead;
      read.flags = kSignaled;
      read.remote_addr = b_->addr(0);
      read.rkey = b_->mr->rkey();
      ASSERT_TRUE(Post(*qa, read).ok());
      ASSERT_EQ(PollN(*reader->send_cq, 1).at(0).status, CompletionStatus::kSuccess);
      const auto* got = reinterpret_cast<const uint64_t*>(reader->bytes());
      for (uint32_t line = 0; line < kLines; ++line) {
        const uint64_t* l = got + line * kWordsPerLine;
        bool prefix_shaped = l[0] - l[kWordsPerLine - 1] <= 1;
        for (uint32_t w = 1; w < kWordsPerLine; ++w) prefix_shaped &= l[w] <= l[w - 1];
        if (!prefix_shaped) ++torn_lines;
      }
    }
    EXPECT_EQ(torn_lines, 0) << "slow_read_us " << slow_read_us;
  }
  stop = true;
  writer.join();
  EXPECT_GT(rounds.load(), 1u);  // the writer really raced the READs
}

// What a poller of one WRITE's slot saw (see ProbeWriteDisorder).
struct DisorderSeen {
  bool last_word_before_another = false;  // the last word landed while another had not
  bool last_word_reappeared = false;      // it came back after the poller zeroed it
};

// UC WRITEs of a slot from `from` to `to`, up to `tries` of them (fewer once both things were
// seen): a poller waits for the slot's last word, checks every other word, zeroes the last one;
// once the WRITE completed (after any re-write) the last word shows whether it came back.
DisorderSeen ProbeWriteDisorder(Node& from, Node& to, int tries,
                                absl::Duration budget = absl::InfiniteDuration()) {
  constexpr uint32_t kSlot = 32 << 10;  // 4096 words: a placement that takes a while
  auto qa = MakeQp(from, QpType::kUc);
  auto qb = MakeQp(to, QpType::kUc);
  ConnectPair(*qa, *qb);
  DisorderSeen seen;
  std::atomic_ref<uint64_t> last(*reinterpret_cast<uint64_t*>(to.bytes() + kSlot - 8));
  const absl::Time stop = absl::Now() + budget;
  for (int round = 1; round <= tries && absl::Now() < stop; ++round) {
    if (seen.last_word_before_another && seen.last_word_reappeared) break;
    const auto marker = static_cast<uint8_t>(1 + round % 255);  // never 0: the zeroed slot
    uint64_t pattern;
    std::memset(&pattern, marker, sizeof(pattern));
    std::memset(from.bytes(), marker, kSlot);
    std::memset(to.bytes(), 0, kSlot);
    std::atomic<bool> early{false};
    std::thread poller([&] {
      const absl::Time give_up = absl::Now() + kCompletionDeadline;
      while (last.load(std::memory_order_acquire) != pattern) {
        if (absl::Now() > give_up) return;
      }
      const auto* words = reinterpret_cast<const uint64_t*>(to.bytes());
      for (uint32_t i = 0; i + 1 < kSlot / 8; ++i) {
        if (std::atomic_ref<const uint64_t>(words[i]).load(std::memory_order_relaxed) != pattern) {
          early = true;
          break;
        }
      }
      last.store(0, std::memory_order_release);  // consumed
    });
    Sge sge;
    SendWr wr = Write(from, 0, kSlot, to, 0, &sge);
    const bool posted = Post(*qa, wr).ok();
    poller.join();  // not polling meanwhile: on a 2-core machine the poller needs the other core
    const bool done = posted && PollN(*from.send_cq, 1).size() == 1;
    EXPECT_TRUE(done) << round;
    if (!done) break;
    seen.last_word_before_another |= early.load();
    seen.last_word_reappeared |= last.load(std::memory_order_acquire) == pattern;
  }
  return seen;
}

// Injected write disorder (shm only): with probability 1, a poller sees a WRITE's last word
// before some other word of it, and sees the last word come back after it consumed it; with
// probability 0 neither ever happens.
TEST_P(Conformance, InjectedWriteDisorderLandsWordsOutOfOrderAndTwice) {
  if (!IsShmBackend(GetParam())) GTEST_SKIP() << "fault injection is a shm fabric feature";
  // Usually the first try sees both. Seeing the last word early needs the poller running while
  // the WRITE is placed, which a loaded 2-core machine may not grant for hundreds of tries in a
  // row (seen under ASan beside other tests): tries until both are seen, within a minute.
  constexpr int kTries = std::numeric_limits<int>::max();
  constexpr absl::Duration kDisorderBudget = absl::Seconds(60);
  constexpr uint32_t kPauseUs = 2000;  // wide: the poller must zero the word within it
  FaultOptions faults;
  faults.write_disorder = 1;
  faults.disorder_pause_us = kPauseUs;
  auto x = MakeNode(GetParam(), kAllAccess, 4096, "test", faults);
  auto y = MakeNode(GetParam(), kAllAccess, 4096, "test", faults);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  const DisorderSeen disordered = ProbeWriteDisorder(*x, *y, kTries, kDisorderBudget);
  EXPECT_TRUE(disordered.last_word_before_another);
  EXPECT_TRUE(disordered.last_word_reappeared);
  constexpr int kOrderedTries = 10;
  const DisorderSeen ordered = ProbeWriteDisorder(*a_, *b_, kOrderedTries);
  EXPECT_FALSE(ordered.last_word_before_another);
  EXPECT_FALSE(ordered.last_word_reappeared);
}

TEST_P(Conformance, FabricNamesIsolateRuns) {
  auto other = MakeNode(GetParam(), kAllAccess, 4096, "another-fabric");
  if (!IsShmBackend(GetParam())) GTEST_SKIP() << "fabric names are a shm fabric notion";
  auto qa = MakeQp(*a_, QpType::kRc);
  auto qo = MakeQp(*other, QpType::kRc);
  ConnectConfig config;
  config.remote = qo->endpoint();
  EXPECT_FALSE(qa->Connect(config).ok());
  EXPECT_FALSE(a_->pd->CreateAddressHandle(AddressInfo{0, other->device->port().gid}).ok());
}

TEST_P(Conformance, PrivateMemoryCannotBeRegisteredOnShm) {
  if (!IsShmBackend(GetParam())) GTEST_SKIP() << "verbs registers any memory";
  std::vector<char> heap(4096);
  auto mr = a_->pd->RegisterMemory(heap.data(), heap.size(), kLocalWrite);
  EXPECT_EQ(mr.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mr.status().message().find("SharedMemory::Allocate"), std::string::npos);
}

// A wrong device, port or GID index is refused with an error that lists what does exist.
TEST_P(Conformance, AWrongDevicePortOrGidNamesWhatExists) {
  DeviceOptions options;
  options.name = "no-such-device";
  absl::Status status = OpenDevice(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("no-such-device"), std::string::npos) << status;
  if (IsShmBackend(GetParam())) return;
  const std::string device = a_->device->name();
  EXPECT_NE(status.message().find(device), std::string::npos) << status;
  options.name = device;
  options.port = 9;
  status = OpenDevice(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("its ports: 1 ("), std::string::npos) << status;
  options.port = 1;
  options.gid_index = 100;
  status = OpenDevice(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("its GIDs: "), std::string::npos) << status;
  options.gid_index = -1;
  options.mtu = 1000;
  EXPECT_EQ(OpenDevice(options).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::Values("shm", "shm_async", "verbs"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace transport::testing
