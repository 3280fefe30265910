// Store mode (issue 20): a partition that never loses a key. Checked against an exact model
// (std::map): every GET equals the model, a refused write (kNoMemory) changes nothing, DELETE
// gives memory back; and the index and the allocator agree after every step
// (Partition::CheckStoreInvariants).
#include <atomic>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "mica/keyhash.h"
#include "mica/partition.h"
#include "mica/remote_item.h"

namespace mica {
namespace {

// Steps between full invariant walks: every step in debug builds (the rule), fewer in
// optimized ones, where the walk would dominate the test's time.
#ifdef NDEBUG
constexpr int kCheckEvery = 16;
#else
constexpr int kCheckEvery = 1;
#endif

PartitionConfig StoreConfig(uint64_t pool_bytes, uint64_t buckets, uint64_t extra,
                            uint32_t max_value_bytes) {
  PartitionConfig config;
  config.mode = StoreMode::kStore;
  config.pool_bytes = pool_bytes;
  config.bucket_count = buckets;
  config.extra_bucket_count = extra;
  config.max_value_bytes = max_value_bytes;
  config.try_hugepages = false;
  return config;
}

std::unique_ptr<Partition> Make(const PartitionConfig& config) {
  auto created = Partition::Create(config);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? *std::move(created) : nullptr;
}

void ExpectInvariants(const Partition& partition, const std::string& where) {
  std::string why;
  ASSERT_TRUE(partition.CheckStoreInvariants(&why)) << where << ": " << why;
}

struct Entry {
  std::string value;
  uint64_t version;
};

// A value whose bytes name its key and length, so a foreign or torn one cannot pass as right.
std::string ValueOf(const std::string& key, uint64_t stamp, uint32_t bytes) {
  std::string value(bytes, '\0');
  const uint64_t seed = KeyHash(key) ^ (stamp * 0x9E3779B97F4A7C15ULL);
  for (uint32_t i = 0; i < bytes; ++i) value[i] = static_cast<char>((seed >> (8 * (i % 8))) + i);
  return value;
}

// Sizes across every small class and into large blocks: mostly small, some up to the limit.
uint32_t RandomSize(std::mt19937_64& rng, uint32_t max_bytes) {
  switch (rng() % 8) {
    case 0:
      return static_cast<uint32_t>(rng() % (max_bytes + 1));
    case 1:
    case 2:
      return static_cast<uint32_t>(rng() % 2048);
    default:
      return static_cast<uint32_t>(rng() % 200);
  }
}

// The model check the issue asks for: fill to NO_MEMORY, drain with DELETEs, refill, with
// overwrites, CAS and INSERTs throughout. Never a lost key, never a double allocation.
TEST(StoreMode, FillToNoMemoryAndBackLosesNothing) {
  constexpr uint32_t kMaxValue = 20000;  // large blocks (5+ pages) as well as every class
  auto partition = Make(StoreConfig(1 << 20, 64, 32, kMaxValue));
  ASSERT_NE(partition, nullptr);
  Partition& p = *partition;
  std::mt19937_64 rng(20);
  std::map<std::string, Entry> model;
  std::vector<char> buffer(kMaxValue);
  uint64_t last_version = 0, refused = 0, refused_while_filling = 0;
  int phase_steps = 0;
  enum class Phase { kFill, kDrain, kRefill } phase = Phase::kFill;
  constexpr int kKeys = 4000;
  // Steps of the refill phase before the test ends (fill and drain end on what happened).
  constexpr int kRefillSteps = 6000;
  constexpr int kMaxSteps = 100000;  // a bound, should the store never fill
  for (int step = 0; step < kMaxSteps; ++step) {
    if (phase == Phase::kRefill && phase_steps >= kRefillSteps) break;
    // Fill: mostly writes; drain: mostly deletes of present keys; refill: writes again.
    const int writes_per_10 = phase == Phase::kDrain ? 1 : 7;
    std::string key = absl::StrCat("key", rng() % kKeys);
    if (phase == Phase::kDrain && !model.empty()) {
      key = std::next(model.begin(), static_cast<long>(rng() % model.size()))->first;
    }
    const uint64_t keyhash = KeyHash(key);
    auto it = model.find(key);
    const int choice = static_cast<int>(rng() % 10);
    const std::string where = absl::StrCat("step ", step, " key ", key);
    if (choice < writes_per_10) {
      const std::string value = ValueOf(key, step, RandomSize(rng, kMaxValue));
      const int kind = static_cast<int>(rng() % 4);  // PUT, PUT, INSERT, CAS
      Response r;
      if (kind == 2) {
        r = p.Insert(key, keyhash, value);
      } else if (kind == 3) {
        r = p.Cas(key, keyhash, it == model.end() ? 0 : it->second.version, value);
      } else {
        r = p.Put(key, keyhash, value);
      }
      if (r.result == Result::kNoMemory) {
        ++refused;
        if (phase != Phase::kDrain) ++refused_while_filling;
      } else if (r.result == Result::kExists) {
        ASSERT_NE(it, model.end()) << where;
        ASSERT_EQ(r.version, it->second.version) << where;
      } else if (r.result == Result::kNotFound) {
        ASSERT_EQ(kind, 3) << where;
        ASSERT_EQ(it, model.end()) << where;
      } else {
        ASSERT_EQ(r.result, Result::kOk) << where << " " << ResultName(r.result);
        ASSERT_GT(r.version, last_version);
        last_version = r.version;
        model[key] = Entry{value, r.version};
      }
    } else if (choice < 9) {
      const Response r = p.Delete(key, keyhash);
      if (it == model.end()) {
        ASSERT_EQ(r.result, Result::kNotFound) << where;
      } else {
        ASSERT_EQ(r.result, Result::kOk) << where;
        model.erase(it);
      }
    } else {
      const Response r = p.Get(key, keyhash, buffer.data(), kMaxValue);
      if (it == model.end()) {
        ASSERT_EQ(r.result, Result::kNotFound) << where;
      } else {
        ASSERT_EQ(r.result, Result::kOk) << where << ": a stored key was lost";
        ASSERT_EQ(r.version, it->second.version) << where;
        ASSERT_TRUE(std::string(buffer.data(), r.value_bytes) == it->second.value) << where;
      }
    }
    if (step % kCheckEvery == 0) ExpectInvariants(p, where);
    if (HasFatalFailure()) return;
    // Phases end on what happened, not on a step count alone: fill until refusals pile up.
    ++phase_steps;
    if (phase == Phase::kFill && refused_while_filling > 200) {
      phase = Phase::kDrain;
      phase_steps = 0;
    } else if (phase == Phase::kDrain && model.size() < kKeys / 20) {
      phase = Phase::kRefill;
      phase_steps = 0;
    }
  }
  ASSERT_EQ(phase, Phase::kRefill) << "the workload never filled and drained the store";
  EXPECT_GE(phase_steps, kRefillSteps);
  // Every key the model holds is there, exactly.
  for (const auto& [key, entry] : model) {
    const Response r = p.Get(key, KeyHash(key), buffer.data(), kMaxValue);
    ASSERT_EQ(r.result, Result::kOk) << key << " was lost";
    ASSERT_EQ(r.version, entry.version);
    ASSERT_TRUE(std::string(buffer.data(), r.value_bytes) == entry.value) << key;
  }
  ExpectInvariants(p, "end");
  EXPECT_GT(refused, 200u);
  EXPECT_EQ(p.stats().no_memory.Get(), refused);
  EXPECT_EQ(p.stats().evictions.Get(), 0u);
  EXPECT_GT(p.stats().moves.Get(), 0u);
  RecordProperty("no_memory", static_cast<int>(refused));
  RecordProperty("keys_at_end", static_cast<int>(model.size()));
}

// Deleting every key gives every byte back: the pool is as empty as it started.
TEST(StoreMode, DeletingEverythingEmptiesThePool) {
  auto partition = Make(StoreConfig(1 << 20, 16, 16, 10000));
  Partition& p = *partition;
  const uint64_t free_at_start = p.slab()->Stats().free_pages;
  std::vector<std::string> keys;
  for (int i = 0;; ++i) {
    const std::string key = absl::StrCat("k", i);
    const Response r = p.Put(key, KeyHash(key), ValueOf(key, 1, 100 + (i * 997) % 9000));
    if (r.result == Result::kNoMemory) break;
    ASSERT_EQ(r.result, Result::kOk);
    keys.push_back(key);
  }
  ASSERT_GT(keys.size(), 50u);
  ExpectInvariants(p, "full");
  for (const std::string& key : keys) ASSERT_EQ(p.Delete(key, KeyHash(key)).result, Result::kOk);
  ExpectInvariants(p, "empty");
  const SlabStats stats = p.slab()->Stats();
  uint64_t used = stats.large_blocks;
  for (const SlabClassStats& c : stats.classes) used += c.used_blocks;
  EXPECT_EQ(used, 0u);
  // An empty span goes back to the page heap, as do large blocks: every page is free again.
  EXPECT_EQ(stats.large_pages, 0u);
  EXPECT_EQ(stats.span_pages, 0u);
  EXPECT_EQ(stats.free_pages, free_at_start);
  EXPECT_EQ(p.stats().store.extra_buckets_in_use.Get(), 0u);
}

// Items in the pool's last bytes are found like any other: a pool filled to the last block of
// its last page with the smallest items, every one of them read back.
TEST(StoreMode, ItemsUpToThePoolsLastByteAreFound) {
  auto partition = Make(StoreConfig(64 << 10, 256, 256, 64));  // the pool fills first
  Partition& p = *partition;
  std::vector<std::string> keys;
  uint64_t last_position = 0;
  std::vector<char> out(64);
  for (int i = 0;; ++i) {
    const std::string key = absl::StrCat("k", i);
    if (p.Put(key, KeyHash(key), "v").result == Result::kNoMemory) break;
    keys.push_back(key);
    last_position = std::max(last_position, p.Get(key, KeyHash(key), out.data(), 0).item_position);
  }
  // The last 64 B block of the pool was used: within one block of its end.
  EXPECT_GE(last_position + kSlabMinBlockBytes, p.layout().pool_bytes);
  for (const std::string& key : keys) {
    ASSERT_EQ(p.Get(key, KeyHash(key), out.data(), 64).result, Result::kOk) << key;
  }
  ExpectInvariants(p, "full");
}

// A full chain with an empty extra pool refuses a new key; the keys it holds stay; a DELETE
// makes room again; an emptied extra bucket goes back to the pool.
TEST(StoreMode, AFullIndexIsNoMemoryNeverAnEviction) {
  // One main bucket and two extra: 21 slots.
  auto partition = Make(StoreConfig(1 << 20, 1, 2, 64));
  Partition& p = *partition;
  for (int i = 0; i < 3 * kSlotsPerBucket; ++i) {
    const std::string key = absl::StrCat("k", i);
    ASSERT_EQ(p.Insert(key, KeyHash(key), "v").result, Result::kOk) << i;
  }
  EXPECT_EQ(p.stats().store.extra_buckets_in_use.Get(), 2u);
  const std::string extra_key = "one too many";
  EXPECT_EQ(p.Put(extra_key, KeyHash(extra_key), "v").result, Result::kNoMemory);
  EXPECT_EQ(p.stats().no_memory_index.Get(), 1u);
  ExpectInvariants(p, "after the refusal");
  std::vector<char> out(64);
  for (int i = 0; i < 3 * kSlotsPerBucket; ++i) {
    const std::string key = absl::StrCat("k", i);
    EXPECT_EQ(p.Get(key, KeyHash(key), out.data(), 64).result, Result::kOk) << key;
  }
  EXPECT_EQ(p.Delete("k3", KeyHash("k3")).result, Result::kOk);
  EXPECT_EQ(p.Put(extra_key, KeyHash(extra_key), "v").result, Result::kOk);
  // Empty the last extra bucket's keys (inserted last: k14..k20): it returns to the pool.
  for (int i = 2 * kSlotsPerBucket; i < 3 * kSlotsPerBucket; ++i) {
    const std::string key = absl::StrCat("k", i);
    ASSERT_EQ(p.Delete(key, KeyHash(key)).result, Result::kOk);
  }
  EXPECT_EQ(p.stats().store.extra_buckets_in_use.Get(), 1u);
  ExpectInvariants(p, "after returning an extra bucket");
  EXPECT_EQ(p.stats().evictions.Get(), 0u);
}

// At a full pool, an overwrite that keeps its block size succeeds (in place); one that needs a
// bigger block is NO_MEMORY and the old value stays, readable and unchanged.
TEST(StoreMode, OverwritesAtAFullPool) {
  auto partition = Make(StoreConfig(256 << 10, 64, 64, 4000));
  Partition& p = *partition;
  std::vector<std::string> keys;
  for (int i = 0;; ++i) {
    const std::string key = absl::StrCat("k", i);
    const Response r = p.Put(key, KeyHash(key), ValueOf(key, 0, 1000));
    if (r.result == Result::kNoMemory) break;
    keys.push_back(key);
  }
  ASSERT_GT(keys.size(), 100u);
  // The 1280 B class's spans take several pages: fill the pages left with one-page spans of
  // small items, so that no class can carve a new span.
  for (int i = 0;; ++i) {
    const std::string key = absl::StrCat("small", i);
    if (p.Put(key, KeyHash(key), "s").result == Result::kNoMemory) break;
  }
  ASSERT_EQ(p.slab()->Stats().free_pages, 0u);
  std::vector<char> out(4000);
  const std::string& key = keys.front();
  // 1000 and 1100 B values both make items of the 1280 B class: the same block.
  const Response same = p.Put(key, KeyHash(key), ValueOf(key, 1, 1100));
  ASSERT_EQ(same.result, Result::kOk);
  const Response bigger = p.Put(key, KeyHash(key), ValueOf(key, 2, 3900));
  EXPECT_EQ(bigger.result, Result::kNoMemory);
  const Response got = p.Get(key, KeyHash(key), out.data(), 4000);
  ASSERT_EQ(got.result, Result::kOk);
  EXPECT_EQ(got.version, same.version);
  EXPECT_TRUE(std::string(out.data(), got.value_bytes) == ValueOf(key, 1, 1100));
  EXPECT_EQ(p.stats().moves.Get(), 0u);
  // Deleting half the keys empties whole spans back to the page heap, where the 4 KiB class
  // finds one: the size change now moves the item.
  for (size_t i = 1; i < keys.size() / 2; ++i) p.Delete(keys[i], KeyHash(keys[i]));
  const Response moved = p.Put(key, KeyHash(key), ValueOf(key, 3, 3900));
  ASSERT_EQ(moved.result, Result::kOk);
  EXPECT_NE(p.Get(key, KeyHash(key), out.data(), 4000).item_position, got.item_position);
  EXPECT_EQ(p.stats().moves.Get(), 1u);
  ExpectInvariants(p, "end");
}

// What a one-sided reader sees after the item it was told of is freed or its block reused:
// never the old bytes passed off as something else, never the new item passed off as the old.
TEST(StoreMode, AReaderOfAFreedOrReusedBlockIsCaught) {
  PartitionConfig config = StoreConfig(1 << 20, 64, 16, 64 << 10);
  config.checksum_from_value_bytes = 0;  // every item checksummed, as for out-of-line values
  auto partition = Make(config);
  Partition& p = *partition;
  const std::string key = "named";
  // A neighbour in the same span keeps the span carved when `named` is freed (the last block of
  // a span returns the whole span to the page heap unwritten: the large-block case below).
  ASSERT_EQ(p.Put("neighbour", KeyHash("neighbour"), ValueOf(key, 9, 500)).result, Result::kOk);
  ASSERT_EQ(p.Put(key, KeyHash(key), ValueOf(key, 0, 500)).result, Result::kOk);
  std::vector<char> out(64 << 10);
  const Response named = p.Get(key, KeyHash(key), out.data(), 0);  // too small: the descriptor
  ASSERT_EQ(named.result, Result::kBufferTooSmall);
  const uint8_t* block = p.region().ring() + named.item_position;
  std::vector<uint8_t> copy(named.item_bytes);
  const auto verify = [&] {
    std::memcpy(copy.data(), block, copy.size());
    return VerifyItem(copy.data(), copy.size(), KeyHash(key), named.version, key).status();
  };
  ASSERT_TRUE(verify().ok());
  // Freed: a small block's first words now hold the free list's link and tag.
  ASSERT_EQ(p.Delete(key, KeyHash(key)).result, Result::kOk);
  EXPECT_EQ(verify().code(), absl::StatusCode::kDataLoss);
  // Reused by another key of the same class: whole, but not the item named.
  const std::string other = "other";
  ASSERT_EQ(p.Put(other, KeyHash(other), ValueOf(other, 0, 500)).result, Result::kOk);
  ASSERT_EQ(p.Get(other, KeyHash(other), out.data(), 0).item_position, named.item_position);
  EXPECT_NE(verify().code(), absl::StatusCode::kOk);
  // Rewritten in place by the same key: a newer version, not the one named.
  ASSERT_EQ(p.Put(other, KeyHash(other), ValueOf(other, 1, 480)).result, Result::kOk);
  EXPECT_NE(verify().code(), absl::StatusCode::kOk);
  // A large block is not written when freed: a READ of it still returns the named item whole,
  // which is the value the GET returned (its linearization point), as a log item not yet
  // overwritten is in cache mode. Reused, it is caught as above.
  const std::string big = "big";
  ASSERT_EQ(p.Put(big, KeyHash(big), ValueOf(big, 0, 40000)).result, Result::kOk);
  const Response big_named = p.Get(big, KeyHash(big), out.data(), 0);
  ASSERT_EQ(p.Delete(big, KeyHash(big)).result, Result::kOk);
  std::vector<uint8_t> big_copy(big_named.item_bytes);
  std::memcpy(big_copy.data(), p.region().ring() + big_named.item_position, big_copy.size());
  auto stale = VerifyItem(big_copy.data(), big_copy.size(), KeyHash(big), big_named.version, big);
  ASSERT_TRUE(stale.ok());
  EXPECT_TRUE(stale->value == ValueOf(big, 0, 40000));
  ASSERT_EQ(p.Put(other, KeyHash(other), ValueOf(other, 2, 40000)).result, Result::kOk);
  std::memcpy(big_copy.data(), p.region().ring() + big_named.item_position, big_copy.size());
  EXPECT_FALSE(
      VerifyItem(big_copy.data(), big_copy.size(), KeyHash(big), big_named.version, big).ok());
}

// The tearing harness at the partition level: a reader thread copies the block a GET named
// while the owner rewrites it in place, moves the key, deletes it and reuses its blocks. Every
// copy that verifies must hold exactly the value of the version it carries.
TEST(StoreMode, ConcurrentCopiesNeverVerifyATornOrForeignItem) {
  PartitionConfig config = StoreConfig(1 << 20, 64, 16, 16 << 10);
  config.checksum_from_value_bytes = 0;
  auto partition = Make(config);
  Partition& p = *partition;
  const std::string key = "hot";
  const uint64_t keyhash = KeyHash(key);
  // Value bytes are a function of the version, so a verified copy can be checked exactly.
  const auto value_for = [&](uint64_t version) {
    return ValueOf(key, version, static_cast<uint32_t>(100 + (version * 7919) % 12000));
  };
  struct Named {
    std::atomic<uint64_t> position{0}, bytes{0}, version{0};
  } named;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> verified{0}, rejected{0}, wrong{0};
  const uint8_t* pool = p.region().ring();
  std::thread reader([&] {
    std::vector<uint8_t> copy(32 << 10);
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t version = named.version.load(std::memory_order_acquire);
      const uint64_t position = named.position.load(std::memory_order_relaxed);
      const uint64_t bytes = named.bytes.load(std::memory_order_relaxed);
      if (version == 0 || bytes > copy.size()) continue;
      // Word by word with relaxed atomics: what a NIC's READ is to the owner (no ordering).
      for (uint64_t w = 0; w < bytes / 8; ++w) {
        const uint64_t word = std::atomic_ref<const uint64_t>(
                                  *reinterpret_cast<const uint64_t*>(pool + position + 8 * w))
                                  .load(std::memory_order_relaxed);
        std::memcpy(copy.data() + 8 * w, &word, 8);
      }
      auto item = VerifyItem(copy.data(), bytes, keyhash, version, key);
      if (!item.ok()) {
        rejected.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      verified.fetch_add(1, std::memory_order_relaxed);
      if (item->value != value_for(item->version)) wrong.fetch_add(1, std::memory_order_relaxed);
    }
  });
  std::mt19937_64 rng(7);
  std::vector<char> out(16 << 10);
  uint64_t version = 0;
  // Writes the value its version will have, by predicting the next version: a PUT takes the
  // clock's next value, and every successful write or delete advances the clock (tracked).
  const auto advance = [&](const Response& r) {
    if (r.result == Result::kOk) version = r.version;
  };
  for (int round = 0; round < 20000; ++round) {
    const int action = static_cast<int>(rng() % 6);
    if (action == 0) {
      advance(p.Delete(key, keyhash));  // frees the block the reader copies
    } else if (action == 1) {
      const std::string other = absl::StrCat("o", rng() % 64);  // reuses freed blocks
      advance(p.Put(other, KeyHash(other), std::string(100 + rng() % 12000, 'x')));
      if (rng() % 2 == 0) advance(p.Delete(other, KeyHash(other)));
    } else {
      const Response r = p.Put(key, keyhash, value_for(version + 1));
      ASSERT_EQ(r.result, Result::kOk);
      ASSERT_EQ(r.version, version + 1);
      version = r.version;
      const Response g = p.Get(key, keyhash, out.data(), 0);
      named.position.store(g.item_position, std::memory_order_relaxed);
      named.bytes.store(g.item_bytes, std::memory_order_relaxed);
      named.version.store(g.version, std::memory_order_release);
    }
  }
  stop = true;
  reader.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(verified.load(), 0u);
  RecordProperty("verified", static_cast<int>(verified.load()));
  RecordProperty("rejected", static_cast<int>(rejected.load()));
  ExpectInvariants(p, "end");
}

// Fragmentation over a long mixed-size run: what the pool's used pages hold, and where the rest
// goes (rounding a live item up to its class; free blocks inside spans still in use). Reported
// as test properties; bounded by the class design: four classes per doubling round an item up
// by less than 25% of its size (under 20% of its block).
TEST(StoreMode, LongMixedSizeRunWasteIsReportedAndBounded) {
  constexpr uint32_t kMaxValue = 12000;
  auto partition = Make(StoreConfig(8 << 20, 1024, 0, kMaxValue));
  Partition& p = *partition;
  std::mt19937_64 rng(11);
  std::map<std::string, uint64_t> item_bytes;  // live key -> its item's bytes
  for (int step = 0; step < 200000; ++step) {
    const std::string key = absl::StrCat("k", rng() % 20000);
    if (rng() % 3 == 0) {
      if (p.Delete(key, KeyHash(key)).result == Result::kOk) item_bytes.erase(key);
      continue;
    }
    const uint32_t bytes = RandomSize(rng, kMaxValue);
    if (p.Put(key, KeyHash(key), std::string(bytes, 'f')).result == Result::kOk) {
      item_bytes[key] = ItemBytes(key.size(), bytes);
    }
  }
  ExpectInvariants(p, "end");
  uint64_t live_item_bytes = 0, live_block_bytes = 0;
  for (const auto& [key, bytes] : item_bytes) {
    live_item_bytes += bytes;
    live_block_bytes += p.slab()->BlockBytesFor(bytes);
  }
  const SlabStats stats = p.slab()->Stats();
  const uint64_t used_page_bytes = (stats.page_count - stats.free_pages) * stats.page_bytes;
  ASSERT_GT(live_item_bytes, 0u);
  const double rounding = 1.0 - static_cast<double>(live_item_bytes) / live_block_bytes;
  const double in_spans = 1.0 - static_cast<double>(live_block_bytes) / used_page_bytes;
  RecordProperty("live_items", static_cast<int>(item_bytes.size()));
  RecordProperty("live_item_bytes", static_cast<int>(live_item_bytes));
  RecordProperty("rounding_waste_percent", absl::StrFormat("%.1f", 100 * rounding));
  RecordProperty("free_in_used_pages_percent", absl::StrFormat("%.1f", 100 * in_spans));
  std::cout << "[store waste] " << item_bytes.size() << " live items, " << live_item_bytes
            << " item bytes in " << live_block_bytes << " block bytes (rounding "
            << absl::StrFormat("%.1f", 100 * rounding) << "%), " << used_page_bytes
            << " bytes of used pages (free blocks and span tails "
            << absl::StrFormat("%.1f", 100 * in_spans) << "%)" << std::endl;
  EXPECT_LT(rounding, 0.20);
  EXPECT_GE(in_spans, 0.0);
}

// The same operations on both modes with room to spare give the same answers: store mode is a
// drop-in for cache mode where the cache loses nothing.
TEST(StoreMode, AgreesWithCacheModeWhereNothingIsLost) {
  PartitionConfig cache_config;
  cache_config.log_bytes = 16 << 20;
  cache_config.bucket_count = 1024;
  cache_config.max_value_bytes = 2048;
  cache_config.try_hugepages = false;
  PartitionConfig store_config = cache_config;
  store_config.mode = StoreMode::kStore;
  store_config.pool_bytes = 4 << 20;
  auto cache = Make(cache_config);
  auto store = Make(store_config);
  std::mt19937_64 rng(3);
  std::vector<char> a(2048), b(2048);
  for (int i = 0; i < 20000; ++i) {
    Request r;
    const std::string key = absl::StrCat("k", rng() % 300);
    const std::string value(rng() % 2048, static_cast<char>('a' + i % 26));
    r.op = static_cast<OpCode>(rng() % 5);
    r.key = key;
    r.keyhash = KeyHash(key);
    r.value = value;
    r.expected_version = rng() % 2 ? 0 : rng() % (i + 1);
    r.value_out = a.data();
    r.value_out_bytes = 2048;
    const Response x = cache->Execute(r);
    r.value_out = b.data();
    const Response y = store->Execute(r);
    ASSERT_EQ(x.result, y.result) << i;
    ASSERT_EQ(x.version, y.version) << i;
    ASSERT_EQ(x.value_bytes, y.value_bytes) << i;
    if (r.op == OpCode::kGet && x.result == Result::kOk) {
      ASSERT_EQ(std::memcmp(a.data(), b.data(), x.value_bytes), 0) << i;
    }
  }
  EXPECT_EQ(cache->stats().evictions.Get(), 0u);
  ExpectInvariants(*store, "end");
}

TEST(StoreMode, ConfigAndLayout) {
  EXPECT_EQ(*ParseStoreMode("cache"), StoreMode::kCache);
  EXPECT_EQ(*ParseStoreMode("store"), StoreMode::kStore);
  EXPECT_EQ(ParseStoreMode("lossless").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StoreModeName(StoreMode::kStore), "store");

  PartitionConfig zero = StoreConfig(0, 16, 0, 64);
  EXPECT_EQ(Partition::Create(zero).status().code(), absl::StatusCode::kInvalidArgument);
  // A pool too small for the allocator's header and one page: a clear error, not a crash.
  PartitionConfig tiny = StoreConfig(1, 16, 0, 64);
  auto created = Partition::Create(tiny);
  ASSERT_FALSE(created.ok()) << "a 1-byte pool (one page after rounding) has no room for data";
  EXPECT_NE(created.status().message().find("slab pool"), std::string::npos) << created.status();

  auto partition = Make(StoreConfig(8 << 20, 1024, 0, 1 << 20));
  const PartitionLayout& layout = partition->layout();
  EXPECT_EQ(layout.mode, StoreMode::kStore);
  EXPECT_EQ(layout.extra_bucket_count, 1024 / kExtraBucketsPerBucketDivisor);
  EXPECT_EQ(layout.pool_bytes, uint64_t{8} << 20);
  EXPECT_EQ(layout.log_bytes, 0u);
  EXPECT_EQ(layout.mirror_bytes, 0u);
  EXPECT_EQ(layout.IndexSlots(), (1024u + 512u) * kSlotsPerBucket);
  // 16+32 B items take 80 B blocks: about 8 MiB * (4096 / 4128) / 80.
  const uint64_t capacity = layout.LogCapacityItems(16, 32);
  EXPECT_NEAR(static_cast<double>(capacity), 8.0 * 1048576 * 4096 / 4128 / 80, 200.0);
  EXPECT_NE(layout.Describe(16, 32).find("store mode"), std::string::npos);
  // A 1 MiB value is a large block of 257 pages, and fits.
  const std::string key = "big";
  EXPECT_EQ(partition->Put(key, KeyHash(key), std::string(1 << 20, 'b')).result, Result::kOk);
  EXPECT_EQ(partition->stats().store.large_pages.Get(), 257u);
  EXPECT_EQ(partition->stats().store.pool_pages.Get(), partition->slab()->page_count());
}

// The main bucket's version guards its whole chain: linking an extra bucket, writing a slot in
// it, rewriting an item in place, moving it, deleting from the chain and unlinking the emptied
// extra bucket each move the main version by exactly 2 and leave it even.
TEST(StoreMode, EveryChainChangeMovesTheMainBucketsVersionByTwo) {
  auto partition = Make(StoreConfig(1 << 20, 1, 4, 4096));
  Partition& p = *partition;
  const auto* head = reinterpret_cast<const Bucket*>(p.region().head() + p.layout().buckets_offset);
  const auto version = [&] { return std::atomic_ref<const uint32_t>(head->version).load(); };
  std::vector<std::string> keys;
  for (int i = 0; i < kSlotsPerBucket + 2; ++i) keys.push_back(absl::StrCat("k", i));
  const auto step = [&](const char* what, const std::function<Result()>& op, uint32_t moves) {
    const uint32_t before = version();
    ASSERT_EQ(op(), Result::kOk) << what;
    EXPECT_EQ(version(), before + 2 * moves) << what;
    EXPECT_EQ(version() % 2, 0u) << what;
  };
  for (int i = 0; i < kSlotsPerBucket; ++i) {
    step(
        "insert into the main bucket", [&] { return p.Put(keys[i], KeyHash(keys[i]), "v").result; },
        1);
  }
  const std::string& spill = keys[kSlotsPerBucket];
  // A new key in a full chain: link the extra bucket, then fill its slot (two changes).
  step(
      "link an extra bucket", [&] { return p.Put(spill, KeyHash(spill), "v").result; }, 2);
  EXPECT_EQ(p.stats().store.extra_buckets_in_use.Get(), 1u);
  step(
      "rewrite in place", [&] { return p.Put(spill, KeyHash(spill), "w").result; }, 1);
  step(
      "move to a bigger block",
      [&] { return p.Put(spill, KeyHash(spill), std::string(1000, 'm')).result; }, 1);
  // Deleting the extra bucket's only key empties and unlinks it in one change.
  step(
      "delete and unlink", [&] { return p.Delete(spill, KeyHash(spill)).result; }, 1);
  EXPECT_EQ(p.stats().store.extra_buckets_in_use.Get(), 0u);
  EXPECT_EQ(head->next_extra, 0u);
  // The returned extra bucket is the one reused.
  step(
      "relink from the free list", [&] { return p.Put(spill, KeyHash(spill), "v").result; }, 2);
  ExpectInvariants(p, "end");
}

// An unlink from the middle of a chain (three buckets, the middle one emptied) keeps the rest
// reachable, and the free list hands the bucket out again.
TEST(StoreMode, UnlinkingFromTheMiddleOfAChainLosesNothing) {
  auto partition = Make(StoreConfig(1 << 20, 1, 4, 64));
  Partition& p = *partition;
  const int keys = 3 * kSlotsPerBucket;
  for (int i = 0; i < keys; ++i) {
    const std::string key = absl::StrCat("k", i);
    ASSERT_EQ(p.Put(key, KeyHash(key), key).result, Result::kOk);
  }
  ASSERT_EQ(p.stats().store.extra_buckets_in_use.Get(), 2u);
  // Keys kSlotsPerBucket..2*kSlotsPerBucket-1 filled the first extra bucket (the middle one).
  for (int i = kSlotsPerBucket; i < 2 * kSlotsPerBucket; ++i) {
    const std::string key = absl::StrCat("k", i);
    ASSERT_EQ(p.Delete(key, KeyHash(key)).result, Result::kOk);
  }
  EXPECT_EQ(p.stats().store.extra_buckets_in_use.Get(), 1u);
  ExpectInvariants(p, "after the middle unlink");
  std::vector<char> out(64);
  for (int i = 2 * kSlotsPerBucket; i < keys; ++i) {
    const std::string key = absl::StrCat("k", i);
    EXPECT_EQ(p.Get(key, KeyHash(key), out.data(), 64).result, Result::kOk) << key;
  }
  for (int i = 0; i < kSlotsPerBucket + 1; ++i) {  // refill: one more than the freed bucket holds
    const std::string key = absl::StrCat("again", i);
    ASSERT_EQ(p.Put(key, KeyHash(key), key).result, Result::kOk);
  }
  // The freed bucket came back from the free list (7 keys), and one more was carved (1 key).
  EXPECT_EQ(p.stats().store.extra_buckets_in_use.Get(), 3u);
  ExpectInvariants(p, "after the refill");
}

// Damaged index or item memory (only a bug or hardware can do it: clients never write a
// partition) is never followed into a crash, a hang or a write past a block.
TEST(StoreMode, DamagedMemoryIsNeverFollowed) {
  auto partition = Make(StoreConfig(1 << 20, 1, 4, 8192));
  Partition& p = *partition;
  auto* head = reinterpret_cast<Bucket*>(p.region().head() + p.layout().buckets_offset);
  auto* extra = head + p.layout().bucket_count;
  for (int i = 0; i < kSlotsPerBucket + 1; ++i) {
    const std::string key = absl::StrCat("k", i);
    ASSERT_EQ(p.Put(key, KeyHash(key), "v").result, Result::kOk);
  }
  ASSERT_EQ(head->next_extra, 1u);
  std::vector<char> out(8192);
  // A cyclic chain: the extra bucket links to itself. Lookups end; a new key is refused.
  extra[0].next_extra = 1;
  EXPECT_EQ(p.Get("absent", KeyHash("absent"), out.data(), 8192).result, Result::kNotFound);
  for (int i = 0; i < 2 * kSlotsPerBucket; ++i) {  // fill what is left, then one more
    const std::string key = absl::StrCat("more", i);
    const Result r = p.Put(key, KeyHash(key), "v").result;
    ASSERT_TRUE(r == Result::kOk || r == Result::kNoMemory) << ResultName(r);
  }
  extra[0].next_extra = 0;
  // A slot pointing past the pool: skipped (a miss), never dereferenced.
  const std::string key = "k0";
  uint64_t* slot = nullptr;
  for (uint64_t& s : head->slots) {
    if (s != 0 && SlotTag(s) == TagOf(p.IndexHash(key))) slot = &s;
  }
  ASSERT_NE(slot, nullptr);
  const uint64_t saved = *slot;
  *slot = MakeSlot(TagOf(p.IndexHash(key)), p.layout().pool_bytes + (uint64_t{1} << 30));
  EXPECT_EQ(p.Get(key, KeyHash(key), out.data(), 8192).result, Result::kNotFound);
  *slot = saved;
  // An item header whose lengths grew: never copied out, never handed to a reader, and a PUT
  // of a value that would fit the forged length moves instead of writing past its 64 B block.
  auto* item = reinterpret_cast<ItemHeader*>(p.region().ring() + SlotOffset(saved));
  const uint64_t neighbour_before = p.stats().corrupt.Get();
  item->value_bytes = 4000;
  EXPECT_EQ(p.Get(key, KeyHash(key), out.data(), 8192).result, Result::kOk);  // no checksum
  // Past the pool: no write could have stored it. Counted, and a miss (never read past the pool,
  // never named to a one-sided reader).
  item->value_bytes = 1 << 30;
  EXPECT_EQ(p.Get(key, KeyHash(key), out.data(), 8192).result, Result::kNotFound);
  EXPECT_EQ(p.Get(key, KeyHash(key), out.data(), 0).result, Result::kNotFound);
  EXPECT_EQ(p.stats().corrupt.Get(), neighbour_before + 2);
  item->value_bytes = 4000;
  ASSERT_EQ(p.Put(key, KeyHash(key), std::string(3990, 'x')).result, Result::kOk);
  EXPECT_NE(p.Get(key, KeyHash(key), out.data(), 8192).item_position, SlotOffset(saved))
      << "a write of the forged length went in place, past its block";
  for (int i = 1; i < kSlotsPerBucket; ++i) {  // the neighbours are intact
    const std::string other = absl::StrCat("k", i);
    const Response r = p.Get(other, KeyHash(other), out.data(), 8192);
    EXPECT_EQ(r.result, Result::kOk) << other;
    EXPECT_EQ(std::string(out.data(), r.value_bytes), "v") << other;
  }
}

// The gauges a progress line reads follow the allocator exactly.
TEST(StoreMode, GaugesFollowTheAllocator) {
  auto partition = Make(StoreConfig(1 << 20, 64, 8, 10000));
  Partition& p = *partition;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 3000; ++i) {
    const std::string key = absl::StrCat("k", rng() % 500);
    if (rng() % 3 == 0) {
      p.Delete(key, KeyHash(key));
    } else {
      p.Put(key, KeyHash(key), std::string(rng() % 10000, 'g'));
    }
  }
  const SlabStats stats = p.slab()->Stats();
  const StoreGauges& g = p.stats().store;
  EXPECT_EQ(g.free_pages.Get(), stats.free_pages);
  EXPECT_EQ(g.large_blocks.Get(), stats.large_blocks);
  EXPECT_EQ(g.large_pages.Get(), stats.large_pages);
  for (int c = 0; c < kSlabClassCount; ++c) {
    EXPECT_EQ(g.class_used_blocks[c].Get(), stats.classes[c].used_blocks) << c;
    EXPECT_EQ(g.class_spans[c].Get(), stats.classes[c].spans) << c;
  }
}

}  // namespace
}  // namespace mica
