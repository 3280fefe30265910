// The control plane's framing: round trips, and every way a frame can be bad gets a clear error.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "transport/control/channel.h"
#include "transport/control/wire.h"

namespace transport::control {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(10);

// A connected pair of channels over loopback TCP.
struct Pair {
  Channel client{-1};
  Channel server{-1};
};

Pair Connected() {
  auto listener = Listener::Listen("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status();
  Pair pair;
  auto client = Channel::Connect(absl::StrCat("127.0.0.1:", listener->port()), kTimeout);
  EXPECT_TRUE(client.ok()) << client.status();
  auto server = listener->Accept(kTimeout);
  EXPECT_TRUE(server.ok()) << server.status();
  pair.client = *std::move(client);
  pair.server = *std::move(server);
  return pair;
}

void WriteRaw(const Channel& channel, const void* data, size_t n) {
  ASSERT_EQ(send(channel.fd(), data, n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
}

TEST(Control, MessagesRoundTripInOrderOnOneConnection) {
  Pair pair = Connected();
  QpEndpoint endpoint;
  endpoint.qp_num = 0x123456;
  endpoint.lid = 7;
  endpoint.psn = 99;
  endpoint.gid[15] = 0xab;
  ASSERT_TRUE(
      pair.client.Send(1, WireWriter().U64(42).Bytes("key").Endpoint(endpoint).Take()).ok());
  ASSERT_TRUE(pair.client.Send(2, {}).ok());
  auto first = pair.server.Receive(kTimeout);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->type, 1);
  WireReader reader(first->payload, "test message");
  uint64_t number = 0;
  std::string text;
  QpEndpoint decoded;
  ASSERT_TRUE(reader.U64(&number) && reader.Bytes(&text, 16) && reader.Endpoint(&decoded));
  EXPECT_TRUE(reader.Finish().ok());
  EXPECT_EQ(number, 42u);
  EXPECT_EQ(text, "key");
  EXPECT_EQ(decoded.qp_num, endpoint.qp_num);
  EXPECT_EQ(decoded.lid, endpoint.lid);
  EXPECT_EQ(decoded.psn, endpoint.psn);
  EXPECT_EQ(decoded.gid, endpoint.gid);
  auto second = pair.server.Receive(kTimeout);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->type, 2);
  EXPECT_TRUE(second->payload.empty());
}

TEST(Control, TruncatedOrOverlongPayloadFieldsAreDataLoss) {
  const std::vector<uint8_t> bytes = WireWriter().U32(5).Take();
  WireReader short_read(bytes, "join request");
  uint64_t v;
  EXPECT_FALSE(short_read.U64(&v));
  EXPECT_EQ(short_read.Finish().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(short_read.Finish().message().find("join request"), std::string::npos);

  const std::vector<uint8_t> lie = WireWriter().U32(1000).Take();  // claims 1000 bytes
  WireReader lying(lie, "join request");
  std::string s;
  EXPECT_FALSE(lying.Bytes(&s, 4096));
  EXPECT_EQ(lying.status().code(), absl::StatusCode::kDataLoss);

  const std::vector<uint8_t> long_key = WireWriter().Bytes(std::string(300, 'k')).Take();
  WireReader too_long(long_key, "key");
  EXPECT_FALSE(too_long.Bytes(&s, 256));

  const std::vector<uint8_t> two = WireWriter().U8(1).U8(2).Take();
  WireReader trailing(two, "reply");
  uint8_t b;
  EXPECT_TRUE(trailing.U8(&b));
  EXPECT_EQ(trailing.Finish().code(), absl::StatusCode::kDataLoss);
}

TEST(Control, BadMagicVersionAndLengthAreRejected) {
  struct Case {
    uint32_t magic;
    uint16_t version;
    uint32_t length;
    const char* expect;
  };
  for (const Case& c : {Case{0xdeadbeef, kControlVersion, 0, "magic"},
                        Case{kControlMagic, kControlVersion + 1, 0, "version"},
                        Case{kControlMagic, kControlVersion, kMaxControlPayload + 1, "limit"}}) {
    Pair pair = Connected();
    uint8_t header[kFrameHeaderBytes] = {};
    std::memcpy(header, &c.magic, 4);
    std::memcpy(header + 4, &c.version, 2);
    std::memcpy(header + 8, &c.length, 4);
    WriteRaw(pair.client, header, sizeof(header));
    auto got = pair.server.Receive(kTimeout);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << c.expect;
    EXPECT_NE(got.status().message().find(c.expect), std::string::npos) << got.status();
  }
}

TEST(Control, APeerClosingMidFrameIsTruncationAndBetweenFramesIsUnavailable) {
  {
    Pair pair = Connected();
    uint8_t header[kFrameHeaderBytes] = {};
    const uint32_t magic = kControlMagic, length = 100;
    const uint16_t version = kControlVersion;
    std::memcpy(header, &magic, 4);
    std::memcpy(header + 4, &version, 2);
    std::memcpy(header + 8, &length, 4);
    WriteRaw(pair.client, header, sizeof(header));
    WriteRaw(pair.client, "only ten..", 10);
    pair.client = Channel(-1);  // closes
    auto got = pair.server.Receive(kTimeout);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_NE(got.status().message().find("10 of 100"), std::string::npos) << got.status();
  }
  {
    Pair pair = Connected();
    EXPECT_FALSE(pair.server.PeerClosed());
    pair.client = Channel(-1);
    EXPECT_EQ(pair.server.Receive(kTimeout).status().code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(pair.server.PeerClosed());
  }
}

// Waits until `fd` has something to read (or a close to report); false after kTimeout.
bool WaitReadable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kTimeout))) == 1;
}

// Polls PeerClosed until it turns true; false when it stays false for kTimeout. Loopback delivers
// a FIN or RST before close() returns in practice, but nothing promises that.
bool EventuallyPeerClosed(const Channel& channel) {
  const absl::Time deadline = absl::Now() + kTimeout;
  while (!channel.PeerClosed()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// A departed client must be retired even when it left bytes the server never read: otherwise a
// client that sends anything and closes keeps its ids forever.
TEST(Control, APeerThatClosedIsClosedEvenWithUnreadBytesWaiting) {
  Pair pair = Connected();
  ASSERT_TRUE(pair.client.Send(7, std::vector<uint8_t>(100, 1)).ok());
  ASSERT_TRUE(WaitReadable(pair.server.fd()));
  // Alive, with unread bytes: open.
  EXPECT_FALSE(pair.server.PeerClosed());
  pair.client = Channel(-1);  // closes with the server's bytes still unread (a FIN)
  EXPECT_TRUE(EventuallyPeerClosed(pair.server));
  // The unread message is still readable: closing is not a loss of what was sent.
  auto got = pair.server.Receive(kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->type, 7);
}

TEST(Control, APeerThatResetIsClosedEvenWithUnreadBytesWaiting) {
  Pair pair = Connected();
  ASSERT_TRUE(pair.client.Send(7, std::vector<uint8_t>(100, 1)).ok());
  ASSERT_TRUE(WaitReadable(pair.server.fd()));
  const linger abort_on_close{1, 0};  // close() sends an RST instead of a FIN
  ASSERT_EQ(
      setsockopt(pair.client.fd(), SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close)),
      0);
  pair.client = Channel(-1);
  EXPECT_TRUE(EventuallyPeerClosed(pair.server));
}

// A herd peer never half-closes: one that shuts its sending side down has left.
TEST(Control, APeerThatHalfClosedIsClosed) {
  Pair pair = Connected();
  ASSERT_EQ(shutdown(pair.client.fd(), SHUT_WR), 0);
  EXPECT_TRUE(EventuallyPeerClosed(pair.server));
  Pair with_data = Connected();
  ASSERT_TRUE(with_data.client.Send(7, {}).ok());
  ASSERT_EQ(shutdown(with_data.client.fd(), SHUT_WR), 0);
  EXPECT_TRUE(EventuallyPeerClosed(with_data.server));
}

TEST(Control, PeerClosedNeverBlocksOnAnIdleConnection) {
  Pair pair = Connected();
  const absl::Time start = absl::Now();
  EXPECT_FALSE(pair.server.PeerClosed());
  EXPECT_FALSE(pair.client.PeerClosed());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(Channel(-1).PeerClosed());  // no connection at all
}

TEST(Control, ReceiveTimesOutAndConnectNamesTheAddress) {
  Pair pair = Connected();
  EXPECT_EQ(pair.server.Receive(absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // A port nobody listens on (bind one, close it): refused until the deadline.
  uint16_t port = 0;
  {
    auto listener = Listener::Listen("127.0.0.1", 0);
    ASSERT_TRUE(listener.ok());
    port = listener->port();
  }
  auto refused = Channel::Connect(absl::StrCat("127.0.0.1:", port), absl::Milliseconds(100));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find(absl::StrCat(port)), std::string::npos);
  EXPECT_EQ(Channel::Connect("no-port-here", kTimeout).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace transport::control
