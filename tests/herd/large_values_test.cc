// Large values end to end (Config::large_values(); docs/architecture.md, "Large values"): server
// in a forked process, clients here, on the shm fabric (synchronous and asynchronous). Values
// from 0 B to 1 MiB under every request/response verb pair, checked against the model; the
// out-of-line paths are shown taken (client and server counters), and a GET whose item keeps
// being overwritten falls back to a copy and still returns the exact value.
#include <string>
#include <tuple>

#include "absl/strings/str_format.h"
#include "mica/keyhash.h"
#include "tests/herd/model_workload.h"
#include "tests/herd/server_fixture.h"

namespace herd::testing {
namespace {

constexpr uint32_t kMiB = 1u << 20;

ServerOptions LargeServer(const std::string& fabric) {
  ServerOptions options = SmallServer(fabric);
  options.config.max_value_bytes = kMiB;
  options.store.max_value_bytes = kMiB;
  options.store.log_bytes = uint64_t{32} << 20;  // room for a few dozen 1 MiB items per worker
  return options;
}

using Verbs = std::tuple<RequestVerb, ResponseVerb>;
class LargeValuesEveryVerb : public ::testing::TestWithParam<Verbs> {};

TEST_P(LargeValuesEveryVerb, ValuesUpToOneMebibyteMatchTheModel) {
  const auto [request, response] = GetParam();
  const std::string fabric = absl::StrFormat("large-%d-%d", request, response);
  ServerOptions options = LargeServer(fabric);
  options.config.request_verb = request;
  options.config.response_verb = response;
  ServerProcess server(options);
  ASSERT_TRUE(server.ok());
  auto client = Join(server, fabric, /*clients=*/2);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->config().large_values());
  RunModelWorkload(*client, 400, 24, 7, /*large_values=*/true);
  const ClientStats stats = client->stats();
  EXPECT_GT(stats.large_puts, 0u) << "no PUT went by WRITE_WITH_IMM";
  EXPECT_GT(stats.out_of_line_gets, 0u) << "no GET was answered out of line";
}

INSTANTIATE_TEST_SUITE_P(Pairs, LargeValuesEveryVerb,
                         ::testing::Values(Verbs{RequestVerb::kUcWrite, ResponseVerb::kUdSend},
                                           Verbs{RequestVerb::kUdSend, ResponseVerb::kUdSend},
                                           Verbs{RequestVerb::kRcWrite, ResponseVerb::kRcWrite},
                                           Verbs{RequestVerb::kUcWrite, ResponseVerb::kUcWrite}),
                         [](const ::testing::TestParamInfo<Verbs>& info) {
                           return std::string(Name(std::get<0>(info.param))) + "_to_" +
                                  std::string(Name(std::get<1>(info.param)));
                         });

// A 1 MiB value round-trips exactly, at the inline boundary and one byte past it too, and the
// asynchronous fabric (WRs execute later, buffers read then) changes nothing.
TEST(LargeValues, BoundaryAndMebibyteValuesRoundTripOnBothFabricModes) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "asynchronous" : "synchronous");
    const std::string fabric = async ? "large-async" : "large-sync";
    ServerOptions options = LargeServer(fabric);
    options.device.shm_async = async;
    ServerProcess server(options);
    ASSERT_TRUE(server.ok());
    auto client = Join(server, fabric);
    ASSERT_NE(client, nullptr);
    const uint32_t limit = client->config().inline_limit();
    for (const uint32_t bytes : {limit, limit + 1, kMiB - 1, kMiB}) {
      std::string value(bytes, '\0');
      for (uint32_t i = 0; i < bytes; ++i) value[i] = static_cast<char>((i * 131 + bytes) >> 3);
      const std::string key = absl::StrCat("big-", bytes);
      auto put = client->Put(key, value);
      ASSERT_TRUE(put.ok()) << bytes << ": " << put.status();
      auto got = client->Get(key);
      ASSERT_TRUE(got.ok()) << bytes << ": " << got.status();
      EXPECT_EQ(got->version, *put);
      EXPECT_TRUE(got->value == value) << bytes << " bytes came back different";
    }
    const std::string too_long(kMiB + 1, 'x');
    EXPECT_TRUE(absl::IsOutOfRange(client->Put("too-long", too_long).status()));
    EXPECT_GE(client->stats().large_puts, 3u);
    EXPECT_GE(client->stats().out_of_line_gets, 3u);
  }
}

}  // namespace
}  // namespace herd::testing
