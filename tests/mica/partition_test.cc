#include "mica/partition.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "mica/keyhash.h"

namespace mica {
namespace {

struct Found {
  std::string value;
  uint64_t version;
};

// Small helpers over the raw API, for readable tests.
class Store {
 public:
  explicit Store(const PartitionConfig& config) {
    auto partition = Partition::Create(config);
    EXPECT_TRUE(partition.ok()) << partition.status();
    partition_ = *std::move(partition);
    buffer_.resize(config.max_value_bytes);
  }
  Partition& p() { return *partition_; }

  Response Put(const std::string& key, const std::string& value) {
    return partition_->Put(key, KeyHash(key), value);
  }
  Response Delete(const std::string& key) { return partition_->Delete(key, KeyHash(key)); }
  Response Cas(const std::string& key, uint64_t expected, const std::string& value) {
    return partition_->Cas(key, KeyHash(key), expected, value);
  }
  Response Insert(const std::string& key, const std::string& value) {
    return partition_->Insert(key, KeyHash(key), value);
  }
  std::optional<Found> Get(const std::string& key) {
    const Response r = partition_->Get(key, KeyHash(key), buffer_.data(), buffer_.size());
    if (r.result == Result::kNotFound) return std::nullopt;
    EXPECT_EQ(r.result, Result::kOk) << ResultName(r.result);
    return Found{std::string(buffer_.data(), r.value_bytes), r.version};
  }

 private:
  std::unique_ptr<Partition> partition_;
  std::vector<char> buffer_;
};

PartitionConfig SmallConfig() {
  PartitionConfig config;
  config.log_bytes = 1 << 20;
  config.expected_items = 1024;
  config.max_value_bytes = 4096;
  config.try_hugepages = false;
  return config;
}

TEST(Partition, PutGetOverwriteDelete) {
  Store store(SmallConfig());
  EXPECT_FALSE(store.Get("k").has_value());
  const Response first = store.Put("k", "v1");
  ASSERT_EQ(first.result, Result::kOk);
  auto got = store.Get("k");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->value, "v1");
  EXPECT_EQ(got->version, first.version);

  const Response second = store.Put("k", "a longer second value");
  EXPECT_GT(second.version, first.version);
  EXPECT_EQ(store.Get("k")->value, "a longer second value");
  EXPECT_EQ(store.p().stats().overwrites.Get(), 1u);

  EXPECT_EQ(store.Delete("k").result, Result::kOk);
  EXPECT_FALSE(store.Get("k").has_value());
  EXPECT_EQ(store.Delete("k").result, Result::kNotFound);
}

TEST(Partition, EmptyValueIsAValue) {
  Store store(SmallConfig());
  ASSERT_EQ(store.Put("k", "").result, Result::kOk);
  auto got = store.Get("k");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->value, "");
}

TEST(Partition, VersionsIncreaseAcrossDeleteAndReinsert) {
  Store store(SmallConfig());
  const uint64_t v1 = store.Put("k", "a").version;
  const uint64_t deleted = store.Delete("k").version;
  const uint64_t v2 = store.Put("k", "a").version;
  EXPECT_LT(v1, deleted);
  EXPECT_LT(deleted, v2);
  // A CAS that remembers the pre-delete version must not succeed (no ABA).
  EXPECT_EQ(store.Cas("k", v1, "b").result, Result::kCasFailed);
}

TEST(Partition, CasSucceedsOnlyOnTheCurrentVersion) {
  Store store(SmallConfig());
  EXPECT_EQ(store.Cas("k", 0, "x").result, Result::kNotFound);
  const uint64_t v1 = store.Put("k", "one").version;
  const Response stale = store.Cas("k", v1 + 100, "two");
  EXPECT_EQ(stale.result, Result::kCasFailed);
  EXPECT_EQ(stale.version, v1);  // the current version, so the caller can retry
  EXPECT_EQ(store.Get("k")->value, "one");
  const Response ok = store.Cas("k", v1, "two");
  ASSERT_EQ(ok.result, Result::kOk);
  EXPECT_GT(ok.version, v1);
  auto got = store.Get("k");
  EXPECT_EQ(got->value, "two");
  EXPECT_EQ(got->version, ok.version);
  EXPECT_EQ(store.Cas("k", v1, "three").result, Result::kCasFailed);
  EXPECT_EQ(store.p().stats().cas_ok.Get(), 1u);
  EXPECT_EQ(store.p().stats().cas_failed.Get(), 2u);
  EXPECT_EQ(store.p().stats().cas_misses.Get(), 1u);
}

TEST(Partition, InsertStoresOnlyAbsentKeys) {
  Store store(SmallConfig());
  const Response first = store.p().Insert("k", KeyHash("k"), "one");
  ASSERT_EQ(first.result, Result::kOk);
  const Response again = store.p().Insert("k", KeyHash("k"), "two");
  EXPECT_EQ(again.result, Result::kExists);
  EXPECT_EQ(again.version, first.version);  // the current version, as CAS_FAILED reports it
  EXPECT_EQ(store.Get("k")->value, "one");
  ASSERT_EQ(store.Delete("k").result, Result::kOk);
  const Response after_delete = store.p().Insert("k", KeyHash("k"), "three");
  ASSERT_EQ(after_delete.result, Result::kOk);
  EXPECT_GT(after_delete.version, first.version);
  EXPECT_EQ(store.Get("k")->value, "three");
  EXPECT_EQ(store.p().Insert("", KeyHash(""), "x").result, Result::kKeyTooLong);
  EXPECT_EQ(store.p().stats().insert_exists.Get(), 1u);
  EXPECT_EQ(store.p().stats().inserts.Get(), 2u);
}

TEST(Partition, KeyAndValueLimits) {
  PartitionConfig config = SmallConfig();
  config.max_value_bytes = 1000;
  Store store(config);
  const std::string max_key(kMaxKeyBytes, 'k');
  const std::string max_value(1000, 'v');
  ASSERT_EQ(store.Put(max_key, max_value).result, Result::kOk);
  EXPECT_EQ(store.Get(max_key)->value, max_value);
  EXPECT_EQ(store.Put(max_key + "x", "v").result, Result::kKeyTooLong);
  EXPECT_EQ(store.Put("", "v").result, Result::kKeyTooLong);
  EXPECT_EQ(store.Put("k", max_value + "v").result, Result::kValueTooLong);
  EXPECT_EQ(store.Cas(max_key, 1, max_value + "v").result, Result::kValueTooLong);
  EXPECT_EQ(store.Delete(max_key + "x").result, Result::kKeyTooLong);
  EXPECT_EQ(store.p().stats().rejected.Get(), 5u);
}

// A log may be shorter than the largest value's item (issue 15: NO_MEMORY): a write whose item
// is longer than the whole log is refused before it touches anything (no item stored, none
// evicted, no version spent), and an item of exactly the log's length is stored.
TEST(Partition, WritesOfItemsLongerThanTheLogAreNoMemoryAndChangeNothing) {
  constexpr uint64_t kLog = 4096;
  PartitionConfig config = SmallConfig();
  config.log_bytes = kLog;
  config.max_value_bytes = 1 << 20;  // far more than the log holds
  Store store(config);
  ASSERT_EQ(store.p().layout().log_bytes, kLog);
  const Response a = store.Put("a", "alpha");
  const Response b = store.Put("b", "beta");
  ASSERT_EQ(a.result, Result::kOk);
  ASSERT_EQ(b.result, Result::kOk);
  // A 1-byte key and no checksum: header 24 + 1 + value, padded to 8.
  const uint64_t fits = kLog - sizeof(ItemHeader) - 1;
  ASSERT_EQ(ItemBytes(1, fits), kLog);
  const std::string too_long(fits + 1, 'x');
  EXPECT_EQ(store.Put("k", too_long).result, Result::kNoMemory);
  EXPECT_EQ(store.Put("a", too_long).result, Result::kNoMemory);  // an overwrite, too
  EXPECT_EQ(store.Insert("c", too_long).result, Result::kNoMemory);
  EXPECT_EQ(store.Cas("b", b.version, too_long).result, Result::kNoMemory);
  EXPECT_EQ(store.Put("k", std::string(1 << 20, 'x')).result, Result::kNoMemory);
  EXPECT_EQ(store.p().stats().no_memory.Get(), 5u);
  EXPECT_EQ(store.p().stats().evictions.Get(), 0u);
  EXPECT_EQ(store.p().stats().log_wraps.Get(), 0u);
  EXPECT_FALSE(store.Get("k").has_value());
  EXPECT_FALSE(store.Get("c").has_value());
  EXPECT_EQ(store.Get("a")->value, "alpha");
  EXPECT_EQ(store.Get("a")->version, a.version);
  EXPECT_EQ(store.Get("b")->value, "beta");
  EXPECT_EQ(store.Get("b")->version, b.version);
  // No version was spent on the refusals; the whole log is one item's to take.
  const std::string whole_log(fits, 'w');
  const Response w = store.Put("k", whole_log);
  ASSERT_EQ(w.result, Result::kOk);
  EXPECT_EQ(w.version, b.version + 1);
  EXPECT_EQ(store.Get("k")->value, whole_log);
}

// The same bound counts an item's checksum word.
TEST(Partition, TheNoMemoryBoundCountsTheChecksumWord) {
  constexpr uint64_t kLog = 4096;
  PartitionConfig config = SmallConfig();
  config.log_bytes = kLog;
  config.max_value_bytes = 1 << 20;
  config.checksum_from_value_bytes = 64;
  Store store(config);
  const uint64_t fits = kLog - kItemChecksumBytes - sizeof(ItemHeader) - 1;
  ASSERT_EQ(ItemBytes(1, fits, /*checksum=*/true), kLog);
  EXPECT_EQ(store.Put("k", std::string(fits + 1, 'x')).result, Result::kNoMemory);
  ASSERT_EQ(store.Put("k", std::string(fits, 'x')).result, Result::kOk);
  EXPECT_EQ(store.Get("k")->value.size(), fits);
}

// An item the partition itself damaged (its memory, not a caller) is never copied out: a GET of
// a checksummed item verifies it first and answers kCorrupt, leaving the caller's buffer alone.
TEST(Partition, ACheckedItemThatFailsItsChecksumIsNeverCopiedOut) {
  PartitionConfig config = SmallConfig();
  config.checksum_from_value_bytes = 64;
  Store store(config);
  const std::string value(100, 'v');
  ASSERT_EQ(store.Put("k", value).result, Result::kOk);  // the first item: ring position 0
  ASSERT_EQ(store.Get("k")->value, value);
  uint8_t* item = store.p().region().ring();
  uint8_t* value_byte = item + sizeof(ItemHeader) + 1 + 50;
  ASSERT_EQ(*value_byte, 'v');
  *value_byte ^= 0x20;
  char out[128];
  std::memset(out, '-', sizeof(out));
  Response r = store.p().Get("k", KeyHash("k"), out, sizeof(out));
  EXPECT_EQ(r.result, Result::kCorrupt) << ResultName(r.result);
  EXPECT_EQ(r.value_bytes, 0u);
  EXPECT_EQ(std::string(out, sizeof(out)), std::string(sizeof(out), '-'));
  EXPECT_EQ(store.p().stats().corrupt.Get(), 1u);
  // A checksummed length whose flag was lost is damage too.
  *value_byte ^= 0x20;
  ASSERT_EQ(store.Get("k")->value, value);
  reinterpret_cast<ItemHeader*>(item)->flags = 0;
  r = store.p().Get("k", KeyHash("k"), out, sizeof(out));
  EXPECT_EQ(r.result, Result::kCorrupt) << ResultName(r.result);
  // A caller that fetches the item itself (buffer too small) gets its place: it checks its copy.
  EXPECT_EQ(store.p().Get("k", KeyHash("k"), out, 10).result, Result::kBufferTooSmall);
}

TEST(Partition, OneMebibyteValues) {
  PartitionConfig config = SmallConfig();
  config.log_bytes = 8 << 20;
  config.max_value_bytes = 1 << 20;
  Store store(config);
  for (int i = 0; i < 20; ++i) {  // 20 MiB through an 8 MiB log: several wraps
    std::string value(1 << 20, static_cast<char>('a' + i));
    value[0] = static_cast<char>(i);
    ASSERT_EQ(store.Put(absl::StrCat("big", i), value).result, Result::kOk);
    auto got = store.Get(absl::StrCat("big", i));
    ASSERT_TRUE(got.has_value());
    ASSERT_EQ(got->value, value);
  }
  EXPECT_FALSE(store.Get("big0").has_value());  // overwritten by the log
  EXPECT_GE(store.p().stats().log_wraps.Get(), 2u);
}

TEST(Partition, GetIntoASmallBufferReportsTheSize) {
  Store store(SmallConfig());
  store.Put("k", std::string(100, 'v'));
  char small[10];
  const Response r = store.p().Get("k", KeyHash("k"), small, sizeof(small));
  EXPECT_EQ(r.result, Result::kBufferTooSmall);
  EXPECT_EQ(r.value_bytes, 100u);
}

TEST(Partition, ItemsStraddlingTheLogEndReadBackIntact) {
  PartitionConfig config = SmallConfig();
  config.log_bytes = 64 * 1024;
  config.max_value_bytes = 3000;
  Store store(config);
  std::mt19937_64 rng(7);
  uint64_t tail = 0;
  int straddled = 0;
  for (int i = 0; i < 5000; ++i) {
    const std::string key = absl::StrCat("key", i % 300);
    std::string value(rng() % 3000, '\0');
    for (char& c : value) c = static_cast<char>(rng());
    const uint64_t bytes = ItemBytes(key.size(), value.size());
    const uint64_t position = tail % store.p().layout().log_bytes;
    if (position + bytes > store.p().layout().log_bytes) ++straddled;
    tail += bytes;
    ASSERT_EQ(store.Put(key, value).result, Result::kOk);
    auto got = store.Get(key);
    ASSERT_TRUE(got.has_value()) << i;
    ASSERT_EQ(got->value, value) << i;
  }
  EXPECT_GT(straddled, 50);
  EXPECT_GT(store.p().stats().log_wraps.Get(), 100u);
}

// With one bucket every key collides, so the seven slots show the eviction order directly.
TEST(Partition, FullBucketEvictsItsOldestItem) {
  PartitionConfig config = SmallConfig();
  config.bucket_count = 1;
  Store store(config);
  for (int i = 0; i < kSlotsPerBucket; ++i) store.Put(absl::StrCat("k", i), "v");
  store.Put("k7", "v");  // bucket full: k0, the oldest, goes
  EXPECT_FALSE(store.Get("k0").has_value());
  for (int i = 1; i <= 7; ++i) EXPECT_TRUE(store.Get(absl::StrCat("k", i)).has_value()) << i;
  EXPECT_EQ(store.p().stats().evictions.Get(), 1u);

  store.Put("k1", "newer");  // k1 becomes the newest; k2 is now the oldest
  store.Put("k8", "v");
  EXPECT_FALSE(store.Get("k2").has_value());
  EXPECT_EQ(store.Get("k1")->value, "newer");
  EXPECT_TRUE(store.Get("k3").has_value());
}

// KeyHash is public and invertible: for any target hash, 32-byte keys of exactly that KeyHash
// can be written down (its last multiply-fold is the identity for one chosen word, and its
// finalizer is a bijection). This is what a client could do; keyhash.cc's constants are copied
// here, and each key made is checked against the real KeyHash.
namespace key_forgery {
constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kMul1 = 0xa0761d6478bd642fULL;
constexpr uint64_t kMul2 = 0xe7037ed1a0b428dbULL;
constexpr uint64_t kMul3 = 0x8ebc6af09c88c6e3ULL;
constexpr uint64_t kFinal1 = 0xff51afd7ed558ccdULL;
constexpr uint64_t kFinal2 = 0xc4ceb9fe1a85ec53ULL;
uint64_t MulFold(uint64_t a, uint64_t b) {
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
}
uint64_t InverseOf(uint64_t odd) {  // modulo 2^64, by Newton's iteration
  uint64_t x = odd;
  for (int i = 0; i < 6; ++i) x *= 2 - odd * x;
  return x;
}
uint64_t Unfinalize(uint64_t h) {
  h ^= h >> 33;
  h *= InverseOf(kFinal2);
  h ^= h >> 33;
  h *= InverseOf(kFinal1);
  h ^= h >> 33;
  return h;
}
uint64_t Word(const std::string& s, size_t at) {
  uint64_t w;
  std::memcpy(&w, s.data() + at, sizeof(w));
  return w;
}
// A 32-byte key starting with `prefix` (16 bytes) whose KeyHash is `target`.
std::string KeyWithHash(const std::string& prefix, uint64_t target) {
  constexpr uint64_t kBytes = 32;
  const uint64_t h1 = MulFold(Word(prefix, 0) ^ kMul1, Word(prefix, 8) ^ (kSeed ^ kBytes * kMul1));
  const uint64_t a = kMul2 ^ 1;  // MulFold(a ^ kMul2, y) == y
  const uint64_t b = Unfinalize(target) ^ kBytes ^ h1 ^ kMul3;
  std::string key = prefix;
  key.append(reinterpret_cast<const char*>(&a), sizeof(a));
  key.append(reinterpret_cast<const char*>(&b), sizeof(b));
  return key;
}
}  // namespace key_forgery

// Issue 36: a client knows KeyHash (it routes by it) and can make keys with any KeyHash. With
// buckets and tags taken from the keyhash (or from any function of it alone), keys with the
// victim's keyhash all landed in its bucket with its tag, and kSlotsPerBucket PUTs evicted the
// victim's acknowledged value. Buckets and tags now come from IndexHash of the key's bytes under
// the partition's secret key: those keys land anywhere, and the victim stays.
TEST(Partition, KeysForgedWithAVictimsHashCannotEvictIt) {
  PartitionConfig config = SmallConfig();
  config.bucket_count = 1024;
  Store store(config);
  ASSERT_EQ(store.Put("victim", "acknowledged").result, Result::kOk);
  const uint64_t victim = KeyHash("victim");
  for (int i = 0; i < 2 * kSlotsPerBucket; ++i) {
    const std::string key = key_forgery::KeyWithHash(absl::StrFormat("attacker-%07d", i), victim);
    ASSERT_EQ(KeyHash(key), victim) << "the forgery no longer matches mica/keyhash.cc";
    ASSERT_EQ(store.Put(key, "x").result, Result::kOk);
  }
  const std::optional<Found> got = store.Get("victim");
  ASSERT_TRUE(got.has_value()) << "evicted by keys forged with its public hash";
  EXPECT_EQ(got->value, "acknowledged");
  EXPECT_EQ(store.p().stats().evictions.Get(), 0u);
}

// Each partition draws its own key: the same key lands in unrelated buckets of two.
TEST(Partition, EveryPartitionHasItsOwnIndexKey) {
  Store a(SmallConfig());
  Store b(SmallConfig());
  int same = 0;
  for (int i = 0; i < 64; ++i) {
    const std::string key = absl::StrCat("key-", i);
    same += a.p().IndexHash(key) == b.p().IndexHash(key);
  }
  EXPECT_EQ(same, 0);
}

TEST(Partition, DeletedSlotsAreReusedBeforeEvicting) {
  PartitionConfig config = SmallConfig();
  config.bucket_count = 1;
  Store store(config);
  for (int i = 0; i < kSlotsPerBucket; ++i) store.Put(absl::StrCat("k", i), "v");
  store.Delete("k3");
  store.Put("new", "v");
  EXPECT_EQ(store.p().stats().evictions.Get(), 0u);
  for (int i = 0; i < kSlotsPerBucket; ++i) {
    EXPECT_EQ(store.Get(absl::StrCat("k", i)).has_value(), i != 3) << i;
  }
}

TEST(Partition, ItemsOverwrittenByTheLogAreMissesNotGarbage) {
  PartitionConfig config = SmallConfig();
  config.log_bytes = 4096;
  config.max_value_bytes = 100;
  Store store(config);
  store.Put("old", "old value");
  for (int i = 0; i < 200; ++i) store.Put(absl::StrCat("filler", i), std::string(50, 'f'));
  EXPECT_FALSE(store.Get("old").has_value());
}

// A client controls value bytes. A value that carries a forged item header for another key and
// lands exactly where that key's dead item was must never be served: liveness is checked by
// offset, not by trusting whatever bytes sit at the old position.
TEST(Partition, ForgedHeadersInOverwritingValuesAreNeverServed) {
  PartitionConfig config = SmallConfig();
  config.log_bytes = 4096;
  config.max_value_bytes = 1000;
  Store store(config);
  const uint64_t log_bytes = store.p().layout().log_bytes;
  ASSERT_EQ(store.Put("victim", "real").result, Result::kOk);  // item at offset 0
  uint64_t tail = ItemBytes(6, 4);

  // The forged item: the victim's header with a huge version and a fake value.
  std::string forged(sizeof(ItemHeader) + 6 + 6, '\0');
  ItemHeader header{KeyHash("victim"), 1u << 30, 6, 6, 0};
  std::memcpy(forged.data(), &header, sizeof(header));
  std::memcpy(forged.data() + sizeof(header), "victimforged", 12);

  // Fillers up to just before the ring's end, then one whose value spans position 0.
  const std::string filler_key = "f";
  int i = 0;
  while (tail + ItemBytes(8, 200) + 300 < log_bytes) {
    const std::string key = absl::StrCat("filler", i++);
    store.Put(key.substr(0, 8), std::string(200 - key.substr(0, 8).size() + 8, 'x'));
    tail += ItemBytes(8, 200);
  }
  const uint64_t value_start = tail + sizeof(ItemHeader) + filler_key.size();
  const uint64_t pad = log_bytes - value_start;  // value bytes before the ring wraps to 0
  std::string value(pad, 'p');
  value += forged;
  ASSERT_EQ(store.Put(filler_key, value).result, Result::kOk);
  // The forged bytes now sit exactly at the victim's old position.
  const auto* ring = reinterpret_cast<const char*>(store.p().region().ring());
  ASSERT_EQ(std::memcmp(ring, forged.data(), forged.size()), 0);
  EXPECT_FALSE(store.Get("victim").has_value());
}

TEST(Partition, InvalidOpcodeIsRejected) {
  Store store(SmallConfig());
  Request request;
  request.op = static_cast<OpCode>(9);
  request.key = "k";
  request.keyhash = KeyHash("k");
  EXPECT_EQ(store.p().Execute(request).result, Result::kInvalidOp);
}

TEST(PartitionConfig, Validation) {
  PartitionConfig config = SmallConfig();
  config.log_bytes = 4096;
  config.max_value_bytes = 1 << 20;
  // A log shorter than the largest item is allowed (such writes are kNoMemory); the mirror then
  // maps the whole ring again, never more.
  auto small_log = Partition::Create(config);
  ASSERT_TRUE(small_log.ok()) << small_log.status();
  EXPECT_EQ((*small_log)->layout().max_item_bytes, 4096u);
  EXPECT_GE((*small_log)->layout().mirror_bytes, 4096u);
  config = SmallConfig();
  config.bucket_count = 3;
  EXPECT_EQ(Partition::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config = SmallConfig();
  config.log_bytes = 0;
  EXPECT_EQ(Partition::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PartitionLayout, SizesAreRoundedAndReported) {
  PartitionConfig config = SmallConfig();
  config.log_bytes = 3 << 20;  // rounds up to 4 MiB
  config.expected_items = 1000;
  auto partition = Partition::Create(config);
  ASSERT_TRUE(partition.ok());
  const PartitionLayout& layout = (*partition)->layout();
  EXPECT_EQ(layout.log_bytes, 4u << 20);
  // 1000 items at half load over 7-slot buckets: 286 buckets -> 512.
  EXPECT_EQ(layout.bucket_count, 512u);
  EXPECT_EQ(layout.LogCapacityItems(16, 32), (4u << 20) / ItemBytes(16, 32));
  EXPECT_GT(layout.BytesPerItem(16, 32), 0.0);
  EXPECT_NE(layout.Describe(16, 32).find("512 buckets"), std::string::npos);
}

TEST(Status, ResultsMapToAbslCodes) {
  EXPECT_TRUE(ToStatus(Result::kOk).ok());
  EXPECT_EQ(ToStatus(Result::kNotFound).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ToStatus(Result::kCasFailed).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ToStatus(Result::kKeyTooLong).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToStatus(Result::kValueTooLong).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ToStatus(Result::kExists).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ToStatus(Result::kNoMemory).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ToStatus(Result::kCorrupt).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ResultName(Result::kNoMemory), "NO_MEMORY");
  EXPECT_EQ(ResultName(Result::kCorrupt), "CORRUPT");
  EXPECT_EQ(ResultName(Result::kExists), "EXISTS");
  EXPECT_EQ(ResultName(Result::kCasFailed), "CAS_FAILED");
}

// The bucket's version is a sequence lock for readers outside the owning core (a one-sided READ):
// even at rest, 2 higher after every change of the bucket's slots, unchanged by what changes
// none.
const Bucket& BucketOf(Partition& p, const std::string& key) {
  const auto* buckets =
      reinterpret_cast<const Bucket*>(p.region().head() + p.layout().buckets_offset);
  return buckets[p.IndexHash(key) & (p.layout().bucket_count - 1)];
}

TEST(Bucket, SlotsTaggedMarksExactlyTheSlotsCarryingTheTag) {
  Bucket bucket{};
  bucket.version = 0xffffffffu;  // the version and link words are never slots
  bucket.next_extra = 0xffffffffu;
  bucket.slots[0] = MakeSlot(5, 0);
  bucket.slots[1] = 0;  // empty
  bucket.slots[2] = MakeSlot(5, kSlotOffsetMask);
  bucket.slots[3] = MakeSlot(7, 64);
  bucket.slots[4] = MakeSlot(0xffff, 64);
  bucket.slots[5] = MakeSlot(5 | 0x100, 64);  // differs from 5 in a high bit of the tag only
  bucket.slots[6] = MakeSlot(5, 128);
  EXPECT_EQ(SlotsTagged(bucket, 5), 0b1000101u);
  EXPECT_EQ(SlotsTagged(bucket, 7), 0b0001000u);
  EXPECT_EQ(SlotsTagged(bucket, 0xffff), 0b0010000u);
  EXPECT_EQ(SlotsTagged(bucket, 5 | 0x100), 0b0100000u);
  EXPECT_EQ(SlotsTagged(bucket, 1), 0u) << "no empty slot matches a (never zero) tag";
}

TEST(Item, ItemKeyIsComparesEveryByteOfEveryLength) {
  std::vector<uint64_t> words(64);
  auto* item = reinterpret_cast<ItemHeader*>(words.data());
  char* stored = reinterpret_cast<char*>(words.data()) + sizeof(ItemHeader);
  for (size_t n = 1; n <= 40; ++n) {
    std::string key(n, 'a');
    for (size_t i = 0; i < n; ++i) key[i] = static_cast<char>('a' + (i * 7) % 26);
    std::memcpy(stored, key.data(), n);
    item->key_bytes = static_cast<uint16_t>(n);
    stored[n] = 'z';  // a byte past the key never counts
    EXPECT_TRUE(ItemKeyIs(item, key)) << n;
    for (size_t i = 0; i < n; ++i) {
      std::string other = key;
      other[i] = static_cast<char>(other[i] ^ 0x20);
      EXPECT_FALSE(ItemKeyIs(item, other)) << "length " << n << ", byte " << i;
    }
  }
}

// A bucket may hold several slots of a lookup's tag (16-bit tags collide): a lookup checks each
// one's item, not only the first. Forged here: one bucket for every key, and a slot of key B's
// item rewritten to carry key A's tag, placed before A's own slot.
TEST(Partition, ALookupChecksEveryCandidateSlotOfItsTag) {
  for (const StoreMode mode : {StoreMode::kCache, StoreMode::kStore}) {
    SCOPED_TRACE(StoreModeName(mode));
    PartitionConfig config = SmallConfig();
    config.mode = mode;
    config.bucket_count = 1;
    if (mode == StoreMode::kStore) config.pool_bytes = 4 << 20;
    Store s(config);
    // Key B: the first whose tag differs from A's (the index key, so the tags, are random).
    const uint16_t tag_a = TagOf(s.p().IndexHash("key-a"));
    std::string key_b;
    for (int i = 0; key_b.empty() || TagOf(s.p().IndexHash(key_b)) == tag_a; ++i) {
      key_b = absl::StrCat("key-b", i);
    }
    const uint16_t tag_b = TagOf(s.p().IndexHash(key_b));
    ASSERT_EQ(s.Put("key-a", "value-a").result, Result::kOk);
    ASSERT_EQ(s.Put(key_b, "value-b").result, Result::kOk);
    auto* bucket = reinterpret_cast<Bucket*>(s.p().region().head() + s.p().layout().buckets_offset);
    int slot_a = -1, slot_b = -1;
    for (int i = 0; i < kSlotsPerBucket; ++i) {
      if (bucket->slots[i] != 0 && SlotTag(bucket->slots[i]) == tag_a) slot_a = i;
      if (bucket->slots[i] != 0 && SlotTag(bucket->slots[i]) == tag_b) slot_b = i;
    }
    ASSERT_GE(slot_a, 0);
    ASSERT_GE(slot_b, 0);
    // B's item under A's tag, in the lower slot (looked at first), A's slot in the higher one.
    const uint64_t item_a = SlotOffset(bucket->slots[slot_a]);
    const uint64_t item_b = SlotOffset(bucket->slots[slot_b]);
    const int low = std::min(slot_a, slot_b), high = std::max(slot_a, slot_b);
    bucket->slots[low] = MakeSlot(tag_a, item_b);
    bucket->slots[high] = MakeSlot(tag_a, item_a);
    const std::optional<Found> a = s.Get("key-a");
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(a->value, "value-a");
    // The batch path finds the same.
    char out[64];
    Request request;
    request.op = OpCode::kGet;
    request.key = "key-a";
    request.keyhash = KeyHash("key-a");
    request.value_out = out;
    request.value_out_bytes = sizeof(out);
    Response response;
    s.p().ExecuteBatch({&request, 1}, {&response, 1});
    ASSERT_EQ(response.result, Result::kOk);
    EXPECT_EQ(std::string(out, response.value_bytes), "value-a");
    EXPECT_FALSE(s.Get(key_b).has_value()) << "B's item is indexed under A's tag only now";
  }
}

TEST(BucketSeqlock, EveryChangeMovesTheVersionByTwoAndLeavesItEven) {
  Store s(SmallConfig());
  const Bucket& bucket = BucketOf(s.p(), "k");
  const uint32_t v0 = bucket.version;
  EXPECT_EQ(v0 % 2, 0u);
  ASSERT_EQ(s.Put("k", "one").result, Result::kOk);
  EXPECT_EQ(bucket.version, v0 + 2);
  const Response two = s.Put("k", "two");
  EXPECT_EQ(bucket.version, v0 + 4);
  ASSERT_TRUE(s.Get("k").has_value());
  EXPECT_EQ(bucket.version, v0 + 4) << "a GET changes nothing";
  EXPECT_EQ(s.Cas("k", two.version + 1, "x").result, Result::kCasFailed);
  EXPECT_EQ(bucket.version, v0 + 4) << "a failed CAS changes nothing";
  ASSERT_EQ(s.Cas("k", two.version, "three").result, Result::kOk);
  EXPECT_EQ(bucket.version, v0 + 6);
  ASSERT_EQ(s.Delete("k").result, Result::kOk);
  EXPECT_EQ(bucket.version, v0 + 8);
  EXPECT_EQ(s.Delete("k").result, Result::kNotFound);
  EXPECT_EQ(bucket.version, v0 + 8) << "a DELETE that finds nothing changes nothing";
  Bucket copy;
  EXPECT_TRUE(ReadBucketConsistently(bucket, &copy));
  EXPECT_EQ(copy.version, v0 + 8);
}

// A reader on another thread, while the owner keeps changing one bucket: every copy it accepts
// carries an even version, and the versions it accepts never go back.
TEST(BucketSeqlock, AConcurrentReaderAcceptsOnlyEvenRisingVersions) {
  PartitionConfig config = SmallConfig();
  config.expected_items = 8;  // a handful of buckets: the keys below share a few
  Store s(config);
  const Bucket& bucket = BucketOf(s.p(), "key-0");
  constexpr int kWrites = 20000;
  std::atomic<bool> done{false}, started{false};
  std::atomic<uint64_t> accepted{0};
  std::thread reader([&] {
    uint32_t last = 0;
    Bucket copy;
    started.store(true, std::memory_order_release);
    while (!done.load(std::memory_order_acquire)) {
      if (!ReadBucketConsistently(bucket, &copy)) continue;
      EXPECT_EQ(copy.version % 2, 0u);
      EXPECT_GE(copy.version, last);
      last = copy.version;
      accepted.fetch_add(1, std::memory_order_relaxed);
    }
  });
  // The writes overlap the reads only if the reader runs: on a loaded machine (ASan, 2 cores)
  // it may be scheduled after a short write loop has ended.
  while (!started.load(std::memory_order_acquire)) std::this_thread::yield();
  for (int i = 0; i < kWrites; ++i) {
    const std::string key = absl::StrCat("key-", i % 4);
    ASSERT_EQ((i % 3 == 2 ? s.Delete(key) : s.Put(key, "v")).result == Result::kInvalidOp, false);
  }
  // A bucket at rest always reads consistently: the reader accepts at least once more.
  const uint64_t before = accepted.load();
  while (accepted.load() == before) std::this_thread::yield();
  done.store(true, std::memory_order_release);
  reader.join();
  EXPECT_GT(accepted.load(), 0u);
  EXPECT_EQ(bucket.version % 2, 0u);
}

}  // namespace
}  // namespace mica
