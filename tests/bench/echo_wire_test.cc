// The echo baseline's setup messages: round trips, truncation and bad configurations are errors.
#include "bench/echo/echo_wire.h"

#include "gtest/gtest.h"

namespace bench::echo {
namespace {

TEST(EchoWire, HelloAndWelcomeRoundTrip) {
  Hello hello;
  hello.clients = 7;
  hello.ud.qp_num = 11;
  hello.request.qp_num = 12;
  hello.request.gid[3] = 9;
  absl::StatusOr<Hello> h = DecodeHello(Encode(hello));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->clients, 7u);
  EXPECT_EQ(h->ud.qp_num, 11u);
  EXPECT_EQ(h->request.qp_num, 12u);
  EXPECT_EQ(h->request.gid[3], 9);

  Welcome welcome;
  welcome.config.window = 8;
  welcome.config.request_bytes = 80;
  welcome.first_client = 3;
  welcome.region_addr = 0x1234;
  welcome.region_rkey = 99;
  welcome.request.qp_num = 5;
  absl::StatusOr<Welcome> w = DecodeWelcome(Encode(welcome));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->config.window, 8u);
  EXPECT_EQ(w->config.request_bytes, 80u);
  EXPECT_EQ(w->first_client, 3u);
  EXPECT_EQ(w->region_addr, 0x1234u);
  EXPECT_EQ(w->region_rkey, 99u);
  EXPECT_EQ(w->request.qp_num, 5u);
}

TEST(EchoWire, TruncatedOrPaddedMessagesAreErrors) {
  std::vector<uint8_t> bytes = Encode(Welcome{});
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<long>(n));
    EXPECT_FALSE(DecodeWelcome(cut).ok()) << "decoded from " << n << " bytes";
  }
  bytes.push_back(0);
  EXPECT_FALSE(DecodeWelcome(bytes).ok());
  std::vector<uint8_t> hello = Encode(Hello{});
  hello.pop_back();
  EXPECT_FALSE(DecodeHello(hello).ok());
}

TEST(EchoWire, AWelcomeWithAnImpossibleConfigIsRejected) {
  Welcome welcome;
  welcome.config.request_bytes = 4096;  // larger than its slot
  EXPECT_EQ(DecodeWelcome(Encode(welcome)).status().code(), absl::StatusCode::kDataLoss);
  welcome = Welcome{};
  welcome.config.window = 0;
  EXPECT_FALSE(DecodeWelcome(Encode(welcome)).ok());
}

TEST(EchoWire, ValidateNamesTheConflict) {
  EchoConfig config;
  config.response_bytes = 4096 + 8;
  absl::Status s = Validate(config, 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("MTU"), std::string::npos) << s;
  config = EchoConfig{};
  config.sq_depth = 8;
  s = Validate(config, 4096);
  EXPECT_NE(s.message().find("--sq_depth"), std::string::npos) << s;
  EXPECT_TRUE(Validate(EchoConfig{}, 4096).ok());
}

}  // namespace
}  // namespace bench::echo
