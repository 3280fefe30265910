// herd end to end, server and clients in separate processes on the shm fabric: every request
// verb x response verb x store mode under a randomized GET/PUT/DELETE/CAS workload checked
// against a model; store mode filled to NO_MEMORY; hostile slot bytes; injected loss; a client
// killed mid-run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <tuple>

#include "absl/strings/str_format.h"
#include "mica/keyhash.h"
#include "tests/herd/client_test_peer.h"
#include "tests/herd/model_workload.h"
#include "tests/herd/server_fixture.h"

namespace herd::testing {
namespace {

using Verbs = std::tuple<RequestVerb, ResponseVerb, mica::StoreMode>;

class EveryVerb : public ::testing::TestWithParam<Verbs> {};

TEST_P(EveryVerb, RandomWorkloadMatchesTheModel) {
  const auto [request, response, store_mode] = GetParam();
  const std::string fabric =
      absl::StrFormat("verbs-%d-%d-%s", request, response, mica::StoreModeName(store_mode));
  ServerOptions options = SmallServer(fabric);
  options.store.mode = store_mode;
  options.config.request_verb = request;
  options.config.response_verb = response;
  options.config.postlist = 8;
  options.config.unsig_batch = 8;
  options.config.ud_qps_per_worker = 2;
  ServerProcess server(options);
  ASSERT_TRUE(server.ok());
  auto client = Join(server, fabric, /*clients=*/3);
  ASSERT_NE(client, nullptr);
  RunModelWorkload(*client, 3000, 64, 42);
}

INSTANTIATE_TEST_SUITE_P(
    AllCombinations, EveryVerb,
    ::testing::Combine(
        ::testing::Values(RequestVerb::kUcWrite, RequestVerb::kRcWrite, RequestVerb::kUdSend),
        ::testing::Values(ResponseVerb::kUdSend, ResponseVerb::kUcWrite, ResponseVerb::kRcWrite),
        ::testing::Values(mica::StoreMode::kCache, mica::StoreMode::kStore)),
    [](const ::testing::TestParamInfo<Verbs>& info) {
      return std::string(Name(std::get<0>(info.param))) + "_to_" +
             std::string(Name(std::get<1>(info.param))) + "_" +
             std::string(mica::StoreModeName(std::get<2>(info.param)));
    });

// Store mode at capacity, end to end: PUTs of new keys until the server answers NO_MEMORY (the
// pool is full), then every acknowledged key reads back exactly (none was evicted to make
// room); a refused PUT of an existing key leaves its value; DELETEs make room again.
TEST(Herd, StoreModeFillsToNoMemoryAndLosesNoKey) {
  constexpr uint32_t kValueBytes = 100;
  // A value that needs the next size class up (192 B blocks, not 160 B) and still travels inline.
  constexpr uint32_t kBiggerValueBytes = 150;
  ServerOptions options = SmallServer("store-full");
  options.config.workers = 1;
  options.store.mode = mica::StoreMode::kStore;
  options.store.pool_bytes = 256 << 10;  // a few thousand 100 B values
  options.store.try_hugepages = false;   // 2 MiB pages would round the pool up 8x
  std::unique_ptr<Server> server = StartInProcess(options);
  ASSERT_NE(server, nullptr);
  ClientOptions client_options;
  client_options.server = absl::StrCat("127.0.0.1:", server->port());
  client_options.device.fabric = "store-full";
  auto client = Client::Connect(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  const auto value_of = [](uint32_t k, uint32_t bytes) {
    return std::string(bytes, static_cast<char>('a' + k % 26));
  };
  std::vector<uint64_t> versions;
  absl::Status refusal;
  for (uint32_t k = 0; k < 100000; ++k) {
    absl::StatusOr<uint64_t> put = (*client)->Put(absl::StrCat("key", k), value_of(k, kValueBytes));
    if (!put.ok()) {
      refusal = put.status();
      break;
    }
    versions.push_back(*put);
  }
  ASSERT_TRUE(absl::IsResourceExhausted(refusal)) << refusal;
  ASSERT_GT(versions.size(), 1000u);
  // The class of those items may need more pages per span than are left: fill the rest with
  // items of the smallest class (one-page spans) until no page is left at all.
  uint32_t small_keys = 0;
  while ((*client)->Put(absl::StrCat("small", small_keys), "s").ok()) ++small_keys;
  // An existing key's PUT that needs a bigger block is refused too; its value stays.
  const absl::Status bigger = (*client)->Put("key0", value_of(0, kBiggerValueBytes)).status();
  EXPECT_TRUE(absl::IsResourceExhausted(bigger)) << bigger;
  for (uint32_t k = 0; k < versions.size(); ++k) {
    absl::StatusOr<Value> got = (*client)->Get(absl::StrCat("key", k));
    ASSERT_TRUE(got.ok()) << "key" << k << ": " << got.status();
    ASSERT_EQ(got->value, value_of(k, kValueBytes)) << "key" << k;
    ASSERT_EQ(got->version, versions[k]) << "key" << k;
  }
  for (uint32_t k = 0; k < small_keys; ++k) {
    absl::StatusOr<Value> got = (*client)->Get(absl::StrCat("small", k));
    ASSERT_TRUE(got.ok() && got->value == "s") << "small" << k << " was lost";
  }
  const ServerStats stats = server->Stats();
  EXPECT_TRUE(stats.store_mode);
  EXPECT_EQ(stats.no_memory, 3u);
  EXPECT_EQ(stats.no_memory_pool, stats.no_memory);
  EXPECT_EQ(stats.evictions[0], 0u);
  // Room again after DELETEs: a new key and the bigger value both fit. (The keys deleted are a
  // run of consecutive PUTs, so whole spans empty and their pages go back to the page heap, where
  // another class finds them; every second key would leave each span half full.)
  for (uint32_t k = 1; k < versions.size() / 2; ++k) {
    ASSERT_TRUE((*client)->Delete(absl::StrCat("key", k)).ok());
  }
  const absl::Status moved = (*client)->Put("key0", value_of(0, kBiggerValueBytes)).status();
  EXPECT_TRUE(moved.ok()) << moved;
  EXPECT_TRUE((*client)->Put("a new key", value_of(1, kValueBytes)).ok());
  const std::string json = StatsJson(server->Stats(), ServerStats{}, 1.0);
  EXPECT_NE(json.find("\"mode\":\"store\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"no_memory_pool\":3"), std::string::npos) << json;
  // Most 100 B values' items (24 B header, 5-8 B keys: key10 on) are 160 B blocks.
  EXPECT_NE(json.find("{\"block\":160,\"used\":"), std::string::npos) << json;
  server->Stop();
}

// On the asynchronous shm fabric (WRs take effect 100 us after their post, buffers read when they
// execute) both sides still answer correctly: no staging buffer is reused before its completion.
TEST(Herd, AnAsynchronousDelayedFabricChangesNoAnswer) {
  constexpr uint32_t kDelayUs = 100;
  const std::vector<std::tuple<RequestVerb, ResponseVerb>> pairs = {
      {RequestVerb::kUcWrite, ResponseVerb::kUdSend},
      {RequestVerb::kUdSend, ResponseVerb::kRcWrite},
      {RequestVerb::kRcWrite, ResponseVerb::kUcWrite}};
  for (const auto& [request, response] : pairs) {
    SCOPED_TRACE(absl::StrFormat("%s -> %s", Name(request), Name(response)));
    const std::string fabric = absl::StrFormat("async-%d-%d", request, response);
    ServerOptions options = SmallServer(fabric);
    options.device.faults.delay_us = kDelayUs;
    options.config.request_verb = request;
    options.config.response_verb = response;
    options.config.postlist = 8;
    options.config.unsig_batch = 8;
    ServerProcess server(options);
    ASSERT_TRUE(server.ok());
    auto client = Join(server, fabric, /*clients=*/3, 0, 0, kDelayUs);
    ASSERT_NE(client, nullptr);
    RunModelWorkload(*client, 1500, 64, 3);
  }
}

TEST(Herd, HostileSlotBytesNeverCrashTheServerNorDisturbOthers) {
  for (RequestVerb verb : {RequestVerb::kUcWrite, RequestVerb::kUdSend}) {
    const std::string fabric = absl::StrFormat("hostile-%d", verb);
    ServerOptions options = SmallServer(fabric);
    options.config.request_verb = verb;
    ServerProcess server(options);
    ASSERT_TRUE(server.ok());
    auto victim = Join(server, fabric, 2);
    auto attacker = Join(server, fabric, 1);
    ASSERT_NE(victim, nullptr);
    ASSERT_NE(attacker, nullptr);
    std::mt19937_64 rng(7);
    const Config& c = attacker->config();
    std::vector<uint8_t> bytes(c.slot_bytes);
    std::vector<Result> drain(16);
    for (int round = 0; round < 2000; ++round) {
      // Random garbage, sometimes with a plausible header carrying lying lengths.
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      const uint32_t length = 1 + static_cast<uint32_t>(rng() % c.slot_bytes);
      if (round % 3 == 0) {
        RequestTrailer h{};
        std::memcpy(&h, bytes.data() + length - std::min<uint32_t>(length, kRequestTrailerBytes),
                    std::min<uint32_t>(length, kRequestTrailerBytes));
        h.op = static_cast<uint8_t>(rng() % 6);
        h.flags = 0;
        if (length >= kRequestTrailerBytes) {
          std::memcpy(bytes.data() + length - kRequestTrailerBytes, &h, sizeof(h));
          // Sometimes signed with the session's key: authentic but lying, so it reaches the
          // field checks instead of being rejected as incomplete.
          const uint64_t need = uint64_t{Pad8(h.key_bytes)} + Pad8(h.value_bytes) +
                                RequestHeaderBytes(static_cast<Op>(h.op), h.flags);
          if (round % 2 == 0 && need <= length && length % kWireAlign == 0) {
            uint8_t* start = bytes.data() + length - need;
            const uint64_t sum =
                WireChecksum(herd::ClientTestPeer::SessionSecret(*attacker), start, need);
            std::memcpy(bytes.data() + length - kChecksumFromEnd, &sum, sizeof(sum));
          }
        }
      }
      const uint32_t worker = static_cast<uint32_t>(rng() % c.workers);
      const uint32_t slot = static_cast<uint32_t>(rng() % c.window);
      ASSERT_TRUE(herd::ClientTestPeer::SendRaw(*attacker, 0, worker, slot,
                                                absl::MakeSpan(bytes.data(), length))
                      .ok());
      attacker->Poll(absl::MakeSpan(drain));  // whatever comes back is not ours: counted stray
    }
    RunModelWorkload(*victim, 1000, 32, 3);
    // The server is still alive and serving after the attack.
    auto fresh = Join(server, fabric, 1);
    ASSERT_NE(fresh, nullptr);
    EXPECT_TRUE(fresh->Put("after", "attack").ok());
  }
}

TEST(Herd, InjectedLossLosesNoAcknowledgedWriteAndAppliesNoneTwice) {
  for (RequestVerb verb : {RequestVerb::kUcWrite, RequestVerb::kUdSend}) {
    const std::string fabric = absl::StrFormat("lossy-%d", verb);
    ServerOptions options = SmallServer(fabric);
    options.config.request_verb = verb;
    options.device.faults.ud_loss = 0.01;  // responses (and UD requests) lost
    ServerProcess server(options);
    ASSERT_TRUE(server.ok());
    auto client = Join(server, fabric, 4, /*ud_loss=*/0.01, /*uc_loss=*/0.01);
    ASSERT_NE(client, nullptr);
    RunModelWorkload(*client, 4000, 64, 11);
    EXPECT_GT(client->stats().retransmissions, 0u) << "1% loss over 4000 requests: none lost?";
  }
}

TEST(Herd, AClientKilledMidRunDoesNotStallTheOthers) {
  const std::string fabric = "killed";
  ServerOptions options = SmallServer(fabric);
  options.config.max_clients = 4;
  ServerProcess server(options);
  ASSERT_TRUE(server.ok());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t victim = fork();
  if (victim == 0) {
    auto client = Join(server, fabric, 2);
    if (client == nullptr) _exit(1);
    std::vector<Result> results(16);
    // Tells the test once it has had this many answers: it is provably mid-run when killed.
    constexpr uint64_t kAnswersBeforeReady = 200;
    uint64_t answered = 0;
    bool told = false;
    for (uint64_t i = 0;; ++i) {  // hammer until killed
      const std::string key = absl::StrFormat("k%d", i % 50);
      if (client->CanSubmit(i % 2, mica::KeyHash(key))) {
        (void)client->Submit(i % 2, Op::kPut, key, "v", 0, i);
      }
      answered += client->Poll(absl::MakeSpan(results));
      if (!told && answered >= kAnswersBeforeReady) {
        char one = 1;
        (void)!write(ready[1], &one, 1);
        told = true;
      }
    }
  }
  char one;
  ASSERT_EQ(read(ready[0], &one, 1), 1) << "the victim never got 200 answers";
  ASSERT_EQ(kill(victim, SIGKILL), 0);  // with requests outstanding
  ASSERT_EQ(waitpid(victim, nullptr, 0), victim);
  auto survivor = Join(server, fabric, 1);
  ASSERT_NE(survivor, nullptr);
  RunModelWorkload(*survivor, 1000, 32, 5);
  // The dead client's ids (0 and 1; the survivor has 2) are given back once it is retired.
  std::unique_ptr<Client> more;
  for (int attempt = 0; attempt < 100 && more == nullptr; ++attempt) {
    ClientOptions o;
    o.server = server.address();
    o.clients = 2;
    o.device.fabric = fabric;
    auto c = Client::Connect(o);
    if (c.ok())
      more = *std::move(c);
    else
      usleep(50 * 1000);
  }
  ASSERT_NE(more, nullptr) << "the killed client's ids were never released";
  EXPECT_TRUE(more->Put("x", "y").ok());
}

// A request send queue that never drains (here: a fabric whose WRs take effect 2 s after their
// post, standing in for a hung NIC) fails the send after ClientOptions::send_queue_timeout,
// instead of hanging the client thread; the failed request leaves no trace.
TEST(Herd, AStuckSendQueueFailsTheSubmitInsteadOfHanging) {
  const std::string fabric = "stuck-send-queue";
  ServerOptions server_options = SmallServer(fabric);
  server_options.config.workers = 1;
  server_options.config.window = 8;
  server_options.config.sq_depth = 64;  // the smallest a 32-WR unsig_batch allows
  ServerProcess server(server_options);
  ASSERT_TRUE(server.ok());
  ClientOptions options;
  options.server = server.address();
  options.clients = 16;  // 16 clients x 8 window: twice the send queue
  options.device.fabric = fabric;
  options.device.faults.delay_us = 2'000'000;
  options.send_queue_timeout = absl::Milliseconds(50);
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status failed;
  uint32_t submitted = 0;
  for (uint32_t c = 0; c < options.clients && failed.ok(); ++c) {
    for (uint32_t i = 0; i < 8 && failed.ok(); ++i) {
      failed = (*client)->Submit(c, Op::kGet, absl::StrCat("k", c, "-", i), "", 0, submitted);
      if (failed.ok()) ++submitted;
    }
  }
  EXPECT_EQ(failed.code(), absl::StatusCode::kDeadlineExceeded) << failed;
  EXPECT_NE(failed.message().find("stuck"), std::string::npos) << failed;
  EXPECT_EQ(submitted, 64u);  // exactly the queue's depth went out
  EXPECT_EQ((*client)->outstanding(), 64u);
}

TEST(Herd, AClientLearnsThatItsServerDied) {
  const std::string fabric = "server-died";
  ServerProcess server(SmallServer(fabric));
  ASSERT_TRUE(server.ok());
  auto client = Join(server, fabric, 1);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("before", "1").ok());
  server.Kill();
  // A request in flight when the server is gone comes back as timed out, soon (not after every
  // retransmission), and the client says why.
  ASSERT_TRUE(client->Submit(0, Op::kGet, "after", "", 0, 7).ok());
  std::vector<Result> results(4);
  size_t got = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (got == 0 && absl::Now() < give_up) got = client->Poll(absl::MakeSpan(results));
  ASSERT_EQ(got, 1u) << "no result for the request in flight";
  EXPECT_EQ(results[0].tag, 7u);
  EXPECT_EQ(results[0].status, Status::kTimedOut);
  EXPECT_EQ(client->health().code(), absl::StatusCode::kUnavailable) << client->health();
  EXPECT_EQ(client->outstanding(), 0u);
  EXPECT_EQ(client->Submit(0, Op::kGet, "after", "", 0, 8).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace herd::testing
