#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "mica/keyhash.h"
#include "tests/herd/server_fixture.h"

namespace herd::testing {
namespace {

TEST(Smoke, PutGetDeleteCas) {
  ServerProcess server(SmallServer("smoke"));
  ASSERT_TRUE(server.ok());
  auto client = Join(server, "smoke");
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(absl::IsNotFound(client->Get("hello").status()));
  auto v1 = client->Put("hello", "world");
  ASSERT_TRUE(v1.ok()) << v1.status();
  auto got = client->Get("hello");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value, "world");
  EXPECT_EQ(got->version, *v1);
  // CAS: a stale version fails and names the current one; the current one succeeds.
  auto stale = client->Cas("hello", *v1 + 1, "nope");
  EXPECT_TRUE(absl::IsFailedPrecondition(stale.status())) << stale.status();
  auto v2 = client->Cas("hello", *v1, "there");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_GT(*v2, *v1);
  got = client->Get("hello");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->value, "there");
  EXPECT_EQ(got->version, *v2);
  // DELETE: gone afterwards, a second DELETE finds nothing, and CAS on it is NOT_FOUND.
  auto v3 = client->Delete("hello");
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_GT(*v3, *v2);
  EXPECT_TRUE(absl::IsNotFound(client->Get("hello").status()));
  EXPECT_TRUE(absl::IsNotFound(client->Delete("hello").status()));
  EXPECT_TRUE(absl::IsNotFound(client->Cas("hello", *v3, "x").status()));
  // Re-inserted: versions keep rising across the delete (no ABA for CAS).
  auto v4 = client->Put("hello", "again");
  ASSERT_TRUE(v4.ok());
  EXPECT_GT(*v4, *v3);
}

// INSERT, and every error a caller can meet names its wire status first.
TEST(Smoke, InsertAndErrorsNameTheirStatus) {
  ServerProcess server(SmallServer("smoke_errors"));
  ASSERT_TRUE(server.ok());
  auto client = Join(server, "smoke_errors");
  ASSERT_NE(client, nullptr);
  auto v1 = client->Insert("fresh", "first");
  ASSERT_TRUE(v1.ok()) << v1.status();
  auto again = client->Insert("fresh", "second");
  ASSERT_TRUE(absl::IsAlreadyExists(again.status())) << again.status();
  EXPECT_TRUE(absl::StartsWith(again.status().message(), "EXISTS")) << again.status();
  EXPECT_NE(again.status().message().find(absl::StrCat(*v1)), std::string::npos)
      << "EXISTS names the present version: " << again.status();
  auto got = client->Get("fresh");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->value, "first");  // the failed INSERT changed nothing

  const auto not_found = client->Get("never stored").status();
  EXPECT_TRUE(absl::IsNotFound(not_found));
  EXPECT_TRUE(absl::StartsWith(not_found.message(), "NOT_FOUND")) << not_found;
  const auto cas_failed = client->Cas("fresh", *v1 + 7, "x").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(cas_failed));
  EXPECT_TRUE(absl::StartsWith(cas_failed.message(), "CAS_FAILED")) << cas_failed;
  const std::string long_key(client->config().max_key_bytes + 1, 'k');
  const auto key_too_long = client->Put(long_key, "v").status();
  EXPECT_TRUE(absl::IsInvalidArgument(key_too_long));
  EXPECT_TRUE(absl::StartsWith(key_too_long.message(), "KEY_TOO_LONG")) << key_too_long;
  const std::string long_value(client->config().slot_value_bytes() + 1, 'v');
  const auto value_too_long = client->Insert("other", long_value).status();
  EXPECT_TRUE(absl::IsOutOfRange(value_too_long));
  EXPECT_TRUE(absl::StartsWith(value_too_long.message(), "VALUE_TOO_LONG")) << value_too_long;
  EXPECT_TRUE(absl::IsNotFound(client->Get("other").status()));

  // After a DELETE the key is absent again: INSERT stores it, under a newer version.
  auto deleted = client->Delete("fresh");
  ASSERT_TRUE(deleted.ok());
  auto v2 = client->Insert("fresh", "third");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_GT(*v2, *deleted);
}

// A batch goes out with one doorbell per worker QP (client-side doorbell batching), and its
// results come back in input order.
TEST(Smoke, MultiPutAndMultiGetRingOneDoorbellPerWorker) {
  ServerProcess server(SmallServer("smoke_batch"));
  ASSERT_TRUE(server.ok());
  auto client = Join(server, "smoke_batch");
  ASSERT_NE(client, nullptr);
  const uint32_t workers = client->config().workers;
  const uint32_t window = client->config().window;
  // `window` keys per worker: the whole batch fits the windows at once.
  std::vector<std::string> keys;
  std::vector<uint32_t> per_worker(workers, 0);
  for (int i = 0; keys.size() < uint64_t{workers} * window; ++i) {
    std::string key = absl::StrCat("batch-", i);
    const uint32_t w = client->WorkerOf(mica::KeyHash(key));
    if (per_worker[w] == window) continue;
    ++per_worker[w];
    keys.push_back(std::move(key));
  }
  std::vector<std::string> values;
  std::vector<KeyValue> items;
  for (const std::string& key : keys) values.push_back("value of " + key);
  for (size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], values[i]});

  const uint64_t doorbells_before = client->stats().fabric.doorbells;
  const uint64_t wrs_before = client->stats().fabric.wrs;
  const std::vector<absl::StatusOr<uint64_t>> put = client->MultiPut(items);
  const transport::CounterSnapshot after = client->stats().fabric;
  ASSERT_EQ(put.size(), keys.size());
  for (const auto& v : put) ASSERT_TRUE(v.ok()) << v.status();
  // Retransmissions would add WRs (and doorbells): the count must be exact to compare.
  if (after.wrs - wrs_before == keys.size()) {
    EXPECT_EQ(after.doorbells - doorbells_before, workers)
        << keys.size() << " requests to " << workers << " workers";
  }

  std::vector<std::string_view> wanted(keys.begin(), keys.end());
  wanted.push_back("never stored");
  const std::vector<absl::StatusOr<Value>> got = client->MultiGet(wanted);
  ASSERT_EQ(got.size(), wanted.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << keys[i] << ": " << got[i].status();
    EXPECT_EQ(got[i]->value, values[i]);
    EXPECT_EQ(got[i]->version, *put[i]);
  }
  EXPECT_TRUE(absl::IsNotFound(got.back().status())) << got.back().status();

  // More keys than the windows hold: later ones go as answers free slots.
  std::vector<std::string> many;
  for (int i = 0; i < 40; ++i) many.push_back(absl::StrCat("many-", i));
  std::vector<KeyValue> many_items;
  for (const std::string& key : many) many_items.push_back({key, key});
  for (const auto& v : client->MultiPut(many_items)) ASSERT_TRUE(v.ok()) << v.status();
  std::vector<std::string_view> many_keys(many.begin(), many.end());
  const auto many_got = client->MultiGet(many_keys);
  for (size_t i = 0; i < many.size(); ++i) {
    ASSERT_TRUE(many_got[i].ok());
    EXPECT_EQ(many_got[i]->value, many[i]);
  }
}

// The stats request needs no session: its own connection, one JSON answer.
TEST(Smoke, StatsAreServedOnAConnectionOfTheirOwn) {
  ServerProcess server(SmallServer("smoke_stats"));
  ASSERT_TRUE(server.ok());
  auto client = Join(server, "smoke_stats");
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("k", "v").ok());
  ASSERT_TRUE(client->Get("k").ok());
  absl::StatusOr<std::string> json = FetchServerStats(server.address(), absl::Seconds(10));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(absl::StartsWith(*json, "{\"uptime_s\":")) << *json;
  EXPECT_NE(json->find("\"clients\":1"), std::string::npos) << *json;
  EXPECT_NE(json->find("\"get_misses\":["), std::string::npos) << *json;
  // The session is untouched: the client goes on.
  EXPECT_EQ(client->Get("k")->value, "v");
}

// RDMA-CM joins need a verbs device: on shm both ends refuse, saying what to use instead.
TEST(Smoke, RdmaCmJoinsAreRefusedOnShmClearly) {
  ServerOptions options = SmallServer("smoke_cm");
  options.connect = transport::ConnectMode::kCm;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  EXPECT_TRUE(absl::StrContains(server.status().message(), "--connect=tcp")) << server.status();

  ClientOptions client_options;
  client_options.device.fabric = "smoke_cm";
  client_options.connect = transport::ConnectMode::kCm;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(client_options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnimplemented) << client.status();
  EXPECT_TRUE(absl::StrContains(client.status().message(), "--connect=tcp")) << client.status();
}

}  // namespace
}  // namespace herd::testing
