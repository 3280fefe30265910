// Large values end to end (Config::large_values(); docs/architecture.md, "Large values"): server
// in a forked process, clients here, on the shm fabric (synchronous and asynchronous). Values
// from 0 B to 1 MiB under every request/response verb pair, checked against the model; the
// out-of-line paths are shown taken (client and server counters), and a GET whose item keeps
// being overwritten falls back to a copy and still returns the exact value.
#include <signal.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "herd/worker.h"
#include "mica/item.h"
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
  // Nothing overwrites items here (the log holds every value written): every READ verifies.
  EXPECT_EQ(stats.item_rereads, 0u);
  EXPECT_EQ(stats.copied_gets, 0u);
}

// The same on the asynchronous fabric: WRs execute after post_send returns, so a landing
// buffer's staging, a READ buffer and a landing buffer read back are all used only once their
// WR completed.
// In both modes: store mode's items are slab blocks (large values: page runs) READ at their pool
// offsets.
TEST(LargeValues, ValuesUpToOneMebibyteMatchTheModelOnTheAsynchronousFabric) {
  for (const mica::StoreMode mode : {mica::StoreMode::kCache, mica::StoreMode::kStore}) {
    SCOPED_TRACE(mica::StoreModeName(mode));
    const std::string fabric = "large-async-model-" + std::string(mica::StoreModeName(mode));
    ServerOptions options = LargeServer(fabric);
    options.device.shm_async = true;
    options.store.mode = mode;
    options.store.pool_bytes = uint64_t{32} << 20;
    ServerProcess server(options);
    ASSERT_TRUE(server.ok());
    ClientOptions client_options;
    client_options.server = server.address();
    client_options.clients = 2;
    client_options.device.fabric = fabric;
    client_options.device.shm_async = true;
    auto client = Client::Connect(client_options);
    ASSERT_TRUE(client.ok()) << client.status();
    RunModelWorkload(**client, 300, 16, 11, /*large_values=*/true);
    EXPECT_GT((*client)->stats().large_puts, 0u);
    EXPECT_GT((*client)->stats().out_of_line_gets, 0u);
    EXPECT_EQ((*client)->stats().item_rereads, 0u);
  }
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

// A value the writer below can be recognised by: [key index, writer count, size] then bytes
// derived from them. A torn or spliced copy fails Recognise.
std::string Pattern(uint32_t key, uint64_t n, uint32_t bytes) {
  std::string v(bytes, '\0');
  const uint64_t head[3] = {key, n, bytes};
  std::memcpy(v.data(), head, std::min<size_t>(sizeof(head), bytes));
  uint64_t x = (n + 1) * 0x9E3779B97F4A7C15ULL ^ key;
  for (uint32_t i = sizeof(head); i < bytes; ++i) {
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    v[i] = static_cast<char>(x >> 56);
  }
  return v;
}
bool Recognise(uint32_t key, std::string_view value) {
  uint64_t head[3];
  if (value.size() < sizeof(head)) return false;
  std::memcpy(head, value.data(), sizeof(head));
  return head[0] == key && head[2] == value.size() && Pattern(key, head[1], value.size()) == value;
}

// The tearing test: one client overwrites a small log with large values as fast as it can while
// another GETs them with slow, chunked READs (the shm fabric's slow-read fault pauses between
// pieces of every READ), so items are often overwritten under a READ. Every value delivered must
// be one the writer wrote, whole: a torn copy is caught by the item check and read again, and a
// GET that keeps losing the race gets a copy through the worker.
// In store mode the same workload frees and reuses blocks under the READs instead: a value whose
// size changes moves to a new block and frees the old one, which another key's move takes (and
// a same-size overwrite rewrites its block in place). No GET may miss there (nothing is lost).
class Tearing : public ::testing::TestWithParam<mica::StoreMode> {};

TEST_P(Tearing, ReadsOfItemsOverwrittenMidReadDeliverOnlyWholeValues) {
  constexpr uint32_t kKeys = 4;
  constexpr uint32_t kMaxValue = 64 << 10;
  constexpr int kGets = 100;
  const mica::StoreMode mode = GetParam();
  const std::string fabric = "large-tearing-" + std::string(mica::StoreModeName(mode));
  ServerOptions options = SmallServer(fabric);
  options.config.workers = 1;
  options.config.max_value_bytes = kMaxValue;
  options.store.max_value_bytes = kMaxValue;
  options.store.log_bytes = 256 << 10;  // about 8 values per lap
  options.store.mode = mode;
  options.store.pool_bytes = 512 << 10;  // a few values' worth: freed blocks are soon reused
  options.store.try_hugepages = false;   // 2 MiB pages would round the pool (and log) up
  ServerProcess server(options);
  ASSERT_TRUE(server.ok());
  ClientOptions writer_options;
  writer_options.server = server.address();
  writer_options.device.fabric = fabric;
  ClientOptions reader_options = writer_options;
  // 48 ms per READ: several writes land under each, even when the writer runs slowly (a clean-
  // clone CI run, 4 tests on 2 cores, saw a writer at 7 ms per write never lap a 16 ms READ).
  reader_options.device.faults.slow_read_us = 3000;
  auto writer = Client::Connect(writer_options);
  auto reader = Client::Connect(reader_options);
  ASSERT_TRUE(writer.ok() && reader.ok());
  for (uint32_t k = 0; k < kKeys; ++k) {
    ASSERT_TRUE((*writer)->Put(absl::StrCat("k", k), Pattern(k, 0, kMaxValue)).ok());
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writes{0};
  std::thread overwrite([&] {
    uint64_t n = 1;
    while (!stop.load()) {
      const uint32_t k = static_cast<uint32_t>(n % kKeys);
      const uint32_t bytes = kMaxValue / 4 + static_cast<uint32_t>((n * 7919) % (kMaxValue / 2));
      EXPECT_TRUE((*writer)->Put(absl::StrCat("k", k), Pattern(k, n, bytes)).ok());
      writes.fetch_add(1);
      ++n;
    }
  });
  int wrong = 0, missing = 0;
  for (int g = 0; g < kGets; ++g) {
    const uint32_t k = static_cast<uint32_t>(g % kKeys);
    absl::StatusOr<Value> got = (*reader)->Get(absl::StrCat("k", k));
    if (!got.ok()) {
      ++missing;  // the log lapped the key's last item before the GET: a miss, never garbage
      EXPECT_TRUE(absl::IsNotFound(got.status())) << got.status();
      continue;
    }
    if (!Recognise(k, got->value)) ++wrong;
  }
  stop.store(true);
  overwrite.join();
  const ClientStats stats = (*reader)->stats();
  EXPECT_EQ(wrong, 0) << "torn or foreign values delivered";
  EXPECT_GT(stats.out_of_line_gets, 0u);
  EXPECT_GT(stats.item_rereads, 0u)
      << "no READ ever lost the race: the test did not overwrite items under READs";
  RecordProperty("writes", static_cast<int>(writes.load()));
  RecordProperty("item_rereads", static_cast<int>(stats.item_rereads));
  RecordProperty("copied_gets", static_cast<int>(stats.copied_gets));
  RecordProperty("misses", missing);
  if (mode == mica::StoreMode::kStore) {
    EXPECT_EQ(missing, 0) << "store mode lost a key";
  }
}

INSTANTIATE_TEST_SUITE_P(BothModes, Tearing,
                         ::testing::Values(mica::StoreMode::kCache, mica::StoreMode::kStore),
                         [](const ::testing::TestParamInfo<mica::StoreMode>& info) {
                           return std::string(mica::StoreModeName(info.param));
                         });

// Verb economy, from the client's fabric counters: a 1 MiB GET is two round trips (the request
// and its answer naming the item, then one READ) moving at most 1 MiB + 256 B of payload; a
// 1 MiB PUT is one WRITE_WITH_IMM (one round trip with its answer).
TEST(LargeValues, AMebibyteGetIsTwoRoundTripsAndAPutOne) {
  constexpr uint64_t kResponseBytes = kResponseHeaderBytes + sizeof(ValueDescriptor);
  ServerProcess server(LargeServer("large-economy"));
  ASSERT_TRUE(server.ok());
  // Counting WRs needs no retransmission in between: a timeout far above any round trip here
  // (a 1 MiB copy on a loaded 2-core machine under ASan can take longer than the default 5 ms).
  ClientOptions options;
  options.server = server.address();
  options.device.fabric = "large-economy";
  options.adaptive_retry = false;
  options.retry_timeout = absl::Seconds(5);
  auto connected = Client::Connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status();
  Client* client = connected->get();
  const std::string value = Pattern(0, 1, kMiB);
  transport::CounterSnapshot before = client->stats().fabric;
  ASSERT_TRUE(client->Put("economy", value).ok());
  transport::CounterSnapshot after = client->stats().fabric;
  EXPECT_EQ(after.wrs - before.wrs, 1u) << "a large PUT is one WRITE_WITH_IMM";
  EXPECT_LE(after.bytes - before.bytes, uint64_t{kMiB} + 256);
  before = after;
  auto got = client->Get("economy");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->value == value);
  after = client->stats().fabric;
  EXPECT_EQ(after.wrs - before.wrs, 2u) << "a large GET is its request and one READ";
  // What the client sent and READ, plus the answer it received.
  EXPECT_LE(after.bytes - before.bytes + kResponseBytes, uint64_t{kMiB} + 256);
  EXPECT_EQ(client->stats().item_rereads, 0u);
}

// Keys of 1 to 256 bytes, binary (NUL and 0xff included), on every request path (slot WRITE,
// UD SEND, landing WRITE_WITH_IMM) with inline and out-of-line values, every operation.
TEST(LargeValues, KeysFromOneTo256BinaryBytesWorkOnEveryPath) {
  const std::vector<Verbs> pairs = {{RequestVerb::kUcWrite, ResponseVerb::kUdSend},
                                    {RequestVerb::kUdSend, ResponseVerb::kUdSend},
                                    {RequestVerb::kRcWrite, ResponseVerb::kRcWrite}};
  for (const auto& [request, response] : pairs) {
    SCOPED_TRACE(absl::StrFormat("%s -> %s", Name(request), Name(response)));
    const std::string fabric = absl::StrFormat("keys-%d-%d", request, response);
    ServerOptions options = LargeServer(fabric);
    options.config.request_verb = request;
    options.config.response_verb = response;
    options.config.max_key_bytes = 256;
    // 128-byte values inline with the longest key.
    options.config.slot_bytes = kRequestHeaderMaxBytes + 256 + 128;
    ServerProcess server(options);
    ASSERT_TRUE(server.ok());
    auto client = Join(server, fabric);
    ASSERT_NE(client, nullptr);
    ASSERT_EQ(client->config().inline_limit(), 128u);
    for (const size_t key_bytes : {size_t{1}, size_t{2}, size_t{255}, size_t{256}}) {
      for (const uint32_t value_bytes : {0u, 128u, 129u, 100000u}) {
        std::string key(key_bytes, '\0');
        for (size_t i = 0; i < key_bytes; ++i) {
          key[i] = static_cast<char>(i % 3 == 0 ? 0 : i % 3 == 1 ? 0xff : value_bytes + i);
        }
        SCOPED_TRACE(absl::StrFormat("key %d B, value %d B", key_bytes, value_bytes));
        const std::string value = Pattern(2, key_bytes, value_bytes);
        auto inserted = client->Insert(key, value);
        ASSERT_TRUE(inserted.ok()) << inserted.status();
        EXPECT_TRUE(absl::IsAlreadyExists(client->Insert(key, value).status()));
        auto got = client->Get(key);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_TRUE(got->value == value);
        const std::string other = Pattern(3, key_bytes, value_bytes);
        auto swapped = client->Cas(key, *inserted, other);
        ASSERT_TRUE(swapped.ok()) << swapped.status();
        got = client->Get(key);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_TRUE(got->value == other);
        EXPECT_EQ(got->version, *swapped);
        ASSERT_TRUE(client->Delete(key).ok());
        EXPECT_TRUE(absl::IsNotFound(client->Get(key).status()));
      }
    }
    // One byte more is refused before it is sent, with its name.
    const auto too_long = client->Put(std::string(257, 'k'), "v").status();
    EXPECT_TRUE(absl::StartsWith(too_long.message(), "KEY_TOO_LONG")) << too_long;
  }
}

// max_item_reads = 0: every out-of-line GET is served by a copy through the worker into the
// client's landing buffer (nothing in the shared log is read).
TEST(LargeValues, CopyModeServesEveryLargeGetFromALandingBuffer) {
  ServerProcess server(LargeServer("large-copy"));
  ASSERT_TRUE(server.ok());
  ClientOptions options;
  options.server = server.address();
  options.device.fabric = "large-copy";
  options.max_item_reads = 0;
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  for (const uint32_t bytes : {1000u, 70000u, kMiB}) {
    const std::string value = Pattern(1, bytes, bytes);
    const std::string key = absl::StrCat("copy-", bytes);
    ASSERT_TRUE((*client)->Put(key, value).ok());
    auto got = (*client)->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->value == value);
  }
  EXPECT_EQ((*client)->stats().copied_gets, 3u);
  EXPECT_EQ((*client)->stats().item_rereads, 0u);
}

// Issue 36: Client::Poll never blocks, and a paused server breaks nothing. A large PUT is an RC
// WRITE_WITH_IMM into one of the worker's landing receives; a paused server reposts none, so a
// retransmission meets a receiver not ready. The synchronous shm fabric waited that out inside
// PostSend (up to a second, in the client's Poll) and then failed the WR, breaking the session's
// large-value QP: the PUTs ended SEND_FAILED though the server came back. Now the WR waits on
// the fabric's progress thread, as on a NIC, and lands once the server runs again.
TEST(LargeValues, AServerPausedUnderLargePutsLeavesTheClientWhole) {
  ServerOptions options = LargeServer("large-paused");
  options.config.workers = 1;
  ServerProcess server(options);
  ASSERT_TRUE(server.ok());
  const uint32_t landing = options.config.landing_buffers;
  // Every 5 ms, no backoff, and a deadline past the test's: the retransmissions that exhaust
  // the receives come within milliseconds however slow the warm-up made the adaptive timer (an
  // ASan build's RTTs grew it to where the 10 s request deadline ended both PUTs first).
  ClientOptions client_options;
  client_options.server = server.address();
  client_options.clients = landing;
  client_options.device.fabric = "large-paused";
  client_options.retry_timeout = absl::Milliseconds(5);
  client_options.adaptive_retry = false;
  client_options.max_attempts = 10'000;
  client_options.request_deadline = absl::Minutes(5);
  auto connected = Client::Connect(client_options);
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::unique_ptr<Client> client = *std::move(connected);
  const std::string value(64 << 10, 'p');  // out of line: a WRITE_WITH_IMM
  ASSERT_TRUE(client->Put("warm", value).ok());
  ASSERT_TRUE(server.Pause());
  // PUTs in every landing buffer: they and their first retransmissions take the receives the
  // worker keeps posted; the later ones find none.
  for (uint32_t c = 0; c < landing; ++c) {
    const std::string key = absl::StrCat("paused-", c);
    ASSERT_TRUE(client->CanSubmit(c, Client::HashKey(key), value.size()));
    ASSERT_TRUE(client->Submit(c, Op::kPut, key, value, 0, c).ok());
  }
  std::vector<Result> results(landing);
  size_t delivered = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  // Past the receives the worker keeps posted: at least one WR met a receiver not ready.
  const uint32_t receives = LargeReceiveDepth(client->config());
  while (client->stats().retransmissions < receives && absl::Now() < give_up) {
    delivered += client->Poll(absl::MakeSpan(results).subspan(delivered));
  }
  ASSERT_GE(client->stats().retransmissions, receives) << "too few retransmissions to RNR";
  ASSERT_TRUE(server.Resume());
  while (delivered < landing && absl::Now() < give_up) {
    delivered += client->Poll(absl::MakeSpan(results).subspan(delivered));
  }
  ASSERT_EQ(delivered, landing);
  for (const Result& r : results) {
    EXPECT_EQ(r.status, Status::kOk) << "PUT " << r.tag << ": " << ResultError(r);
  }
  EXPECT_EQ(client->stats().send_failed, 0u);
  const auto after = client->Put("after", value);
  ASSERT_TRUE(after.ok()) << "the large-value path broke: " << after.status();
  auto got = client->Get("paused-0");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->value == value);
}

// Issue 15's NO_MEMORY, landing buffers: a server may provision landing buffers for less than
// its largest value (--landing_value_bytes). A PUT/CAS/INSERT whose request does not fit one
// fails at the client, NO_MEMORY naming both sizes, before anything is sent; what fits (a
// shorter key leaves room for a longer value) goes through.
TEST(LargeValues, ARequestLongerThanTheLandingBuffersIsNoMemoryAndNeverSent) {
  constexpr uint32_t kLandingValue = 8192;
  ServerOptions options = LargeServer("large-landing-small");
  options.config.landing_value_bytes = kLandingValue;
  ServerProcess server(options);
  ASSERT_TRUE(server.ok());
  auto client = Join(server, "large-landing-small");
  ASSERT_NE(client, nullptr);
  const Config& c = client->config();
  ASSERT_EQ(c.landing_value_limit(), kLandingValue);
  const std::string long_key(c.max_key_bytes, 'k');
  const uint64_t landing = c.landing_bytes();
  // Sized for the longest request of that value: a CAS's (its expected version travels).
  ASSERT_EQ(landing, RequestBytes(Op::kCas, c.max_key_bytes, kLandingValue));
  absl::StatusOr<uint64_t> version = client->Put(long_key, std::string(kLandingValue, 'a'));
  ASSERT_TRUE(version.ok()) << version.status();
  ASSERT_TRUE(client->Cas(long_key, *version, std::string(kLandingValue, 'a')).ok())
      << "fits exactly";
  const ClientStats before = client->stats();
  // One word more than the value limit: over it for every op (a PUT's header is a word shorter).
  const std::string over(kLandingValue + kWireAlign + 1, 'b');
  const absl::Status put = client->Put(long_key, over).status();
  const absl::Status cas = client->Cas(long_key, 1, over).status();
  const absl::Status insert = client->Insert(long_key, over).status();
  for (const auto& [op, s] : {std::pair{Op::kPut, put}, {Op::kCas, cas}, {Op::kInsert, insert}}) {
    const uint64_t request = RequestBytes(op, c.max_key_bytes, static_cast<uint32_t>(over.size()));
    ASSERT_GT(request, landing);
    EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), "NO_MEMORY")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat(request, "-byte request"))) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat(landing, "-byte landing"))) << s;
  }
  const ClientStats after = client->stats();
  EXPECT_EQ(after.submitted, before.submitted);
  EXPECT_EQ(after.fabric.wrs, before.fabric.wrs) << "a refused request sent something";
  // A batch: the refused item fails alone, the others are stored.
  const std::vector<absl::StatusOr<uint64_t>> batch =
      client->MultiPut({{"batch-1", "small"}, {long_key, over}, {"batch-2", "small"}});
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_TRUE(batch[0].ok()) << batch[0].status();
  EXPECT_TRUE(absl::StartsWith(batch[1].status().message(), "NO_MEMORY")) << batch[1].status();
  EXPECT_TRUE(batch[2].ok()) << batch[2].status();
  // The buffer bounds the request, not the value: a 1-byte key leaves room for more value.
  const std::string more(kLandingValue + Pad8(c.max_key_bytes) - 8, 'c');
  ASSERT_LE(RequestBytes(Op::kPut, 1, static_cast<uint32_t>(more.size())), landing);
  ASSERT_TRUE(client->Put("s", more).ok());
  auto got = client->Get("s");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->value == more);
  // The value as stored before the refusals.
  got = client->Get(long_key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value, std::string(kLandingValue, 'a'));
}

// Issue 15's NO_MEMORY, log: a worker whose log is shorter than the largest value's item answers
// NO_MEMORY to a write of such an item, stores nothing and evicts nothing; what fits is stored.
TEST(LargeValues, AnItemLongerThanTheLogIsNoMemoryAndChangesNothing) {
  ServerOptions options = LargeServer("large-small-log");
  options.store.log_bytes = kMiB;  // a 1 MiB value's item (header, key, checksum) is longer
  ServerProcess server(options);
  ASSERT_TRUE(server.ok());
  auto client = Join(server, "large-small-log");
  ASSERT_NE(client, nullptr);
  ASSERT_EQ(client->config().value_limit(), kMiB);
  const std::string kept = Pattern(3, 1, 5000);
  auto stored = client->Put("kept", kept);
  ASSERT_TRUE(stored.ok()) << stored.status();
  const std::string whole(kMiB, 'w');
  const absl::Status put = client->Put("big", whole).status();
  const absl::Status overwrite = client->Put("kept", whole).status();
  const absl::Status cas = client->Cas("kept", *stored, whole).status();
  const absl::Status insert = client->Insert("big", whole).status();
  for (const absl::Status& s : {put, overwrite, cas, insert}) {
    EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), "NO_MEMORY: the worker has no room")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "--mica_log_bytes")) << s;
  }
  EXPECT_TRUE(absl::IsNotFound(client->Get("big").status()));
  auto got = client->Get("kept");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->version, *stored);
  EXPECT_TRUE(got->value == kept);
  // Half the log fits.
  const std::string half = Pattern(4, 1, kMiB / 2);
  ASSERT_TRUE(client->Put("half", half).ok());
  got = client->Get("half");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->value == half);
}

// Issue 15's INTERNAL: an item in a worker's own log that fails its checksum (damaged memory,
// done here by the test) is never delivered: the copy the worker makes for a GET answers
// INTERNAL, counted in the server's stats; a client that READs the item itself finds it
// damaged, re-reads, falls back to the copy, and gets INTERNAL too.
TEST(LargeValues, ADamagedItemInTheLogIsInternalNeverDelivered) {
  ServerOptions options = LargeServer("large-damaged");
  options.config.workers = 1;  // the first item written lies at ring position 0
  std::unique_ptr<Server> server = StartInProcess(options);
  ASSERT_NE(server, nullptr);
  ClientOptions copy_options;
  copy_options.server = absl::StrFormat("127.0.0.1:%d", server->port());
  copy_options.device.fabric = "large-damaged";
  copy_options.max_item_reads = 0;  // every large GET is a copy through the worker
  auto copying = Client::Connect(copy_options);
  ASSERT_TRUE(copying.ok()) << copying.status();
  ClientOptions read_options = copy_options;
  read_options.max_item_reads = 2;
  auto reading = Client::Connect(read_options);
  ASSERT_TRUE(reading.ok()) << reading.status();
  const std::string key = "damaged";
  const std::string value = Pattern(5, 1, 4000);
  ASSERT_TRUE((*copying)->Put(key, value).ok());
  ASSERT_TRUE((*copying)->Get(key).ok());
  // One value byte flipped in the log, as failing memory would.
  uint8_t* item = server->PartitionForTest(0).region().ring();
  ASSERT_EQ(std::memcmp(item + sizeof(mica::ItemHeader) + key.size(), value.data(), 64), 0)
      << "the item is not at ring position 0";
  item[sizeof(mica::ItemHeader) + key.size() + 2000] ^= 0x01;
  for (Client* client : {copying->get(), reading->get()}) {
    const absl::StatusOr<Value> got = client->Get(key);
    EXPECT_TRUE(absl::IsInternal(got.status())) << got.status();
    EXPECT_TRUE(absl::StartsWith(got.status().message(), "INTERNAL")) << got.status();
  }
  EXPECT_EQ((*reading)->stats().item_rereads, 2u) << "its own READs found the item damaged";
  EXPECT_EQ(server->Stats().internal_errors, 2u);
  // The worker is fine: other keys are served.
  ASSERT_TRUE((*copying)->Put("healthy", value).ok());
  auto healthy = (*copying)->Get("healthy");
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  EXPECT_TRUE(healthy->value == value);
}

// A copy request rewrites a GET's staged bytes (flags, landing buffer, checksum). With
// non-inline requests on a fabric slower than the retransmission timeout, retransmissions of the
// GET (the same bytes, while a WR still reads them) are pending when its out-of-line answer
// comes: the rewrite must wait for them. Rewritten under them, the copy request went out with
// their attempt number (a duplicate to the worker) and, every 5 ms retransmission keeping the
// buffer busy for 50 ms, never as a new attempt: the GET timed out.
TEST(LargeValues, ACopyRequestWaitsForTheWrsThatStillReadTheGet) {
  constexpr uint32_t kSlowWrUs = 50'000;  // every client WR executes 50 ms after its post
  constexpr absl::Duration kRetry = absl::Milliseconds(5);
  ServerOptions server_options = LargeServer("large-copy-pending");
  server_options.config.use_inline = false;  // the client's requests too: read at execution
  ServerProcess server(server_options);
  ASSERT_TRUE(server.ok());
  ClientOptions options;
  options.server = server.address();
  options.device.fabric = "large-copy-pending";
  options.device.faults.delay_us = kSlowWrUs;
  options.retry_timeout = kRetry;
  options.adaptive_retry = false;
  options.max_item_reads = 0;  // an out-of-line answer asks for a copy at once
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string value = Pattern(2, 1, 4000);
  ASSERT_TRUE((*client)->Put("copy-pending", value).ok());
  const uint64_t retransmitted = (*client)->stats().retransmissions;
  auto got = (*client)->Get("copy-pending");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->value == value);
  EXPECT_EQ((*client)->stats().copied_gets, 1u);
  EXPECT_GT((*client)->stats().retransmissions, retransmitted)
      << "no retransmission of the GET was pending when its answer came";
}

}  // namespace
}  // namespace herd::testing
