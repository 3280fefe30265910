// PendingConnections: many unfinished handshakes at once on one thread. A flood of idle or
// half-sent connections must not delay a real join; every bad frame, close and passed deadline is
// reported with its cause; a finished handshake leaves as a working Channel without losing bytes.
#include "transport/control/pending_connections.h"

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "transport/control/channel.h"

namespace transport::control {
namespace {

using Event = PendingConnections::Event;
using Kind = PendingConnections::Event::Kind;

// Generous bound for anything that should take milliseconds: a failure means a real stall, not a
// slow machine.
constexpr absl::Duration kPrompt = absl::Seconds(2);
// How long a helper waits for an event that must come.
constexpr absl::Duration kTimeout = absl::Seconds(10);
// Wait's timeout inside the test loops.
constexpr absl::Duration kPoll = absl::Milliseconds(10);
// The flood of connections that never finish their join.
constexpr int kIdleConnections = 1000;
// Handshake message types of the two-step exchange the tests play (herd's shape: hello ->
// config, join -> welcome).
constexpr uint16_t kHello = 1, kConfig = 2, kJoin = 3, kWelcome = 4;

std::string LocalName(const Channel& channel) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(channel.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
  return absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
}

std::vector<uint8_t> Header(uint32_t magic, uint16_t version, uint16_t type, uint32_t length) {
  std::vector<uint8_t> h(kFrameHeaderBytes);
  std::memcpy(h.data(), &magic, 4);
  std::memcpy(h.data() + 4, &version, 2);
  std::memcpy(h.data() + 6, &type, 2);
  std::memcpy(h.data() + 8, &length, 4);
  return h;
}

std::vector<uint8_t> Frame(uint16_t type, const std::string& payload) {
  std::vector<uint8_t> f =
      Header(kControlMagic, kControlVersion, type, static_cast<uint32_t>(payload.size()));
  f.insert(f.end(), payload.begin(), payload.end());
  return f;
}

void WriteRaw(const Channel& channel, const std::vector<uint8_t>& bytes, size_t n) {
  ASSERT_LE(n, bytes.size());
  ASSERT_EQ(send(channel.fd(), bytes.data(), n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
}

class PendingConnectionsTest : public ::testing::Test {
 protected:
  void Start(PendingOptions options = {}) {
    auto listener = Listener::Listen("127.0.0.1", 0);
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = std::make_unique<Listener>(*std::move(listener));
    auto set = PendingConnections::Create(listener_.get(), options);
    ASSERT_TRUE(set.ok()) << set.status();
    set_ = *std::move(set);
  }

  Channel Connect() {
    auto channel = Channel::Connect(absl::StrCat("127.0.0.1:", listener_->port()), kTimeout);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return channel.ok() ? *std::move(channel) : Channel(-1);
  }

  // Waits until `done` holds for the events collected so far (false after kTimeout).
  bool CollectUntil(const std::function<bool(const std::vector<Event>&)>& done) {
    const absl::Time deadline = absl::Now() + kTimeout;
    std::vector<Event> batch;
    while (!done(collected_)) {
      if (absl::Now() > deadline) return false;
      set_->Wait(kPoll, &batch);
      for (Event& e : batch) collected_.push_back(std::move(e));
    }
    return true;
  }

  // The first event from `peer` (as "address:port"), waiting for it.
  std::optional<Event> EventFrom(const std::string& peer) {
    auto find = [&](const std::vector<Event>& events) -> const Event* {
      for (const Event& e : events) {
        if (e.peer == peer) return &e;
      }
      return nullptr;
    };
    if (!CollectUntil([&](const std::vector<Event>& events) { return find(events) != nullptr; })) {
      return std::nullopt;
    }
    Event event = *find(collected_);
    std::erase_if(collected_, [&](const Event& e) { return e.peer == peer; });
    return event;
  }

  std::unique_ptr<Listener> listener_;
  std::unique_ptr<PendingConnections> set_;
  std::vector<Event> collected_;
};

// Room for the flood on both ends of loopback, plus the test's own descriptors.
void RaiseDescriptorLimit(rlim_t needed) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur >= needed) return;
  ASSERT_GE(limit.rlim_max, needed) << "the hard descriptor limit is too low for this test";
  limit.rlim_cur = needed;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);
}

// The old server ran handshakes one at a time with 10 s per message: each of these connections
// cost every later join 10 s. Here a join next to 1,000 unfinished ones (silent, half a header,
// or a hello and then silence) completes in milliseconds.
TEST_F(PendingConnectionsTest, AThousandUnfinishedHandshakesDoNotDelayAJoin) {
  RaiseDescriptorLimit(2 * kIdleConnections + 256);
  Start();
  absl::Notification joined, stop;
  std::atomic<size_t> pending_at_join{0};
  Channel released(-1);
  // The server: one thread, the set's Wait loop, answering the two-step handshake.
  std::thread server([&] {
    std::vector<Event> events;
    while (!stop.HasBeenNotified()) {
      set_->Wait(kPoll, &events);
      for (const Event& e : events) {
        if (e.kind != Kind::kMessage) continue;
        if (e.message.type == kHello) {
          ASSERT_TRUE(set_->Send(e.id, kConfig, {1, 2, 3}).ok());
          ASSERT_TRUE(set_->SetDeadline(e.id, absl::Now() + kTimeout).ok());
        } else if (e.message.type == kJoin) {
          ASSERT_TRUE(set_->Send(e.id, kWelcome, e.message.payload).ok());
          pending_at_join = set_->size();
          auto channel = set_->Release(e.id);
          ASSERT_TRUE(channel.ok()) << channel.status();
          released = *std::move(channel);
          joined.Notify();
        }
      }
    }
  });
  std::vector<Channel> idle;
  for (int i = 0; i < kIdleConnections; ++i) {
    idle.push_back(Connect());
    if (i % 3 == 1) WriteRaw(idle.back(), Frame(kHello, "x"), 5);  // half a header
    if (i % 3 == 2) {
      ASSERT_TRUE(idle.back().Send(kHello, {}).ok());  // hello, then silence
    }
  }

  const absl::Time start = absl::Now();
  Channel client = Connect();
  ASSERT_TRUE(client.Send(kHello, {}).ok());
  auto config = client.Receive(kTimeout);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->type, kConfig);
  ASSERT_TRUE(client.Send(kJoin, {9, 8, 7}).ok());
  auto welcome = client.Receive(kTimeout);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(welcome->type, kWelcome);
  EXPECT_EQ(welcome->payload, (std::vector<uint8_t>{9, 8, 7}));
  EXPECT_LT(took, kPrompt) << "a join next to " << kIdleConnections << " idle connections";
  ASSERT_TRUE(joined.WaitForNotificationWithTimeout(kTimeout));
  stop.Notify();
  server.join();
  // The flood was really pending at the time, not refused or timed out.
  EXPECT_EQ(pending_at_join.load(), static_cast<size_t>(kIdleConnections + 1));
  // The released connection is the client's.
  ASSERT_TRUE(client.Send(kHello, {5}).ok());
  auto after = released.Receive(kTimeout);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->payload, (std::vector<uint8_t>{5}));
}

TEST_F(PendingConnectionsTest, HalfAFrameThenSilenceTimesOutAtItsDeadlineAndNothingElse) {
  constexpr absl::Duration kFirstMessage = absl::Milliseconds(200);
  PendingOptions options;
  options.first_message_timeout = kFirstMessage;
  Start(options);
  // A survivor whose handshake moves on: its first message, then a far deadline.
  Channel survivor = Connect();
  ASSERT_TRUE(survivor.Send(kHello, {}).ok());
  std::optional<Event> hello = EventFrom(LocalName(survivor));
  ASSERT_TRUE(hello.has_value());
  ASSERT_EQ(hello->kind, Kind::kMessage) << hello->status;
  ASSERT_TRUE(set_->SetDeadline(hello->id, absl::Now() + kTimeout).ok());

  const absl::Time start = absl::Now();
  Channel half_header = Connect();
  WriteRaw(half_header, Frame(kJoin, "0123456789"), 5);
  Channel half_payload = Connect();
  WriteRaw(half_payload, Frame(kJoin, "0123456789"), kFrameHeaderBytes + 3);
  Channel silent = Connect();
  for (const auto& [channel, expect] :
       {std::pair{&half_header, "truncated control frame: 5 of 12 bytes"},
        std::pair{&half_payload, "truncated control frame: 3 of 10 bytes"},
        std::pair{&silent, "no control message"}}) {
    std::optional<Event> event = EventFrom(LocalName(*channel));
    ASSERT_TRUE(event.has_value()) << expect;
    const absl::Duration after = absl::Now() - start;
    EXPECT_EQ(event->kind, Kind::kTimedOut) << event->status;
    EXPECT_EQ(event->status.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_NE(event->status.message().find(expect), std::string::npos) << event->status;
    EXPECT_GE(after, kFirstMessage) << "reported before its deadline";
    EXPECT_LT(after, kFirstMessage + kPrompt) << "reported long after its deadline";
  }
  // The set closed them: their peers read the end of the stream.
  uint8_t byte;
  EXPECT_EQ(recv(half_header.fd(), &byte, 1, 0), 0);
  // The survivor is still pending and its handshake goes on.
  EXPECT_EQ(set_->size(), 1u);
  ASSERT_TRUE(survivor.Send(kJoin, {4}).ok());
  std::optional<Event> join = EventFrom(LocalName(survivor));
  ASSERT_TRUE(join.has_value());
  EXPECT_EQ(join->kind, Kind::kMessage) << join->status;
  EXPECT_EQ(join->id, hello->id);
  EXPECT_EQ(join->message.type, kJoin);
}

TEST_F(PendingConnectionsTest, BadFramesAndClosesAreReportedWithTheirCause) {
  constexpr uint32_t kLimit = 1024;
  PendingOptions options;
  options.max_payload = kLimit;
  Start(options);
  struct Case {
    std::vector<uint8_t> bytes;
    Kind kind;
    absl::StatusCode code;
    std::string expect;
  };
  std::vector<uint8_t> mid_frame = Frame(kJoin, std::string(100, 'p'));
  mid_frame.resize(kFrameHeaderBytes + 10);
  const std::vector<Case> cases = {
      {Header(0xdeadbeef, kControlVersion, kHello, 0), Kind::kError, absl::StatusCode::kDataLoss,
       "magic 0xdeadbeef"},
      {Header(kControlMagic, kControlVersion + 1, kHello, 0), Kind::kError,
       absl::StatusCode::kDataLoss, "version 2"},
      {Header(kControlMagic, kControlVersion, kHello, kLimit + 1), Kind::kError,
       absl::StatusCode::kDataLoss, "claims 1025 payload bytes, the limit is 1024"},
      {mid_frame, Kind::kError, absl::StatusCode::kDataLoss, "peer closed after 10 of 100"},
      {std::vector<uint8_t>(mid_frame.begin(), mid_frame.begin() + 7), Kind::kError,
       absl::StatusCode::kDataLoss, "peer closed after 7 of 12"},
      {{}, Kind::kClosed, absl::StatusCode::kUnavailable, "closed by the peer"},
  };
  for (const Case& c : cases) {
    Channel peer = Connect();
    const std::string name = LocalName(peer);
    WriteRaw(peer, c.bytes, c.bytes.size());
    peer = Channel(-1);  // closes: the bad frames are reported before the close is seen
    std::optional<Event> event = EventFrom(name);
    ASSERT_TRUE(event.has_value()) << c.expect;
    EXPECT_EQ(event->kind, c.kind) << event->status;
    EXPECT_EQ(event->status.code(), c.code) << event->status;
    EXPECT_NE(event->status.message().find(c.expect), std::string::npos) << event->status;
  }
  EXPECT_EQ(set_->size(), 0u);
}

// Release hands over a working Channel and loses nothing: a message the peer sent right behind
// the last one is read by the Channel.
TEST_F(PendingConnectionsTest, ReleaseHandsOverAWorkingChannelWithoutLosingBytes) {
  Start();
  Channel client = Connect();
  std::vector<uint8_t> both = Frame(kJoin, "join");
  const std::vector<uint8_t> next = Frame(kHello, "after");
  both.insert(both.end(), next.begin(), next.end());
  WriteRaw(client, both, both.size());  // one segment: both messages arrive together
  std::optional<Event> join = EventFrom(LocalName(client));
  ASSERT_TRUE(join.has_value());
  ASSERT_EQ(join->kind, Kind::kMessage) << join->status;
  EXPECT_EQ(join->message.type, kJoin);
  EXPECT_EQ(std::string(join->message.payload.begin(), join->message.payload.end()), "join");
  ASSERT_TRUE(set_->Send(join->id, kWelcome, {1}).ok());
  auto channel = set_->Release(join->id);
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_EQ(set_->size(), 0u);
  EXPECT_EQ(set_->Release(join->id).status().code(), absl::StatusCode::kNotFound);

  auto second = channel->Receive(kTimeout);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->type, kHello);
  EXPECT_EQ(std::string(second->payload.begin(), second->payload.end()), "after");
  auto welcome = client.Receive(kTimeout);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(welcome->type, kWelcome);
  // Blocking again: a large message goes out whole while the peer reads it.
  const std::vector<uint8_t> big(kMaxControlPayload, 0x5a);
  std::thread reader([&] {
    auto got = client.Receive(kTimeout);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->payload, big);
  });
  EXPECT_TRUE(channel->Send(kWelcome, big).ok());
  reader.join();
  EXPECT_FALSE(channel->PeerClosed());
  client = Channel(-1);
  EXPECT_EQ(channel->Receive(kTimeout).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(channel->PeerClosed());
}

TEST_F(PendingConnectionsTest, ReleaseRefusesWhenPartOfANextMessageWasAlreadyRead) {
  Start();
  Channel client = Connect();
  std::vector<uint8_t> bytes = Frame(kJoin, "join");
  const std::vector<uint8_t> next = Frame(kHello, "after");
  bytes.insert(bytes.end(), next.begin(), next.begin() + 3);
  WriteRaw(client, bytes, bytes.size());  // one segment
  std::optional<Event> join = EventFrom(LocalName(client));
  ASSERT_TRUE(join.has_value());
  ASSERT_EQ(join->kind, Kind::kMessage) << join->status;
  // The next Wait reads the 3 bytes (they arrived with the message): no event for them.
  std::vector<Event> events;
  set_->Wait(kPoll, &events);
  EXPECT_TRUE(events.empty());
  auto channel = set_->Release(join->id);
  EXPECT_EQ(channel.status().code(), absl::StatusCode::kFailedPrecondition) << channel.status();
  EXPECT_NE(channel.status().message().find("3 bytes of a next control message"), std::string::npos)
      << channel.status();
  EXPECT_EQ(set_->size(), 0u);
}

TEST_F(PendingConnectionsTest, AtTheCapTheOldestPendingConnectionMakesRoom) {
  constexpr size_t kCap = 3;
  PendingOptions options;
  options.max_pending = kCap;
  Start(options);
  std::vector<Channel> peers;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < kCap; ++i) {  // each says hello so that its id is known
    peers.push_back(Connect());
    ASSERT_TRUE(peers.back().Send(kHello, {}).ok());
    std::optional<Event> hello = EventFrom(LocalName(peers.back()));
    ASSERT_TRUE(hello.has_value());
    ASSERT_EQ(hello->kind, Kind::kMessage) << hello->status;
    ids.push_back(hello->id);
  }
  Channel newest = Connect();
  ASSERT_TRUE(newest.Send(kHello, {}).ok());
  std::optional<Event> evicted = EventFrom(LocalName(peers[0]));
  ASSERT_TRUE(evicted.has_value());
  EXPECT_EQ(evicted->kind, Kind::kEvicted);
  EXPECT_EQ(evicted->id, ids[0]);
  EXPECT_EQ(evicted->status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(evicted->status.message().find("3 control connections pending (the limit)"),
            std::string::npos)
      << evicted->status;
  std::optional<Event> hello = EventFrom(LocalName(newest));
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->kind, Kind::kMessage) << hello->status;
  EXPECT_EQ(set_->size(), kCap);
  uint8_t byte;
  EXPECT_EQ(recv(peers[0].fd(), &byte, 1, 0), 0);  // the evicted peer sees the close
  EXPECT_TRUE(set_->Send(ids[1], kConfig, {}).ok());
  EXPECT_EQ(set_->Send(ids[0], kConfig, {}).code(), absl::StatusCode::kNotFound);
}

// Established sessions (served from the set for good) neither count towards the cap nor get
// evicted: a flood of connections that never say hello displaces only its own kind, and the
// session's next message still arrives.
TEST_F(PendingConnectionsTest, EstablishedSessionsAreNeverEvicted) {
  constexpr size_t kCap = 2;
  PendingOptions options;
  options.max_pending = kCap;
  Start(options);
  Channel session = Connect();
  ASSERT_TRUE(session.Send(kHello, {}).ok());
  std::optional<Event> hello = EventFrom(LocalName(session));
  ASSERT_TRUE(hello.has_value());
  ASSERT_EQ(hello->kind, Kind::kMessage) << hello->status;
  ASSERT_TRUE(set_->Establish(hello->id).ok());
  EXPECT_EQ(set_->Establish(hello->id + 1000).code(), absl::StatusCode::kNotFound);
  std::vector<Channel> flood;
  for (size_t i = 0; i < 4 * kCap; ++i) {
    flood.push_back(Connect());
    ASSERT_TRUE(flood.back().Send(kHello, {}).ok());  // its id, then silence
    std::optional<Event> e = EventFrom(LocalName(flood.back()));
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->kind, Kind::kMessage);
  }
  // The flood's oldest were evicted, the session never.
  for (size_t i = 0; i + kCap < flood.size(); ++i) {
    std::optional<Event> evicted = EventFrom(LocalName(flood[i]));
    ASSERT_TRUE(evicted.has_value()) << i;
    EXPECT_EQ(evicted->kind, Kind::kEvicted) << i;
  }
  EXPECT_EQ(set_->size(), kCap + 1);
  ASSERT_TRUE(session.Send(kJoin, {}).ok());
  std::optional<Event> join = EventFrom(LocalName(session));
  ASSERT_TRUE(join.has_value());
  EXPECT_EQ(join->kind, Kind::kMessage) << join->status;
  EXPECT_EQ(join->message.type, kJoin);
  EXPECT_TRUE(set_->Send(hello->id, kWelcome, {}).ok());
}

// Send never blocks the thread on a peer that does not read: it fails at once and the
// connection is dropped.
TEST_F(PendingConnectionsTest, SendToAPeerThatDoesNotReadFailsAtOnce) {
  Start();
  Channel client = Connect();
  const int small = 4096;  // the peer's receive window stays small
  ASSERT_EQ(setsockopt(client.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
  ASSERT_TRUE(client.Send(kHello, {}).ok());
  std::optional<Event> hello = EventFrom(LocalName(client));
  ASSERT_TRUE(hello.has_value());
  ASSERT_EQ(hello->kind, Kind::kMessage) << hello->status;
  // Loopback buffers take a few MiB before the sender's socket is full.
  constexpr int kMaxSends = 64;
  const std::vector<uint8_t> big(kMaxControlPayload, 1);
  const absl::Time start = absl::Now();
  absl::Status sent;
  int sends = 0;
  while (sent.ok() && sends < kMaxSends) {
    sent = set_->Send(hello->id, kConfig, big);
    ++sends;
  }
  EXPECT_LT(absl::Now() - start, kPrompt) << sends << " sends";
  EXPECT_EQ(sent.code(), absl::StatusCode::kDeadlineExceeded) << sent;
  EXPECT_NE(sent.message().find("not reading"), std::string::npos) << sent;
  EXPECT_EQ(set_->size(), 0u);
  EXPECT_EQ(set_->Send(hello->id, kConfig, {}).code(), absl::StatusCode::kNotFound);
}

TEST_F(PendingConnectionsTest, OptionsOutOfRangeAreRefused) {
  auto listener = Listener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  PendingOptions no_room;
  no_room.max_pending = 0;
  EXPECT_EQ(PendingConnections::Create(&*listener, no_room).status().code(),
            absl::StatusCode::kInvalidArgument);
  PendingOptions too_big;
  too_big.max_payload = kMaxControlPayload + 1;
  EXPECT_EQ(PendingConnections::Create(&*listener, too_big).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PendingConnections::Create(nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace transport::control
