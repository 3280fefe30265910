// Randomized differential tests: the partition against a reference model that knows it is lossy.
// The model's rule: a key returns its latest value and version, or it is missing; never a stale
// value, never another key's bytes, and once missing it stays missing until written again.
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "mica/keyhash.h"
#include "mica/partition.h"

namespace mica {
namespace {

struct Entry {
  std::string value;
  uint64_t version;
};

struct Scenario {
  const char* name;
  uint64_t log_bytes;
  uint64_t bucket_count;
  uint32_t max_value_bytes;
  int keys;
  int operations;
};

class ModelTest : public ::testing::TestWithParam<Scenario> {};

std::string RandomValue(std::mt19937_64& rng, uint32_t max_bytes, uint64_t stamp) {
  // Mixed sizes: mostly small, some near the limit.
  const uint32_t bytes = (rng() % 4 == 0) ? rng() % (max_bytes + 1) : rng() % 64;
  std::string value(bytes, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(stamp * 31 + i);
  return value;
}

TEST_P(ModelTest, NeverStaleNeverForeign) {
  const Scenario& s = GetParam();
  PartitionConfig config;
  config.log_bytes = s.log_bytes;
  config.bucket_count = s.bucket_count;
  config.max_value_bytes = s.max_value_bytes;
  config.try_hugepages = false;
  auto created = Partition::Create(config);
  ASSERT_TRUE(created.ok()) << created.status();
  Partition& partition = **created;

  std::mt19937_64 rng(42);
  std::map<std::string, Entry> model;  // keys the model believes present
  std::vector<char> buffer(s.max_value_bytes);
  uint64_t last_version = 0;
  int lost = 0;
  for (int op = 0; op < s.operations; ++op) {
    // Key lengths 1..256 so wide and narrow items mix.
    const int id = static_cast<int>(rng() % s.keys);
    const std::string key = absl::StrCat(id, ":", std::string(id % 257 == 0 ? 0 : id % 200, 'k'));
    const uint64_t keyhash = KeyHash(key);
    auto it = model.find(key);
    const int choice = static_cast<int>(rng() % 10);
    if (choice < 4) {  // GET
      const Response r = partition.Get(key, keyhash, buffer.data(), buffer.size());
      if (r.result == Result::kNotFound) {
        if (it != model.end()) {
          model.erase(it);  // evicted: allowed, and it must stay gone
          ++lost;
        }
        continue;
      }
      ASSERT_EQ(r.result, Result::kOk);
      ASSERT_NE(it, model.end()) << "resurrected or foreign key " << key << " at op " << op;
      ASSERT_EQ(r.version, it->second.version) << "stale version at op " << op;
      ASSERT_EQ(std::string(buffer.data(), r.value_bytes), it->second.value)
          << "wrong bytes at op " << op;
    } else if (choice < 7) {  // INSERT
      const std::string value = RandomValue(rng, s.max_value_bytes, op);
      const Response r = partition.Insert(key, keyhash, value);
      if (r.result == Result::kExists) {
        // Present: the model must hold it (with that version), or it would be resurrected.
        ASSERT_NE(it, model.end()) << "INSERT found a key the model lacks, op " << op;
        ASSERT_EQ(r.version, it->second.version);
        continue;
      }
      ASSERT_EQ(r.result, Result::kOk);
      ASSERT_GT(r.version, last_version);
      last_version = r.version;
      // Absent to the index: a key the model held was evicted (allowed), and is replaced.
      if (it != model.end()) ++lost;
      model[key] = Entry{value, r.version};
    } else if (choice < 8) {  // PUT
      const std::string value = RandomValue(rng, s.max_value_bytes, op);
      const Response r = partition.Put(key, keyhash, value);
      ASSERT_EQ(r.result, Result::kOk);
      ASSERT_GT(r.version, last_version);
      last_version = r.version;
      model[key] = Entry{value, r.version};
    } else if (choice < 9) {  // DELETE
      const Response r = partition.Delete(key, keyhash);
      if (r.result == Result::kOk) {
        ASSERT_NE(it, model.end()) << "deleted a key the model lacks, op " << op;
        model.erase(it);
      } else {
        ASSERT_EQ(r.result, Result::kNotFound);
        if (it != model.end()) model.erase(it);
      }
    } else {  // CAS, half with the right version
      const bool right = it != model.end() && rng() % 2 == 0;
      const uint64_t expected = right ? it->second.version : rng() % (last_version + 2);
      const std::string value = RandomValue(rng, s.max_value_bytes, op);
      const Response r = partition.Cas(key, keyhash, expected, value);
      if (r.result == Result::kNotFound) {
        if (it != model.end()) model.erase(it);
      } else if (r.result == Result::kCasFailed) {
        ASSERT_NE(it, model.end());
        ASSERT_EQ(r.version, it->second.version);
        ASSERT_NE(expected, it->second.version);
      } else {
        ASSERT_EQ(r.result, Result::kOk);
        ASSERT_NE(it, model.end());
        ASSERT_EQ(expected, it->second.version);
        ASSERT_GT(r.version, last_version);
        last_version = r.version;
        it->second = Entry{value, r.version};
      }
    }
  }
  // A full sweep at the end: every key the model still holds is either exact or missing.
  for (const auto& [key, entry] : model) {
    const Response r = partition.Get(key, KeyHash(key), buffer.data(), buffer.size());
    if (r.result == Result::kNotFound) continue;
    ASSERT_EQ(r.version, entry.version);
    ASSERT_EQ(std::string(buffer.data(), r.value_bytes), entry.value);
  }
  RecordProperty("lost_keys", lost);
  RecordProperty("log_wraps", static_cast<int>(partition.stats().log_wraps.Get()));
  if (s.log_bytes <= (64 << 10)) {
    EXPECT_GT(partition.stats().log_wraps.Get(), 10u);
  }
  if (s.bucket_count <= 16) {
    EXPECT_GT(partition.stats().evictions.Get(), 10u);
  }
}

INSTANTIATE_TEST_SUITE_P(Scenarios, ModelTest,
                         ::testing::Values(
                             // Roomy: almost nothing is lost.
                             Scenario{"roomy", 8 << 20, 1024, 2048, 500, 40000},
                             // Tiny log, many wraps with mixed sizes.
                             Scenario{"wrapping_log", 16 << 10, 256, 1500, 300, 40000},
                             // Tiny index, constant bucket evictions.
                             Scenario{"full_buckets", 4 << 20, 8, 512, 400, 40000},
                             // Both at once.
                             Scenario{"everything_lossy", 32 << 10, 4, 1024, 200, 40000}),
                         [](const auto& info) { return std::string(info.param.name); });

// ExecuteBatch must give exactly what executing the same requests one at a time gives, even
// when a batch holds several operations on one key.
TEST(Batch, MatchesOneAtATimeExecution) {
  PartitionConfig config;
  config.log_bytes = 64 << 10;
  config.bucket_count = 32;
  config.max_value_bytes = 512;
  config.try_hugepages = false;
  auto batched = Partition::Create(config);
  auto single = Partition::Create(config);
  ASSERT_TRUE(batched.ok() && single.ok());
  // Each partition draws its own IndexHash key; with different keys the two place keys in
  // different buckets and a full bucket evicts different items. Both are fresh, so copying the
  // header line gives `single` the same key and otherwise changes nothing.
  std::memcpy((*single)->region().base(), (*batched)->region().base(), sizeof(PartitionHeader));
  ASSERT_EQ((*single)->IndexHash("key0"), (*batched)->IndexHash("key0"));

  std::mt19937_64 rng(9);
  // Past ExecuteBatch's chunk of 64, so later chunks (their own tail prefetch) run too.
  constexpr int kMaxBatch = 100;
  std::vector<std::string> keys, values;
  std::vector<Request> requests(kMaxBatch);
  std::vector<Response> batch_responses(kMaxBatch);
  std::vector<std::vector<char>> batch_out(kMaxBatch, std::vector<char>(512));
  std::vector<char> single_out(512);
  for (int round = 0; round < 3000; ++round) {
    const int n = 1 + static_cast<int>(rng() % kMaxBatch);
    keys.assign(n, "");
    values.assign(n, "");
    for (int i = 0; i < n; ++i) {
      keys[i] = absl::StrCat("key", rng() % 64);  // few keys: repeats within a batch
      values[i] = std::string(rng() % 512, static_cast<char>('a' + round % 26));
    }
    for (int i = 0; i < n; ++i) {
      Request& r = requests[i];
      r.op = static_cast<OpCode>(rng() % 5);  // GET, PUT, DELETE, CAS, INSERT
      r.key = keys[i];
      r.keyhash = KeyHash(keys[i]);
      r.value = values[i];
      r.expected_version = rng() % 2 ? 0 : rng() % (round * 8 + 1);
      r.value_out = batch_out[i].data();
      r.value_out_bytes = 512;
    }
    (*batched)->ExecuteBatch(absl::MakeConstSpan(requests.data(), n),
                             absl::MakeSpan(batch_responses.data(), n));
    for (int i = 0; i < n; ++i) {
      Request r = requests[i];
      r.value_out = single_out.data();
      const Response expected = (*single)->Execute(r);
      const Response& got = batch_responses[i];
      ASSERT_EQ(got.result, expected.result) << round << "/" << i;
      ASSERT_EQ(got.version, expected.version) << round << "/" << i;
      ASSERT_EQ(got.value_bytes, expected.value_bytes);
      if (r.op == OpCode::kGet && got.result == Result::kOk) {
        ASSERT_EQ(std::string(batch_out[i].data(), got.value_bytes),
                  std::string(single_out.data(), expected.value_bytes));
      }
    }
  }
  EXPECT_GT((*batched)->stats().log_wraps.Get(), 10u);
}

}  // namespace
}  // namespace mica
