// RDMA-CM connection setup (transport/cm.h): on a verbs device with an IPv4 address (rxe0 in the
// Soft-RoCE guest), a listener and a client connect two RC QPs by IP address and port, and the
// pair then carries WRITEs and SENDs both ways; a connection nobody accepts fails within its
// timeout. Everywhere: the shm fabric is refused clearly.
#include "transport/cm.h"

#include <arpa/inet.h>

#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/transport/fabric_fixture.h"

namespace transport::testing {
namespace {

constexpr absl::Duration kCmTimeout = absl::Seconds(10);

class CmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = MakeNode("verbs");
    b_ = MakeNode("verbs");
    if (a_ == nullptr || b_ == nullptr) GTEST_SKIP() << "no verbs device on this machine";
    address_ = Ipv4OfGid(a_->device->port().gid);
    if (address_.empty()) GTEST_SKIP() << "the verbs device's GID carries no IPv4 address";
  }
  std::unique_ptr<Node> a_, b_;
  std::string address_;
};

TEST_F(CmTest, ConnectsTwoRcQpsThatThenCarryWritesAndSends) {
  auto listener = CmListener::Listen(address_, 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  auto qa = MakeQp(*a_, QpType::kRc);
  auto qb = MakeQp(*b_, QpType::kRc);
  absl::StatusOr<std::unique_ptr<CmConnection>> accepted;
  std::thread server([&] { accepted = (*listener)->Accept(*b_->device, *qb, kCmTimeout); });
  auto connected = CmConnect(*a_->device, *qa, address_, (*listener)->port(), kCmTimeout);
  server.join();
  ASSERT_TRUE(connected.ok()) << connected.status();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(qa->state(), QpState::kRts);
  EXPECT_EQ(qb->state(), QpState::kRts);

  std::memcpy(a_->bytes(), "cm-write", 8);
  Sge sge = a_->sge(0, 8);
  SendWr write;
  write.sg_list = &sge;
  write.num_sge = 1;
  write.opcode = Opcode::kWrite;
  write.flags = kSignaled;
  write.remote_addr = b_->addr(64);
  write.rkey = b_->mr->rkey();
  ASSERT_TRUE(Post(*qa, write).ok());
  auto done = PollN(*a_->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kSuccess) << ToString(done[0].status);
  EXPECT_EQ(std::memcmp(b_->bytes() + 64, "cm-write", 8), 0);

  ASSERT_TRUE(PostRecv(*qa, *a_, 5, 128, 64).ok());
  std::memcpy(b_->bytes(), "cm-send!", 8);
  Sge back = b_->sge(0, 8);
  SendWr send;
  send.sg_list = &back;
  send.num_sge = 1;
  send.opcode = Opcode::kSend;
  send.flags = kSignaled;
  ASSERT_TRUE(Post(*qb, send).ok());
  auto received = PollN(*a_->recv_cq, 1);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].status, CompletionStatus::kSuccess);
  EXPECT_EQ(received[0].byte_len, 8u);
  EXPECT_EQ(std::memcmp(a_->bytes() + 128, "cm-send!", 8), 0);
}

// Application bytes ride in the REQ and REP next to the endpoints, up to what each CM message
// leaves (the REP's full kCmReplyAppBytes included); more is refused before anything is sent.
TEST_F(CmTest, ApplicationBytesTravelInBothDirections) {
  auto listener = CmListener::Listen(address_, 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  auto qa = MakeQp(*a_, QpType::kRc);
  auto qb = MakeQp(*b_, QpType::kRc);
  std::vector<uint8_t> request(kCmRequestAppBytes), reply(kCmReplyAppBytes);
  for (size_t i = 0; i < request.size(); ++i) request[i] = static_cast<uint8_t>(i + 1);
  for (size_t i = 0; i < reply.size(); ++i) reply[i] = static_cast<uint8_t>(255 - i);
  std::vector<uint8_t> seen_request, seen_reply;
  absl::StatusOr<std::unique_ptr<CmConnection>> accepted = absl::UnknownError("not run");
  std::thread server([&] {
    const absl::Time deadline = absl::Now() + kCmTimeout;
    while (absl::Now() < deadline) {
      auto next = (*listener)->NextRequest();
      if (!next.ok()) {
        accepted = next.status();
        return;
      }
      if (*next == nullptr) continue;
      seen_request.assign((*next)->app_data().begin(), (*next)->app_data().end());
      accepted = (*next)->Accept(*b_->device, *qb, reply);
      return;
    }
  });
  auto connected =
      CmConnect(*a_->device, *qa, address_, (*listener)->port(), kCmTimeout, request, &seen_reply);
  server.join();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  ASSERT_TRUE(connected.ok()) << connected.status();
  EXPECT_EQ(seen_request, request);
  EXPECT_EQ(seen_reply, reply);

  auto qc = MakeQp(*a_, QpType::kRc);
  std::vector<uint8_t> too_long(kCmRequestAppBytes + 1);
  auto refused = CmConnect(*a_->device, *qc, address_, (*listener)->port(), kCmTimeout, too_long);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_EQ(qc->state(), QpState::kReset);
}

TEST_F(CmTest, AConnectionNobodyAcceptsFailsWithinItsTimeout) {
  auto listener = CmListener::Listen(address_, 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const uint16_t port = (*listener)->port();
  listener->reset();  // nobody listens there any more
  auto qa = MakeQp(*a_, QpType::kRc);
  const absl::Time start = absl::Now();
  auto connected = CmConnect(*a_->device, *qa, address_, port, absl::Seconds(3));
  EXPECT_FALSE(connected.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_NE(qa->state(), QpState::kRts);
}

TEST(Cm, TheShmFabricIsRefusedClearly) {
  auto node = MakeNode("shm");
  ASSERT_NE(node, nullptr);
  auto qp = MakeQp(*node, QpType::kRc);
  auto connected = CmConnect(*node->device, *qp, "127.0.0.1", 1, absl::Seconds(1));
  EXPECT_EQ(connected.status().code(), absl::StatusCode::kUnimplemented) << connected.status();
  EXPECT_NE(connected.status().message().find("control plane"), std::string::npos);
}

TEST(Cm, AUdQpIsRefused) {
  auto node = MakeNode("verbs");
  if (node == nullptr) GTEST_SKIP() << "no verbs device on this machine";
  auto qp = MakeQp(*node, QpType::kUd);
  auto connected = CmConnect(*node->device, *qp, "127.0.0.1", 1, absl::Seconds(1));
  EXPECT_EQ(connected.status().code(), absl::StatusCode::kInvalidArgument) << connected.status();
}

}  // namespace
}  // namespace transport::testing
