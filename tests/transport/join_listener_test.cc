// JoinListener (transport/join_listener.h): the one setup of herd_server's, hop_server's and
// rmem_server's join listeners. A TCP join reaches the handshake set and is answered through it,
// also after the listener was moved; a port bound beforehand is the one served; keepalive is on
// every accepted connection when asked for, and off otherwise; what RDMA-CM cannot take is
// refused, as is a port in use.
#include "transport/join_listener.h"

#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "transport/cm_channel.h"
#include "transport/control/channel.h"

namespace transport {
namespace {

// Bounds on what should take milliseconds (a failure is a stall, not a slow machine).
constexpr absl::Duration kTimeout = absl::Seconds(10);
constexpr absl::Duration kPoll = absl::Milliseconds(10);
constexpr uint16_t kHello = 1, kWelcome = 2;

std::unique_ptr<Device> ShmDevice() {
  DeviceOptions options;
  options.fabric = absl::StrCat("join-listener-test-", getpid());
  absl::StatusOr<std::unique_ptr<Device>> device = OpenDevice(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? *std::move(device) : nullptr;
}

JoinListenerOptions Loopback() {
  JoinListenerOptions options;
  options.address = "127.0.0.1";
  return options;
}

// Waits for the first message event on `joins`; its connection id.
uint64_t AwaitHello(JoinListener& joins, const std::string& payload) {
  const absl::Time deadline = absl::Now() + kTimeout;
  std::vector<control::HandshakeEvent> events;
  while (absl::Now() < deadline) {
    joins->Wait(kPoll, &events);
    for (const control::HandshakeEvent& e : events) {
      EXPECT_EQ(e.kind, control::HandshakeEvent::Kind::kMessage) << e.status;
      if (e.kind != control::HandshakeEvent::Kind::kMessage) return 0;
      EXPECT_EQ(e.message.type, kHello);
      EXPECT_EQ(std::string(e.message.payload.begin(), e.message.payload.end()), payload);
      return e.id;
    }
  }
  ADD_FAILURE() << "no hello within " << kTimeout;
  return 0;
}

std::unique_ptr<control::MessageChannel> Join(uint16_t port, const std::string& hello) {
  absl::StatusOr<std::unique_ptr<control::MessageChannel>> channel =
      ConnectControl(ConnectMode::kTcp, nullptr, absl::StrCat("127.0.0.1:", port), kTimeout);
  EXPECT_TRUE(channel.ok()) << channel.status();
  if (!channel.ok()) return nullptr;
  EXPECT_TRUE((*channel)->Send(kHello, std::vector<uint8_t>(hello.begin(), hello.end())).ok());
  return *std::move(channel);
}

void ExpectWelcome(control::MessageChannel& client) {
  absl::StatusOr<control::Message> welcome = client.Receive(kTimeout);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(welcome->type, kWelcome);
}

bool KeepaliveOn(JoinListener& joins, uint64_t id) {
  absl::StatusOr<std::unique_ptr<control::MessageChannel>> released = joins->ReleaseChannel(id);
  EXPECT_TRUE(released.ok()) << released.status();
  if (!released.ok()) return false;
  auto* channel = dynamic_cast<control::Channel*>(released->get());
  EXPECT_NE(channel, nullptr) << "a TCP join is a control::Channel";
  if (channel == nullptr) return false;
  int on = 0;
  socklen_t bytes = sizeof(on);
  EXPECT_EQ(getsockopt(channel->fd(), SOL_SOCKET, SO_KEEPALIVE, &on, &bytes), 0);
  return on != 0;
}

TEST(JoinListener, ATcpJoinIsServedAlsoAfterTheListenerMoved) {
  std::unique_ptr<Device> device = ShmDevice();
  ASSERT_NE(device, nullptr);
  absl::StatusOr<JoinListener> opened = JoinListener::Open(*device, Loopback());
  ASSERT_TRUE(opened.ok()) << opened.status();
  JoinListener joins = *std::move(opened);
  ASSERT_TRUE(joins);
  ASSERT_NE(joins.port(), 0);
  std::unique_ptr<control::MessageChannel> client = Join(joins.port(), "first");
  ASSERT_NE(client, nullptr);
  // Moved over another open listener: the old one closes, the moved one goes on serving.
  absl::StatusOr<JoinListener> other = JoinListener::Open(*device, Loopback());
  ASSERT_TRUE(other.ok()) << other.status();
  JoinListener serving = *std::move(other);
  const uint16_t port = joins.port();
  serving = std::move(joins);
  EXPECT_EQ(serving.port(), port);
  const uint64_t id = AwaitHello(serving, "first");
  ASSERT_NE(id, 0u);
  ASSERT_TRUE(serving->Send(id, kWelcome, {}).ok());
  ExpectWelcome(*client);
  EXPECT_FALSE(KeepaliveOn(serving, id)) << "keepalive is off unless asked for";
  serving.reset();
  EXPECT_FALSE(serving);
}

TEST(JoinListener, ServesTheTcpPortBoundBeforeItAndKeepsItsConnectionsAlive) {
  std::unique_ptr<Device> device = ShmDevice();
  ASSERT_NE(device, nullptr);
  absl::StatusOr<control::Listener> bound = control::Listener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(bound.ok()) << bound.status();
  const uint16_t port = bound->port();
  JoinListenerOptions options = Loopback();
  options.keepalive = Keepalive{};
  absl::StatusOr<JoinListener> joins =
      JoinListener::Open(*device, options, std::make_unique<control::Listener>(*std::move(bound)));
  ASSERT_TRUE(joins.ok()) << joins.status();
  EXPECT_EQ(joins->port(), port);
  std::unique_ptr<control::MessageChannel> client = Join(port, "kept alive");
  ASSERT_NE(client, nullptr);
  const uint64_t id = AwaitHello(*joins, "kept alive");
  ASSERT_NE(id, 0u);
  EXPECT_TRUE(KeepaliveOn(*joins, id));
}

TEST(JoinListener, RefusesAPortInUseAndWhatRdmaCmCannotTake) {
  std::unique_ptr<Device> device = ShmDevice();
  ASSERT_NE(device, nullptr);
  absl::StatusOr<JoinListener> first = JoinListener::Open(*device, Loopback());
  ASSERT_TRUE(first.ok()) << first.status();
  JoinListenerOptions same = Loopback();
  same.port = first->port();
  EXPECT_FALSE(JoinListener::Open(*device, same).ok());

  JoinListenerOptions cm = Loopback();
  cm.connect = ConnectMode::kCm;
  cm.keepalive = Keepalive{};
  EXPECT_EQ(JoinListener::Open(*device, cm).status().code(), absl::StatusCode::kInvalidArgument);
  cm.keepalive.reset();
  absl::StatusOr<control::Listener> bound = control::Listener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(JoinListener::Open(*device, cm, std::make_unique<control::Listener>(*std::move(bound)))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace transport
