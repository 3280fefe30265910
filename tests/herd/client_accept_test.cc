// What a client takes from an answer: an answer it drops as stray (an unknown flag, an
// out-of-line answer it cannot use, a value on a write's answer) says nothing about the round
// trip, so it must not feed the retransmission timer; the answer it delivers does.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "herd/client.h"
#include "herd/protocol.h"
#include "tests/herd/client_test_peer.h"
#include "tests/herd/server_fixture.h"

namespace herd::testing {
namespace {

// A flag bit no response defines (protocol.h: kResponseOutOfLine, kResponseCopied).
constexpr uint8_t kUnknownFlag = 0x80;

class ClientAccept : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(SmallServer("client_accept"));
    ASSERT_TRUE(server_->ok());
    client_ = Join(*server_, "client_accept");
    ASSERT_NE(client_, nullptr);
  }

  // Submits `op` on `key` (never polled: the server's own answer stays unread) and returns an
  // answer naming it exactly: its worker, seq, first attempt and status OK.
  ParsedResponse AnswerTo(Op op, const std::string& key, const std::string& value) {
    EXPECT_TRUE(client_->Submit(0, op, key, value, 0, /*tag=*/1).ok());
    ParsedResponse response{};
    for (uint32_t worker = 0; worker < client_->config().workers; ++worker) {
      uint64_t seq = 0;
      if (ClientTestPeer::ActiveRequest(*client_, 0, worker, &seq)) {
        response.header.worker = static_cast<uint16_t>(worker);
        response.header.seq = seq;
      }
    }
    response.header.client_id = ClientTestPeer::FirstClientId(*client_);
    response.header.status = static_cast<uint8_t>(Status::kOk);
    response.value = value_bytes_;
    return response;
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Client> client_;
  uint8_t value_bytes_[64] = {};
};

TEST_F(ClientAccept, AStrayAnswerIsNoRoundTripAndTheDeliveredOneIs) {
  ParsedResponse answer = AnswerTo(Op::kGet, "key", "");
  const uint32_t worker = answer.header.worker;
  ASSERT_FALSE(ClientTestPeer::TimerHasSample(*client_, worker));
  Result result;

  ParsedResponse unknown_flag = answer;
  unknown_flag.header.flags = kUnknownFlag;
  EXPECT_FALSE(ClientTestPeer::Accept(*client_, unknown_flag, &result));
  EXPECT_FALSE(ClientTestPeer::TimerHasSample(*client_, worker)) << "an unknown flag";

  // Out of line, but its descriptor names an empty item: nothing to read, dropped.
  ParsedResponse empty_item = answer;
  empty_item.header.flags = kResponseOutOfLine;
  empty_item.header.value_bytes = sizeof(ValueDescriptor);
  EXPECT_FALSE(ClientTestPeer::Accept(*client_, empty_item, &result));
  EXPECT_FALSE(ClientTestPeer::TimerHasSample(*client_, worker)) << "an unusable descriptor";

  answer.header.value_bytes = 5;
  std::memcpy(value_bytes_, "value", 5);
  ASSERT_TRUE(ClientTestPeer::Accept(*client_, answer, &result));
  EXPECT_EQ(result.status, Status::kOk);
  EXPECT_EQ(std::string(result.value), "value");
  EXPECT_TRUE(ClientTestPeer::TimerHasSample(*client_, worker));
}

TEST_F(ClientAccept, AValueOnAWritesAnswerIsStrayAndNoRoundTrip) {
  ParsedResponse answer = AnswerTo(Op::kPut, "key", "v");
  const uint32_t worker = answer.header.worker;
  Result result;
  ParsedResponse with_value = answer;
  with_value.header.value_bytes = 5;
  EXPECT_FALSE(ClientTestPeer::Accept(*client_, with_value, &result));
  EXPECT_FALSE(ClientTestPeer::TimerHasSample(*client_, worker));
  ASSERT_TRUE(ClientTestPeer::Accept(*client_, answer, &result));
  EXPECT_TRUE(ClientTestPeer::TimerHasSample(*client_, worker));
}

}  // namespace
}  // namespace herd::testing
