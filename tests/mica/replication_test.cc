// Replication at the partition level (issue 16's foundation, issue 20's "replication must work
// in both modes"): a primary records the byte ranges of its region each batch changes
// (Partition::set_change_recorder); copying just those ranges into a replica's region, at the
// same offsets, as a backup's RDMA WRITEs would, keeps the replica byte-identical; and a replica
// promoted at any point (ResumeFromRegion) answers every later operation exactly as the primary
// does, allocating where the primary allocates.
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "mica/keyhash.h"
#include "mica/partition.h"

namespace mica {
namespace {

constexpr uint32_t kMaxValue = 2048;
constexpr int kKeys = 300;
constexpr int kMaxBatch = 32;
constexpr int kRounds = 3000;
// Every so many rounds the replica is promoted and both run the same batches side by side.
constexpr int kPromoteEvery = 500;
constexpr int kSideBySideRounds = 50;
// Ranges one batch may record: up to about 10 per mutation.
constexpr size_t kRecorderCapacity = 16 * kMaxBatch;

PartitionConfig ConfigFor(StoreMode mode) {
  PartitionConfig config;
  config.mode = mode;
  config.log_bytes = 256 << 10;   // cache mode: the log laps many times
  config.pool_bytes = 128 << 10;  // store mode: fills to NO_MEMORY now and then
  config.bucket_count = 8;        // full buckets: evictions (cache), chains of 5-6 (store)
  config.extra_bucket_count = 64;
  config.max_value_bytes = kMaxValue;
  config.checksum_from_value_bytes = 0;  // a replicated partition checksums every item
  config.try_hugepages = false;
  return config;
}

// A random batch over few keys and mixed sizes (repeats within a batch included).
struct Batch {
  std::vector<std::string> keys, values;
  std::vector<Request> requests;
};
void MakeBatch(std::mt19937_64& rng, int round, Batch* b, std::vector<std::vector<char>>* outs) {
  const int n = 1 + static_cast<int>(rng() % kMaxBatch);
  b->keys.assign(n, "");
  b->values.assign(n, "");
  b->requests.assign(n, Request{});
  for (int i = 0; i < n; ++i) {
    b->keys[i] = absl::StrCat("key", rng() % kKeys);
    const uint32_t bytes = rng() % 4 == 0 ? rng() % (kMaxValue + 1) : rng() % 100;
    b->values[i] = std::string(bytes, static_cast<char>('a' + (round + i) % 26));
  }
  for (int i = 0; i < n; ++i) {
    Request& r = b->requests[i];
    r.op = static_cast<OpCode>(rng() % 5);
    r.key = b->keys[i];
    r.keyhash = KeyHash(b->keys[i]);
    r.value = b->values[i];
    r.expected_version = rng() % 2 ? 0 : rng() % (round * 8 + 1);
    r.value_out = (*outs)[i].data();
    r.value_out_bytes = kMaxValue;
  }
}

uint64_t RegionBytes(const Partition& p) {
  return p.region().head_bytes() + p.region().ring_bytes();  // the mirror maps the ring again
}

class Replication : public ::testing::TestWithParam<StoreMode> {};

TEST_P(Replication, ChangedRangesKeepAReplicaIdenticalAndPromotable) {
  const StoreMode mode = GetParam();
  auto primary_or = Partition::Create(ConfigFor(mode));
  auto replica_or = Partition::Create(ConfigFor(mode));
  ASSERT_TRUE(primary_or.ok() && replica_or.ok());
  Partition& primary = **primary_or;
  Partition& replica = **replica_or;
  ASSERT_EQ(RegionBytes(primary), RegionBytes(replica));
  // The replica starts as a copy (as a backup's state transfer makes it): Create formats alike
  // but for the random index key in the header (mica/index_hash.h), which the copy carries.
  std::memcpy(replica.region().base(), primary.region().base(), RegionBytes(primary));
  DirtyRanges changes(kRecorderCapacity);
  primary.set_change_recorder(&changes);

  std::mt19937_64 rng(mode == StoreMode::kStore ? 16 : 61);
  std::vector<std::vector<char>> outs(kMaxBatch, std::vector<char>(kMaxValue));
  std::vector<std::vector<char>> replica_outs(kMaxBatch, std::vector<char>(kMaxValue));
  std::vector<Response> responses(kMaxBatch), replica_responses(kMaxBatch);
  uint64_t mutations = 0, copied_bytes = 0, copied_ranges = 0, overflows = 0, promotions = 0;
  uint64_t no_memory = 0;
  Batch batch;
  int side_by_side = 0;
  for (int round = 1; round <= kRounds; ++round) {
    MakeBatch(rng, round, &batch, &outs);
    const size_t n = batch.requests.size();
    primary.ExecuteBatch(batch.requests, absl::MakeSpan(responses.data(), n));
    for (size_t i = 0; i < n; ++i) {
      mutations += batch.requests[i].op != OpCode::kGet && responses[i].result == Result::kOk;
      no_memory += responses[i].result == Result::kNoMemory;
    }
    if (side_by_side > 0) {
      // The promoted replica runs the same batch: the same answers, bit for bit.
      Batch same = batch;
      for (size_t i = 0; i < n; ++i) same.requests[i].value_out = replica_outs[i].data();
      // Its own changes are not recorded: the copy below must find its bytes already equal.
      replica.ExecuteBatch(same.requests, absl::MakeSpan(replica_responses.data(), n));
      for (size_t i = 0; i < n; ++i) {
        const Response& a = responses[i];
        const Response& b = replica_responses[i];
        ASSERT_EQ(a.result, b.result) << "round " << round << " op " << i;
        ASSERT_EQ(a.version, b.version) << "round " << round << " op " << i;
        ASSERT_EQ(a.item_position, b.item_position) << "round " << round << " op " << i;
        ASSERT_EQ(a.value_bytes, b.value_bytes);
        if (a.result == Result::kOk && batch.requests[i].op == OpCode::kGet) {
          ASSERT_EQ(std::memcmp(outs[i].data(), replica_outs[i].data(), a.value_bytes), 0);
        }
      }
      --side_by_side;
    }
    // The backup's WRITEs: each changed range, at the same offset.
    overflows += changes.overflowed();
    for (const ByteRange& r : changes.ranges()) {
      ASSERT_LE(r.offset + r.bytes, primary.region().mapped_bytes());
      std::memcpy(replica.region().base() + r.offset, primary.region().base() + r.offset, r.bytes);
      copied_bytes += r.bytes;
      ++copied_ranges;
    }
    changes.Clear();
    ASSERT_EQ(std::memcmp(primary.region().base(), replica.region().base(), RegionBytes(primary)),
              0)
        << "round " << round << ": a change the recorder missed";
    if (round % kPromoteEvery == 0) {
      ASSERT_TRUE(replica.ResumeFromRegion().ok()) << "round " << round;
      ++promotions;
      side_by_side = kSideBySideRounds;
    }
  }
  EXPECT_EQ(promotions, static_cast<uint64_t>(kRounds / kPromoteEvery));
  EXPECT_GT(mutations, 10000u);
  EXPECT_EQ(overflows, 0u) << "the recorder was too small: ranges merged into supersets";
  // The ranges are the changes, not the region: a mutation copies a small fraction of it.
  const double bytes_per_mutation = static_cast<double>(copied_bytes) / mutations;
  EXPECT_LT(bytes_per_mutation, 4.0 * kMaxValue);
  if (mode == StoreMode::kStore) {
    EXPECT_GT(no_memory, 0u) << "the store never filled";
    std::string why;
    EXPECT_TRUE(replica.CheckStoreInvariants(&why)) << why;
  } else {
    EXPECT_GT(primary.stats().log_wraps.Get(), 10u);
  }
  std::cout << "[replication] " << std::string(StoreModeName(mode)) << ": " << mutations
            << " mutations, " << static_cast<double>(copied_ranges) / mutations << " ranges and "
            << bytes_per_mutation << " bytes copied per mutation (values 0.." << kMaxValue
            << " B), " << promotions << " promotions" << std::endl;
  RecordProperty("bytes_per_mutation", static_cast<int>(bytes_per_mutation));
}

INSTANTIATE_TEST_SUITE_P(BothModes, Replication,
                         ::testing::Values(StoreMode::kCache, StoreMode::kStore),
                         [](const ::testing::TestParamInfo<StoreMode>& info) {
                           return std::string(StoreModeName(info.param));
                         });

// A region that is not this partition's (another mode's, or never written) is refused.
TEST(Replication, ResumeRefusesAForeignRegion) {
  auto cache = Partition::Create(ConfigFor(StoreMode::kCache));
  auto store = Partition::Create(ConfigFor(StoreMode::kStore));
  ASSERT_TRUE(cache.ok() && store.ok());
  EXPECT_TRUE((*store)->ResumeFromRegion().ok());
  // The store's header overwritten with the cache's: a mode mismatch.
  std::memcpy((*store)->region().base(), (*cache)->region().base(), sizeof(PartitionHeader));
  EXPECT_EQ((*store)->ResumeFromRegion().code(), absl::StatusCode::kFailedPrecondition);
  std::memset((*store)->region().base(), 0, sizeof(PartitionHeader));
  EXPECT_EQ((*store)->ResumeFromRegion().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mica
