// The control plane over RDMA-CM (transport/cm_channel.h), on a verbs device with an IPv4 address
// (rxe0 in the Soft-RoCE guest): messages both ways and a handshake released whole; what a
// server's handshake set does with a silent client, a malformed message, an oversized one, a
// flood past max_pending, and a client killed mid-session. Everywhere: shm is refused clearly.
#include "transport/cm_channel.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/transport/fabric_fixture.h"

namespace transport::testing {
namespace {

using control::HandshakeEvent;
using Kind = control::HandshakeEvent::Kind;

constexpr absl::Duration kTimeout = absl::Seconds(10);
constexpr absl::Duration kWaitSlice = absl::Milliseconds(50);

std::vector<uint8_t> Bytes(std::string_view text) { return {text.begin(), text.end()}; }

// Waits up to kTimeout for the set's next events (the server side of every test).
std::vector<HandshakeEvent> NextEvents(CmHandshakes& set) {
  std::vector<HandshakeEvent> events;
  const absl::Time deadline = absl::Now() + kTimeout;
  while (events.empty() && absl::Now() < deadline) set.Wait(kWaitSlice, &events);
  return events;
}

// Runs `connect` on a thread while serving the set (a CM handshake needs both sides) and returns
// the events the set reported meanwhile.
template <typename Connect>
std::vector<HandshakeEvent> ServeWhile(CmHandshakes& set, Connect connect) {
  std::atomic<bool> done{false};
  std::thread joiner([&] {
    connect();
    done.store(true);
  });
  std::vector<HandshakeEvent> all, batch;
  while (!done.load()) {
    set.Wait(kWaitSlice, &batch);
    all.insert(all.end(), batch.begin(), batch.end());
  }
  joiner.join();
  return all;
}

// Polls PeerClosed until it turns true; false when it stays false for kTimeout.
bool EventuallyClosed(const control::MessageChannel& channel) {
  const absl::Time deadline = absl::Now() + kTimeout;
  while (!channel.PeerClosed()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

class CmChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_ = MakeNode("verbs");
    server_ = MakeNode("verbs");
    if (client_ == nullptr || server_ == nullptr) {
      GTEST_SKIP() << "no verbs device on this machine";
    }
    address_ = Ipv4OfGid(server_->device->port().gid);
    if (address_.empty()) GTEST_SKIP() << "the verbs device's GID carries no IPv4 address";
  }
  std::unique_ptr<CmHandshakes> Listen(control::PendingOptions options = {}) {
    auto set = CmHandshakes::Create(*server_->device, address_, 0, options);
    EXPECT_TRUE(set.ok()) << set.status();
    return set.ok() ? *std::move(set) : nullptr;
  }
  std::string HostPort(const CmHandshakes& set) const {
    return absl::StrFormat("%s:%d", address_, set.port());
  }
  // Connects a client that sends hello (type 1) at once; the set's events meanwhile, or its next
  // ones, in *events.
  void JoinWithHello(CmHandshakes& set, absl::StatusOr<std::unique_ptr<CmChannel>>* client,
                     std::vector<HandshakeEvent>* events) {
    *events = ServeWhile(set, [&] {
      *client = CmChannel::Connect(*client_->device, HostPort(set), kTimeout);
      if (client->ok()) (void)(**client)->Send(1, Bytes("hello"));
    });
    ASSERT_TRUE(client->ok()) << client->status();
    if (events->empty()) *events = NextEvents(set);
  }
  std::unique_ptr<Node> client_, server_;
  std::string address_;
};

TEST_F(CmChannelTest, MessagesTravelBothWaysAndAReleasedChannelLosesNothing) {
  auto set = Listen();
  ASSERT_NE(set, nullptr);
  absl::StatusOr<std::unique_ptr<CmChannel>> client;
  std::vector<HandshakeEvent> events;
  ASSERT_NO_FATAL_FAILURE(JoinWithHello(*set, &client, &events));
  ASSERT_EQ(events.size(), 1u);
  ASSERT_EQ(events[0].kind, Kind::kMessage) << events[0].status;
  EXPECT_EQ(events[0].message.type, 1);
  EXPECT_EQ(events[0].message.payload, Bytes("hello"));
  const uint64_t id = events[0].id;

  ASSERT_TRUE(set->Send(id, 2, Bytes("config")).ok());
  auto reply = (*client)->Receive(kTimeout);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->type, 2);
  EXPECT_EQ(reply->payload, Bytes("config"));

  // The client's next two messages, sent before the server releases the connection: the set
  // reports one per Wait, the other stays in the channel.
  ASSERT_TRUE((*client)->Send(3, Bytes("join")).ok());
  ASSERT_TRUE((*client)->Send(4, {}).ok());
  // Both sends completed: both messages sit at the server before it looks.
  const absl::Time sent_by = absl::Now() + kTimeout;
  while (!(*client)->SendsDone() && absl::Now() < sent_by) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE((*client)->SendsDone());
  events = NextEvents(*set);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].message.type, 3);
  auto released = set->ReleaseChannel(id);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(set->size(), 0u);
  auto queued = (*released)->Receive(kTimeout);
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(queued->type, 4);
  EXPECT_TRUE(queued->payload.empty());
  EXPECT_FALSE((*released)->PeerClosed());

  client->reset();  // the client leaves: a DREQ
  EXPECT_TRUE(EventuallyClosed(**released));
}

// A joined peer that keeps sending to a channel nobody reads (a session's, after its join) fills
// the receive slots and then stalls in RNR: the server holds no more than those messages.
TEST_F(CmChannelTest, AFloodingPeerIsHeldToTheReceiveSlots) {
  auto set = Listen();
  ASSERT_NE(set, nullptr);
  absl::StatusOr<std::unique_ptr<CmChannel>> client;
  std::vector<HandshakeEvent> events;
  ASSERT_NO_FATAL_FAILURE(JoinWithHello(*set, &client, &events));
  ASSERT_EQ(events.size(), 1u);
  auto released = set->ReleaseChannel(events[0].id);
  ASSERT_TRUE(released.ok()) << released.status();

  constexpr int kFlood = 32;
  int sent = 0;
  absl::Status refused;
  for (int i = 0; i < kFlood && refused.ok(); ++i) {
    refused = (*client)->Send(5, std::vector<uint8_t>(1024, static_cast<uint8_t>(i)));
    if (refused.ok()) ++sent;
    // The server's control loop looks at its sessions (PeerClosed reaps their completions).
    const absl::Time until = absl::Now() + absl::Milliseconds(20);
    while (absl::Now() < until) EXPECT_FALSE((*released)->PeerClosed());
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << "sent " << sent;
  EXPECT_LE(sent, static_cast<int>(kCmReceiveSlots + kCmSendSlots));
  // What was held is delivered in order once read, and the stalled sends then land too.
  for (int i = 0; i < sent; ++i) {
    auto message = (*released)->Receive(kTimeout);
    ASSERT_TRUE(message.ok()) << i << ": " << message.status();
    ASSERT_EQ(message->payload.size(), 1024u);
    EXPECT_EQ(message->payload[0], i);
  }
}

TEST_F(CmChannelTest, AnOversizedMessageIsRefusedAndTheChannelStillWorks) {
  auto set = Listen();
  ASSERT_NE(set, nullptr);
  absl::StatusOr<std::unique_ptr<CmChannel>> client;
  std::vector<HandshakeEvent> events = ServeWhile(
      *set, [&] { client = CmChannel::Connect(*client_->device, HostPort(*set), kTimeout); });
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(events.empty());
  const absl::Status big = (*client)->Send(1, std::vector<uint8_t>(kCmMaxMessageBytes, 7));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument) << big;
  ASSERT_TRUE(
      (*client)->Send(1, std::vector<uint8_t>(kCmMaxMessageBytes - kCmHeaderBytes, 7)).ok());
  events = NextEvents(*set);
  ASSERT_EQ(events.size(), 1u);
  ASSERT_EQ(events[0].kind, Kind::kMessage) << events[0].status;
  EXPECT_EQ(events[0].message.payload.size(), kCmMaxMessageBytes - kCmHeaderBytes);
}

TEST_F(CmChannelTest, AClientThatNeverSendsIsTimedOut) {
  control::PendingOptions options;
  options.first_message_timeout = absl::Milliseconds(300);
  auto set = Listen(options);
  ASSERT_NE(set, nullptr);
  absl::StatusOr<std::unique_ptr<CmChannel>> client;
  std::vector<HandshakeEvent> events = ServeWhile(
      *set, [&] { client = CmChannel::Connect(*client_->device, HostPort(*set), kTimeout); });
  ASSERT_TRUE(client.ok()) << client.status();
  if (events.empty()) events = NextEvents(*set);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kTimedOut) << events[0].status;
  EXPECT_EQ(set->size(), 0u);
  // The server dropped it: the client sees its connection end.
  EXPECT_TRUE(EventuallyClosed(**client));
}

TEST_F(CmChannelTest, ANonHerdMessageIsAnError) {
  auto set = Listen();
  ASSERT_NE(set, nullptr);
  // A raw RC QP connected by the CM, sending bytes without the message header.
  auto qp = MakeQp(*client_, QpType::kRc);
  absl::StatusOr<std::unique_ptr<CmConnection>> connection;
  std::vector<HandshakeEvent> events = ServeWhile(*set, [&] {
    connection = CmConnect(*client_->device, *qp, address_, set->port(), kTimeout);
    if (!connection.ok()) return;
    std::memcpy(client_->bytes(), "GET / HTTP/1.0\r\n", 16);
    Sge sge = client_->sge(0, 16);
    SendWr send;
    send.sg_list = &sge;
    send.num_sge = 1;
    send.opcode = Opcode::kSend;
    send.flags = kSignaled;
    (void)Post(*qp, send);
  });
  ASSERT_TRUE(connection.ok()) << connection.status();
  if (events.empty()) events = NextEvents(*set);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kError);
  EXPECT_EQ(events[0].status.code(), absl::StatusCode::kDataLoss) << events[0].status;
  EXPECT_EQ(set->size(), 0u);
}

TEST_F(CmChannelTest, AFloodPastMaxPendingEvictsTheOldest) {
  control::PendingOptions options;
  options.max_pending = 1;
  auto set = Listen(options);
  ASSERT_NE(set, nullptr);
  std::vector<absl::StatusOr<std::unique_ptr<CmChannel>>> clients(2);
  std::vector<HandshakeEvent> events;
  for (auto& client : clients) {
    std::vector<HandshakeEvent> batch = ServeWhile(
        *set, [&] { client = CmChannel::Connect(*client_->device, HostPort(*set), kTimeout); });
    ASSERT_TRUE(client.ok()) << client.status();
    events.insert(events.end(), batch.begin(), batch.end());
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kEvicted) << events[0].status;
  EXPECT_EQ(set->size(), 1u);
  EXPECT_TRUE(EventuallyClosed(**clients[0]));  // the first was dropped ...
  EXPECT_FALSE((*clients[1])->PeerClosed());    // ... the newest stays
}

TEST_F(CmChannelTest, AKilledClientIsSeenToLeave) {
  auto set = Listen();
  ASSERT_NE(set, nullptr);
  const std::string host_port = HostPort(*set);
  const std::string device = client_->device->name();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A process of its own, as a real client: opens its device, joins, says hello, waits.
    DeviceOptions options;
    options.name = device;
    auto opened = OpenDevice(options);
    if (!opened.ok()) _exit(2);
    auto channel = CmChannel::Connect(**opened, host_port, kTimeout);
    if (!channel.ok() || !(*channel)->Send(1, Bytes("hello")).ok()) _exit(3);
    pause();
    _exit(0);
  }
  std::vector<HandshakeEvent> events = NextEvents(*set);
  ASSERT_EQ(events.size(), 1u);
  ASSERT_EQ(events[0].kind, Kind::kMessage) << events[0].status;
  auto released = set->ReleaseChannel(events[0].id);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_FALSE((*released)->PeerClosed());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  // The kernel disconnects a dead process's CM ids: the server learns it without any timeout.
  EXPECT_TRUE(EventuallyClosed(**released));
}

// A request carrying application bytes is no control channel: the set hands it to the
// OnOtherRequest handler, or rejects it when there is none; neither becomes a pending join.
TEST_F(CmChannelTest, RequestsWithApplicationBytesGoToTheHandlerOrAreRejected) {
  auto set = Listen();
  ASSERT_NE(set, nullptr);
  const std::vector<uint8_t> hello = Bytes("app");
  auto connect_raw = [&](absl::StatusOr<std::unique_ptr<CmConnection>>* out) {
    auto qp = MakeQp(*client_, QpType::kRc);
    return ServeWhile(*set, [&] {
      *out = CmConnect(*client_->device, *qp, address_, set->port(), absl::Seconds(5), hello);
    });
  };
  absl::StatusOr<std::unique_ptr<CmConnection>> rejected = absl::UnknownError("not run");
  EXPECT_TRUE(connect_raw(&rejected).empty());
  EXPECT_FALSE(rejected.ok());
  EXPECT_EQ(set->size(), 0u);

  std::vector<std::vector<uint8_t>> handled;
  std::unique_ptr<QueuePair> server_qp = MakeQp(*server_, QpType::kRc);
  std::unique_ptr<CmConnection> server_end;
  set->OnOtherRequest([&](std::unique_ptr<CmRequest> request) {
    handled.emplace_back(request->app_data().begin(), request->app_data().end());
    auto accepted = request->Accept(*server_->device, *server_qp);
    if (accepted.ok()) server_end = *std::move(accepted);
  });
  absl::StatusOr<std::unique_ptr<CmConnection>> accepted = absl::UnknownError("not run");
  EXPECT_TRUE(connect_raw(&accepted).empty());
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  ASSERT_EQ(handled.size(), 1u);
  EXPECT_EQ(handled[0], hello);
  EXPECT_NE(server_end, nullptr);
  EXPECT_EQ(set->size(), 0u);
}

TEST(CmChannel, TheShmFabricIsRefusedClearly) {
  auto node = MakeNode("shm");
  ASSERT_NE(node, nullptr);
  auto client = CmChannel::Connect(*node->device, "127.0.0.1:1", absl::Seconds(1));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnimplemented) << client.status();
  EXPECT_NE(client.status().message().find("--connect=tcp"), std::string::npos);
  auto set = CmHandshakes::Create(*node->device, "127.0.0.1", 0);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kUnimplemented) << set.status();
}

TEST(CmChannel, ABadAddressIsAClearError) {
  auto node = MakeNode("verbs");
  if (node == nullptr) GTEST_SKIP() << "no verbs device on this machine";
  for (const char* bad : {"", "no-port", "1.2.3.4:0", "1.2.3.4:70000", "1.2.3.4:x"}) {
    auto client = CmChannel::Connect(*node->device, bad, absl::Seconds(1));
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument)
        << bad << ": " << client.status();
  }
}

}  // namespace
}  // namespace transport::testing
