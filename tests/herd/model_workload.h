// A randomized GET/PUT/DELETE/CAS/INSERT workload checked against a model of the store: the oracle
// of herd's end-to-end tests on every fabric.
#ifndef HERD_TESTS_HERD_MODEL_WORKLOAD_H_
#define HERD_TESTS_HERD_MODEL_WORKLOAD_H_

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "herd/client.h"
#include "mica/keyhash.h"

namespace herd::testing {

// The model of one key: present or not, its value and version.
struct ModelEntry {
  bool present = false;
  std::string value;
  uint64_t version = 0;
};

// Drives `ops` random operations through `client`'s logical clients, at most one outstanding per
// key (so the model knows the order), checking every result against the model.
// Values are 0..100 bytes, or with `large_values` up to the server's value limit: log-uniform
// sizes, so the inline/out-of-line boundary and the largest values are all drawn.
inline void RunModelWorkload(Client& client, uint32_t ops, uint32_t keys, uint64_t seed,
                             bool large_values = false) {
  std::mt19937_64 rng(seed);
  std::vector<ModelEntry> model(keys);
  std::vector<bool> busy(keys, false);
  struct Inflight {
    uint32_t key;
    Op op;
    std::string value;
    uint64_t expected_version;
  };
  std::map<uint64_t, Inflight> inflight;
  uint64_t next_tag = 0;
  uint32_t submitted = 0, checked = 0;
  std::vector<Result> results(64);
  const uint32_t max_value = large_values
                                 ? client.config().value_limit()
                                 : std::min<uint32_t>(client.config().slot_value_bytes(), 100);
  auto value_size = [&]() -> uint32_t {
    if (!large_values) return static_cast<uint32_t>(rng() % (max_value + 1));
    // 2^(0..log2(max)) then uniform within that power of two.
    const int top = 64 - __builtin_clzll(uint64_t{max_value} + 1);
    const uint64_t upper = uint64_t{1} << (rng() % top);
    return static_cast<uint32_t>(
        std::min<uint64_t>(upper / 2 + rng() % (upper / 2 + 1), max_value));
  };
  while (checked < ops) {
    // Submit while there is room.
    for (int attempt = 0; attempt < 8 && submitted < ops; ++attempt) {
      const uint32_t key = static_cast<uint32_t>(rng() % keys);
      if (busy[key]) continue;
      const std::string name = absl::StrFormat("key-%d", key);
      const uint32_t owner = key % client.clients();
      Inflight f{key, static_cast<Op>(rng() % kOpCount), "", 0};
      if (CarriesValue(f.op)) {
        f.value = std::string(value_size(), static_cast<char>('a' + rng() % 26));
        // Distinct bytes throughout: a value spliced from two of them would not compare equal.
        for (size_t b = 0; b < f.value.size(); b += 4096) f.value[b] = static_cast<char>(rng());
      }
      if (!client.CanSubmit(owner, mica::KeyHash(name), f.value.size())) continue;
      if (f.op == Op::kCas) {
        // Half the CASes expect the right version, half a wrong one.
        f.expected_version = model[key].version + (rng() % 2);
      }
      const uint64_t tag = next_tag++;
      ASSERT_TRUE(client.Submit(owner, f.op, name, f.value, f.expected_version, tag).ok());
      busy[key] = true;
      inflight.emplace(tag, std::move(f));
      ++submitted;
    }
    const size_t got = client.Poll(absl::MakeSpan(results));
    for (size_t i = 0; i < got; ++i) {
      const Result& r = results[i];
      auto it = inflight.find(r.tag);
      ASSERT_NE(it, inflight.end()) << "a result nobody asked for";
      const Inflight f = std::move(it->second);
      inflight.erase(it);
      busy[f.key] = false;
      ModelEntry& m = model[f.key];
      ASSERT_NE(r.status, Status::kTimedOut) << "key " << f.key;
      switch (f.op) {
        case Op::kGet:
          if (m.present) {
            ASSERT_EQ(r.status, Status::kOk) << "key " << f.key;
            ASSERT_EQ(r.value, m.value);
            ASSERT_EQ(r.version, m.version);
          } else {
            ASSERT_EQ(r.status, Status::kNotFound) << "key " << f.key;
          }
          break;
        case Op::kPut:
          ASSERT_EQ(r.status, Status::kOk);
          ASSERT_GT(r.version, m.version);
          m = ModelEntry{true, f.value, r.version};
          break;
        case Op::kDelete:
          if (m.present) {
            ASSERT_EQ(r.status, Status::kOk);
            ASSERT_GT(r.version, m.version);
            m.present = false;
            m.version = r.version;
          } else {
            ASSERT_EQ(r.status, Status::kNotFound);
          }
          break;
        case Op::kCas:
          if (!m.present) {
            ASSERT_EQ(r.status, Status::kNotFound);
          } else if (f.expected_version == m.version) {
            ASSERT_EQ(r.status, Status::kOk);
            ASSERT_GT(r.version, m.version);
            m = ModelEntry{true, f.value, r.version};
          } else {
            ASSERT_EQ(r.status, Status::kCasFailed);
            ASSERT_EQ(r.version, m.version);
          }
          break;
        case Op::kInsert:
          if (m.present) {
            ASSERT_EQ(r.status, Status::kExists) << "key " << f.key;
            ASSERT_EQ(r.version, m.version);
          } else {
            ASSERT_EQ(r.status, Status::kOk) << "key " << f.key;
            ASSERT_GT(r.version, m.version);
            m = ModelEntry{true, f.value, r.version};
          }
          break;
      }
      ++checked;
    }
  }
  EXPECT_EQ(client.stats().timed_out, 0u);
}

}  // namespace herd::testing

#endif  // HERD_TESTS_HERD_MODEL_WORKLOAD_H_
