// One writer inserts (with displacement) and updates while reader threads copy neighbourhoods
// the way a READ does (CopyLines: each line as of one instant, ascending) and look keys up with
// the pure reader. Every found value must belong to the key and be no older than the last update
// finished before the copy began; every key inserted before the copy began must be found.
#include <atomic>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "hopscotch/hash.h"
#include "hopscotch/neighbourhood.h"
#include "hopscotch/table.h"

namespace hopscotch {
namespace {

using Kind = LookupResult::Kind;

// Key i's value of generation g: i, g, and 19 bytes that depend on both (a mix of two values
// fails the check).
Value ValueOf(uint32_t i, uint32_t g) {
  Value v = ExpectedValue(absl::StrFormat("%u:%u", i, g));
  std::memcpy(v.data(), &i, 4);
  std::memcpy(v.data() + 4, &g, 4);
  return v;
}

struct Counts {
  uint64_t lookups = 0, torn = 0, found = 0, via_scan = 0, wrong = 0, false_misses = 0;
};

TEST(Race, ReadersNeverSeeWrongValuesOrFalseMisses) {
  constexpr int kRounds = 30;
  constexpr uint64_t kHomeBuckets = 1024;
  constexpr uint32_t kKeys = 1100;  // more than fit: the writer runs into a full table
  constexpr int kUpdates = 6000;
  constexpr int kReaders = 2;
  Counts total;
  uint64_t moves = 0, in_place = 0;
  for (int round = 0; round < kRounds; ++round) {
    absl::StatusOr<Table> table = Table::CreateInMemory(kHomeBuckets, round);
    ASSERT_TRUE(table.ok());
    std::vector<std::string> keys;
    for (uint32_t i = 0; i < kKeys; ++i) keys.push_back(absl::StrFormat("user%u-%d", i, round));
    std::atomic<uint32_t> published{0};
    std::vector<std::atomic<uint32_t>> started(kKeys), done(kKeys);
    std::atomic<bool> stop{false};

    std::thread writer([&] {
      for (uint32_t i = 0; i < kKeys; ++i) {
        const absl::Status s = table->Insert(keys[i], ValueOf(i, 0));
        if (!s.ok()) break;  // full
        published.store(i + 1, std::memory_order_release);
      }
      std::mt19937_64 rng(round);
      const uint32_t n = published.load();
      for (int u = 0; u < kUpdates && n > 0; ++u) {
        const uint32_t i = static_cast<uint32_t>(rng() % n);
        const uint32_t g = started[i].load() + 1;
        started[i].store(g, std::memory_order_release);
        EXPECT_TRUE(table->Insert(keys[i], ValueOf(i, g)).ok());
        done[i].store(g, std::memory_order_release);
      }
      stop.store(true);
    });
    std::vector<Counts> counts(kReaders);
    std::vector<std::thread> readers;
    for (int t = 0; t < kReaders; ++t) {
      readers.emplace_back([&, t] {
        std::mt19937_64 rng(1000 * round + t);
        Counts& c = counts[t];
        alignas(64) uint8_t copy[kNeighbourhoodBytes];
        while (!stop.load(std::memory_order_relaxed)) {
          const uint32_t i = static_cast<uint32_t>(
              rng() % std::min(kKeys, published.load(std::memory_order_acquire) + 16));
          const bool present = i < published.load(std::memory_order_acquire);
          const uint32_t oldest = done[i].load(std::memory_order_acquire);
          const uint8_t* first = table->NeighbourhoodOf(table->HomeOf(keys[i]));
          LookupResult r;
          for (;;) {
            CopyLines(first, kNeighbourhood, copy);
            r = FindInNeighbourhood(Snapshot(copy, kNeighbourhoodBytes), keys[i]);
            if (r.kind != Kind::kTorn) break;
            ++c.torn;
          }
          const uint32_t newest = started[i].load(std::memory_order_acquire);
          ++c.lookups;
          if (r.kind == Kind::kFound) {
            ++c.found;
            if (!r.via_hop) ++c.via_scan;
            uint32_t vi, vg;
            std::memcpy(&vi, r.value.data(), 4);
            std::memcpy(&vg, r.value.data() + 4, 4);
            if (vi != i || vg < oldest || vg > newest || r.value != ValueOf(vi, vg)) ++c.wrong;
          } else if (present) {
            ++c.false_misses;
          }
        }
      });
    }
    writer.join();
    for (std::thread& r : readers) r.join();
    ASSERT_TRUE(table->CheckInvariants().ok()) << table->CheckInvariants();
    moves += table->stats().moves;
    in_place += table->stats().updates_in_place;
    for (const Counts& c : counts) {
      total.lookups += c.lookups;
      total.torn += c.torn;
      total.found += c.found;
      total.via_scan += c.via_scan;
      total.wrong += c.wrong;
      total.false_misses += c.false_misses;
    }
  }
  std::printf(
      "%lu lookups, %lu found (%lu by the scan, not the hop bits), %lu torn re-reads, %lu moves, "
      "%lu in-place updates\n",
      total.lookups, total.found, total.via_scan, total.torn, moves, in_place);
  EXPECT_EQ(total.wrong, 0u);
  EXPECT_EQ(total.false_misses, 0u);
  EXPECT_GT(total.lookups, 1000u);  // the readers did run beside the writer
  EXPECT_GT(moves, 0u);
}

}  // namespace
}  // namespace hopscotch
