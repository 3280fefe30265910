// Validate refuses every contradiction, each with a message naming the flags in conflict;
// ValidateClientLoad bounds one client thread's outstanding requests; the wire encoding carries
// every field.
#include "herd/config.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "herd/join.h"
#include "herd/protocol.h"
#include "mica/config.h"

namespace herd {
namespace {

constexpr uint32_t kMtu = 4096;

struct Contradiction {
  std::string name;
  std::function<void(Config&)> make;
  std::vector<std::string> flags;  // each must appear in the message
  uint32_t mtu = kMtu;
};

TEST(ConfigTest, DefaultsAreValid) {
  EXPECT_TRUE(Validate(Config{}, kMtu).ok());
  Config ud;
  ud.request_verb = RequestVerb::kUdSend;
  EXPECT_TRUE(Validate(ud, kMtu).ok());
  Config writes;
  writes.response_verb = ResponseVerb::kRcWrite;
  writes.slot_bytes = 8192;  // over the MTU: fine when nothing travels as UD
  EXPECT_TRUE(Validate(writes, kMtu).ok());
}

TEST(ConfigTest, EveryContradictionIsRefusedNamingItsFlags) {
  const std::vector<Contradiction> cases = {
      {"no workers", [](Config& c) { c.workers = 0; }, {"--workers=0"}},
      {"too many workers", [](Config& c) { c.workers = kMaxWorkers + 1; }, {"--workers="}},
      {"no ud qps", [](Config& c) { c.ud_qps_per_worker = 0; }, {"--ud_qps_per_worker=0"}},
      {"too many ud qps",
       [](Config& c) { c.ud_qps_per_worker = kMaxUdQps + 1; },
       {"--ud_qps_per_worker="}},
      {"no window", [](Config& c) { c.window = 0; }, {"--window=0"}},
      {"window too big", [](Config& c) { c.window = kMaxWindow + 1; }, {"--window="}},
      {"no clients", [](Config& c) { c.max_clients = 0; }, {"--max_clients=0"}},
      {"too many clients", [](Config& c) { c.max_clients = kMaxClients + 1; }, {"--max_clients="}},
      {"no postlist", [](Config& c) { c.postlist = 0; }, {"--postlist"}},
      {"no unsig_batch", [](Config& c) { c.unsig_batch = 0; }, {"--unsig_batch"}},
      {"postlist over unsig_batch",
       [](Config& c) {
         c.postlist = 64;
         c.unsig_batch = 32;
       },
       {"--postlist=64", "--unsig_batch=32"}},
      {"sq_depth under two signal intervals",
       [](Config& c) {
         c.unsig_batch = 200;
         c.sq_depth = 399;
       },
       {"--unsig_batch=200", "--sq_depth", "400", "399"}},
      {"no key", [](Config& c) { c.max_key_bytes = 0; }, {"--max_key_bytes=0"}},
      {"key over mica's bound",
       [](Config& c) {
         c.max_key_bytes = mica::kMaxKeyBytes + 1;
         c.slot_bytes = 1024;
       },
       {"--max_key_bytes="}},
      {"slot not a multiple of 8", [](Config& c) { c.slot_bytes = 260; }, {"--slot_bytes=260"}},
      {"slot over the bound",
       [](Config& c) {
         c.slot_bytes = kMaxSlotBytes + 8;
         c.response_verb = ResponseVerb::kUcWrite;
       },
       {"--slot_bytes="}},
      {"slot under header + key",
       [](Config& c) {
         c.max_key_bytes = 16;
         c.slot_bytes = kRequestHeaderMaxBytes + 8;
       },
       {"--slot_bytes=40", "16-byte key"}},
      {"UD response over the MTU",
       [](Config& c) { c.slot_bytes = 4160; },
       {"--slot_bytes=4160", "--response_verb", "4096-byte MTU"}},
      {"UD response over a small MTU",
       [](Config& c) { c.slot_bytes = 1080; },
       {"--slot_bytes=1080", "1024-byte MTU"},
       1024},
      {"UD request over the MTU",
       [](Config& c) {
         c.request_verb = RequestVerb::kUdSend;
         c.response_verb = ResponseVerb::kUcWrite;
         c.slot_bytes = 4104;
       },
       {"--request_verb=ud_send", "--slot_bytes=4104", "4096-byte MTU"}},
      {"receives under postlist",
       [](Config& c) {
         c.request_verb = RequestVerb::kUdSend;
         c.recv_depth = 8;
         c.postlist = 16;
       },
       {"--recv_depth=8", "--postlist=16"}},
      {"landing buffers for inline values only",
       [](Config& c) {
         c.max_value_bytes = 1 << 20;
         c.landing_value_bytes = c.inline_limit();
       },
       {"--landing_value_bytes=", "--max_value_bytes"}},
      {"landing buffers over the largest value",
       [](Config& c) {
         c.max_value_bytes = 1 << 20;
         c.landing_value_bytes = (1 << 20) + 1;
       },
       {"--landing_value_bytes=1048577"}},
  };
  for (const Contradiction& k : cases) {
    Config c;
    k.make(c);
    const absl::Status s = Validate(c, k.mtu);
    ASSERT_FALSE(s.ok()) << k.name;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.name;
    for (const std::string& flag : k.flags) {
      EXPECT_NE(s.message().find(flag), std::string_view::npos)
          << k.name << ": \"" << s.message() << "\" does not name " << flag;
    }
  }
}

TEST(ConfigTest, BoundariesAreAccepted) {
  auto ok = [](auto make) {
    Config c;
    make(c);
    return Validate(c, kMtu);
  };
  EXPECT_TRUE(ok([](Config& c) { c.workers = kMaxWorkers; }).ok());
  EXPECT_TRUE(ok([](Config& c) { c.window = kMaxWindow; }).ok());
  EXPECT_TRUE(ok([](Config& c) { c.max_clients = kMaxClients; }).ok());
  EXPECT_TRUE(ok([](Config& c) { c.ud_qps_per_worker = kMaxUdQps; }).ok());
  EXPECT_TRUE(ok([](Config& c) {
                c.postlist = 32;
                c.unsig_batch = 32;
                c.sq_depth = 64;
              }).ok());
  EXPECT_TRUE(ok([](Config& c) { c.slot_bytes = kRequestHeaderMaxBytes + 16; }).ok());
  for (const uint32_t landing : {Config{}.inline_limit() + 1, 1u << 20}) {
    EXPECT_TRUE(ok([&](Config& c) {
                  c.max_value_bytes = 1 << 20;
                  c.landing_value_bytes = landing;
                }).ok())
        << landing;
  }
  // The largest slot whose UD response fits the MTU.
  Config c;
  c.slot_bytes = kMtu - kResponseHeaderBytes + kRequestHeaderMaxBytes + Pad8(c.max_key_bytes);
  EXPECT_EQ(ResponseBytes(c.slot_value_bytes()), kMtu);
  EXPECT_TRUE(Validate(c, kMtu).ok()) << Validate(c, kMtu);
  c.slot_bytes += kWireAlign;
  EXPECT_FALSE(Validate(c, kMtu).ok());
}

// 0 sizes landing buffers for the largest value; a smaller one sizes them (and their requests)
// for that value, and the clients learn it at join.
TEST(ConfigTest, LandingBuffersAreSizedByLandingValueBytesAndTravelToClients) {
  Config c;
  c.max_value_bytes = 1 << 20;
  EXPECT_EQ(c.landing_value_limit(), 1u << 20);
  EXPECT_EQ(c.landing_bytes(), RequestBytes(Op::kCas, c.max_key_bytes, 1 << 20));
  c.landing_value_bytes = 4096;
  EXPECT_EQ(c.landing_value_limit(), 4096u);
  EXPECT_EQ(c.landing_bytes(), RequestBytes(Op::kCas, c.max_key_bytes, 4096));
  absl::StatusOr<Config> decoded = DecodeConfig(Encode(c));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->landing_value_bytes, 4096u);
  EXPECT_EQ(decoded->landing_bytes(), c.landing_bytes());
  // The decoder still refuses a short or long encoding.
  std::vector<uint8_t> bytes = Encode(c);
  bytes.pop_back();
  EXPECT_FALSE(DecodeConfig(bytes).ok());
  bytes = Encode(c);
  bytes.push_back(0);
  EXPECT_FALSE(DecodeConfig(bytes).ok());
}

// A Hello states the wire format its client speaks: the same round-trips; another (or the old
// 4-byte Hello, format 1) is refused at the join, naming both formats.
TEST(ConfigTest, AHelloOfAnotherWireFormatIsRefused) {
  absl::StatusOr<Hello> same = DecodeHello(Encode(Hello{3}));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->clients, 3u);
  EXPECT_EQ(same->wire_version, kWireVersion);
  const std::vector<uint8_t> old_hello = {3, 0, 0, 0};  // format 1: the client count alone
  for (const std::vector<uint8_t>& bytes : {old_hello, Encode(Hello{3, kWireVersion + 1})}) {
    absl::StatusOr<Hello> other = DecodeHello(bytes);
    ASSERT_FALSE(other.ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(other.status())) << other.status();
    EXPECT_NE(other.status().message().find("rebuild the client"), std::string::npos)
        << other.status();
  }
}

TEST(ConfigTest, ValidateClientLoad) {
  Config c;
  c.workers = 4;
  c.window = 16;
  // 4 x 16 = 64 per client: kMaxClientReceives / 64 clients exactly fit.
  const uint32_t fit = kMaxClientReceives / (c.workers * c.window);
  EXPECT_TRUE(ValidateClientLoad(c, fit).ok());
  const absl::Status s = ValidateClientLoad(c, fit + 1);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& part : {std::string("--clients_per_thread"), std::string("--window"),
                                  std::to_string(fit + 1) + " clients per thread"}) {
    EXPECT_NE(s.message().find(part), std::string_view::npos) << s.message();
  }
  // No overflow with extreme values.
  c.workers = kMaxWorkers;
  c.window = kMaxWindow;
  EXPECT_FALSE(ValidateClientLoad(c, UINT32_MAX).ok());
}

}  // namespace
}  // namespace herd
