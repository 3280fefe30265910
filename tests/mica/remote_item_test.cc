// Items a one-sided reader copies while the owner may overwrite them (mica/remote_item.h): a
// whole copy of the named item verifies, anything else never does. The last test is a tearing
// harness: a reader thread copies items in small pieces, as a NIC's READ would, while the owner
// overwrites the log under it.
#include "mica/remote_item.h"

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "mica/keyhash.h"
#include "mica/partition.h"

namespace mica {
namespace {

constexpr uint32_t kThreshold = 64;  // values of 64 B and more carry a checksum

PartitionConfig Config(uint64_t log_bytes) {
  PartitionConfig config;
  config.log_bytes = log_bytes;
  config.expected_items = 1024;
  config.max_value_bytes = 8192;
  config.checksum_from_value_bytes = kThreshold;
  config.try_hugepages = false;
  return config;
}

std::unique_ptr<Partition> Make(uint64_t log_bytes) {
  auto p = Partition::Create(Config(log_bytes));
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

// What a GET named, and a copy of the bytes there.
struct Named {
  Response response;
  std::vector<uint8_t> copy;
};
Named Locate(Partition& p, const std::string& key) {
  Named n;
  n.response = p.Get(key, KeyHash(key), nullptr, 0);  // too small: names the item only
  const uint8_t* ring = p.region().ring();
  n.copy.assign(ring + n.response.item_position,
                ring + n.response.item_position + n.response.item_bytes);
  return n;
}

TEST(RemoteItem, AChecksummedItemVerifiesFromAWholeCopy) {
  auto p = Make(1 << 20);
  const std::string key = "key", value(100, 'v');
  const Response put = p->Put(key, KeyHash(key), value);
  Named n = Locate(*p, key);
  ASSERT_EQ(n.response.result, Result::kBufferTooSmall);
  EXPECT_EQ(n.response.version, put.version);
  EXPECT_EQ(n.response.item_bytes, ItemBytes(key.size(), value.size(), /*checksum=*/true));
  absl::StatusOr<VerifiedItem> item =
      VerifyItem(n.copy.data(), n.copy.size(), KeyHash(key), put.version, key);
  ASSERT_TRUE(item.ok()) << item.status();
  EXPECT_EQ(item->value, value);
  EXPECT_EQ(item->key, key);
}

TEST(RemoteItem, ItemsBelowTheThresholdHaveNoChecksumAndNeverVerify) {
  auto p = Make(1 << 20);
  const std::string key = "small", value(kThreshold - 1, 's');
  const Response put = p->Put(key, KeyHash(key), value);
  Named n = Locate(*p, key);
  EXPECT_EQ(n.response.item_bytes, ItemBytes(key.size(), value.size()));
  EXPECT_FALSE(VerifyItem(n.copy.data(), n.copy.size(), KeyHash(key), put.version, key).ok());
}

TEST(RemoteItem, EveryDamagedByteFailsTheCheck) {
  auto p = Make(1 << 20);
  const std::string key = "k", value(200, 'x');
  const Response put = p->Put(key, KeyHash(key), value);
  const Named n = Locate(*p, key);
  for (size_t i = 0; i < n.copy.size(); ++i) {
    std::vector<uint8_t> damaged = n.copy;
    damaged[i] ^= 0x20;
    EXPECT_FALSE(VerifyItem(damaged.data(), damaged.size(), KeyHash(key), put.version, key).ok())
        << "byte " << i << " changed and the copy still verified";
  }
  // Too short or too long a copy is never the item.
  EXPECT_FALSE(VerifyItem(n.copy.data(), n.copy.size() - 8, KeyHash(key), put.version, key).ok());
  EXPECT_FALSE(VerifyItem(n.copy.data(), 8, KeyHash(key), put.version, key).ok());
}

TEST(RemoteItem, AWholeItemThatIsNotTheOneNamedIsNotFound) {
  auto p = Make(1 << 20);
  const std::string key = "k";
  const Response first = p->Put(key, KeyHash(key), std::string(100, '1'));
  const Named old = Locate(*p, key);
  const Response second = p->Put(key, KeyHash(key), std::string(100, '2'));
  // The old copy is intact but names the old version; the reader expects the new one.
  EXPECT_TRUE(absl::IsNotFound(
      VerifyItem(old.copy.data(), old.copy.size(), KeyHash(key), second.version, key).status()));
  EXPECT_TRUE(VerifyItem(old.copy.data(), old.copy.size(), KeyHash(key), first.version, key).ok());
  // Without the key, keyhash and version decide.
  EXPECT_TRUE(VerifyItem(old.copy.data(), old.copy.size(), KeyHash(key), first.version, {}).ok());
  EXPECT_TRUE(absl::IsNotFound(
      VerifyItem(old.copy.data(), old.copy.size(), KeyHash(key), second.version, {}).status()));
  const std::string other = "other";
  EXPECT_TRUE(absl::IsNotFound(
      VerifyItem(old.copy.data(), old.copy.size(), KeyHash(other), first.version, other).status()));
}

TEST(RemoteItem, RandomBytesNeverVerify) {
  std::mt19937_64 rng(0x5eed);
  std::vector<uint8_t> bytes(512);
  for (int round = 0; round < 20000; ++round) {
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    const uint64_t length = rng() % bytes.size();
    if (round % 2 == 0) {
      // A plausible header: lengths that fit and the checksum flag, so the checksum decides.
      ItemHeader h{rng(), rng(), static_cast<uint32_t>(rng() % 200),
                   static_cast<uint16_t>(1 + rng() % 32), kItemHasChecksum};
      std::memcpy(bytes.data(), &h, sizeof(h));
    }
    uint64_t keyhash, version;
    std::memcpy(&keyhash, bytes.data(), 8);
    std::memcpy(&version, bytes.data() + 8, 8);
    const std::string_view key(reinterpret_cast<const char*>(bytes.data()) + sizeof(ItemHeader),
                               bytes[16] % 32);
    ASSERT_FALSE(VerifyItem(bytes.data(), length, keyhash, version, key).ok()) << round;
  }
}

// The value PUT under `version`: derived from it, so a reader can tell any other bytes.
std::string ValueOf(uint64_t version, size_t bytes) {
  std::string value(bytes, '\0');
  uint64_t x = version * 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ULL;
    value[i] = static_cast<char>(x >> 56);
  }
  return value;
}

// The owner hands a reader thread items to copy, as a NIC's READ would: word by word, in small
// chunks, racing the owner's stores. Orders alternate between three kinds:
//   kQuiet: the owner waits for the copy: it must verify, with exactly the value written;
//   kLapped: the reader stops halfway, the owner overwrites a whole lap of the log, the reader
//     finishes: the copy is torn and must never verify;
//   kRacing: the owner keeps writing while the reader copies: whatever verifies must be exact.
TEST(RemoteItem, CopiesTornByOverwritesNeverVerifyAndWholeOnesAreExact) {
  constexpr uint64_t kLogBytes = 64 << 10;  // 2-4 KiB items: about 20 PUTs per lap
  constexpr size_t kChunkBytes = 64;        // copied between two yields
  constexpr int kOrders = 600;
  enum Kind { kQuiet, kLapped, kRacing };
  auto p = Make(kLogBytes);
  uint8_t* ring = p->region().ring();
  const std::vector<std::string> keys = {"alpha", "beta", "gamma", "delta"};

  // One order at a time. The owner writes its fields, then publishes `ordered`; the reader
  // reports `halfway` and `finished` with the order's number; the owner releases a halted
  // reader with `resume`.
  struct Order {
    uint64_t position = 0, bytes = 0, version = 0;
    int key = 0;
    Kind kind = kQuiet;
  } order;
  std::atomic<uint64_t> ordered{0}, halfway{0}, resume{0}, finished{0};
  std::atomic<bool> done{false};
  uint64_t accepted[3] = {0, 0, 0}, rejected[3] = {0, 0, 0};
  std::string failure;

  std::thread reader([&] {
    std::vector<uint8_t> copy;
    for (uint64_t n = 1;; ++n) {
      while (ordered.load(std::memory_order_acquire) < n) {
        if (done.load()) return;
        std::this_thread::yield();
      }
      const Order o = order;
      copy.assign(o.bytes, 0);
      for (uint64_t off = 0; off < o.bytes; off += 8) {
        if (off == o.bytes / 16 * 8 && o.kind == kLapped) {
          halfway.store(n, std::memory_order_release);
          while (resume.load(std::memory_order_acquire) < n) std::this_thread::yield();
        }
        // Relaxed word loads: racing the owner's stores on purpose, as DMA does.
        const uint64_t word =
            std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(ring + o.position + off))
                .load(std::memory_order_relaxed);
        std::memcpy(copy.data() + off, &word, 8);
        if (off % kChunkBytes == 0) std::this_thread::yield();
      }
      absl::StatusOr<VerifiedItem> item =
          VerifyItem(copy.data(), copy.size(), KeyHash(keys[o.key]), o.version, keys[o.key]);
      if (item.ok()) {
        ++accepted[o.kind];
        if (item->value != ValueOf(o.version, item->value.size()) && failure.empty()) {
          failure = absl::StrCat("accepted a wrong value for version ", o.version);
        }
      } else {
        ++rejected[o.kind];
      }
      finished.store(n, std::memory_order_release);
    }
  });

  std::mt19937_64 rng(42);
  uint64_t clock = 0;  // the partition's last version: only PUTs advance it, by one each
  auto put_one = [&] {
    const int k = static_cast<int>(rng() % keys.size());
    const size_t bytes = 2048 + rng() % 2048;
    const uint64_t version = clock + 1;
    EXPECT_EQ(p->Put(keys[k], KeyHash(keys[k]), ValueOf(version, bytes)).version, version);
    clock = version;
    return ItemBytes(keys[k].size(), bytes, /*checksum=*/true);
  };
  for (int i = 0; i < 8; ++i) put_one();
  for (uint64_t n = 1; n <= kOrders; ++n) {
    const int k = static_cast<int>(rng() % keys.size());
    Response got = p->Get(keys[k], KeyHash(keys[k]), nullptr, 0);
    if (got.result == Result::kNotFound) {  // its last item was lapped by the log: write it again
      const uint64_t version = clock + 1;
      EXPECT_EQ(p->Put(keys[k], KeyHash(keys[k]), ValueOf(version, 3000)).version, version);
      clock = version;
      got = p->Get(keys[k], KeyHash(keys[k]), nullptr, 0);
    }
    EXPECT_EQ(got.result, Result::kBufferTooSmall);
    order = Order{got.item_position, got.item_bytes, got.version, k, static_cast<Kind>(n % 3)};
    ordered.store(n, std::memory_order_release);
    if (order.kind == kLapped) {
      while (halfway.load(std::memory_order_acquire) < n) std::this_thread::yield();
      for (uint64_t written = 0; written < kLogBytes;) written += put_one();
      resume.store(n, std::memory_order_release);
    } else if (order.kind == kRacing) {
      while (finished.load(std::memory_order_acquire) < n) put_one();
    }
    while (finished.load(std::memory_order_acquire) < n) std::this_thread::yield();
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(failure, "");
  EXPECT_EQ(rejected[kQuiet], 0u) << "an untouched item failed its check";
  EXPECT_EQ(accepted[kLapped], 0u) << "a copy torn by a whole lap of the log verified";
  EXPECT_EQ(rejected[kLapped], uint64_t{kOrders / 3});
  RecordProperty("racing_accepted", static_cast<int>(accepted[kRacing]));
  RecordProperty("racing_rejected", static_cast<int>(rejected[kRacing]));
}

}  // namespace
}  // namespace mica
