// Power-failure durability (TableOptions::persistence = kPowerFailure, table.h, persist.h).
// A WriteObserver records every store of the writer and every range made durable, and checks
// the protocol's ordering as it happens: a hop bit is published only once the line it names is
// durable, an occupied line is cleared only once the hop switch that stopped naming it is
// durable, and at Insert's return every line written is durable. Random inserts and updates
// with displacement up to a high load, in memory (the ordering points alone) and on a character
// device (real cache-line flushes). Then a regular file end to end (msync points, reopen).
#include "hopscotch/persist.h"

#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "hopscotch/hash.h"
#include "hopscotch/table.h"
#include "tests/hopscotch/fake_sysfs.h"

namespace hopscotch {
namespace {

using Kind = LookupResult::Kind;

constexpr uint64_t kLineBytes = 64;

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// Follows the writer's stores and durability points; each broken ordering rule is a violation.
class OrderChecker : public WriteObserver {
 public:
  void Attach(const Table* table) { table_ = table; }

  void OnStore(uint64_t offset, uint64_t before, uint64_t after) override {
    ++stores_;
    if (offset >= kHeaderBytes && (offset - kHeaderBytes) % kBucketBytes == 0) {
      CheckWord0((offset - kHeaderBytes) / kBucketBytes, before, after);
    }
    dirty_.insert(offset / kLineBytes);
  }

  void OnPersist(uint64_t offset, uint64_t bytes) override {
    ++persists_;
    for (uint64_t line = offset / kLineBytes; line * kLineBytes < offset + bytes; ++line) {
      dirty_.erase(line);
    }
  }

  bool AllDurable() const { return dirty_.empty(); }
  const std::vector<std::string>& violations() const { return violations_; }
  uint64_t stores() const { return stores_; }
  uint64_t persists() const { return persists_; }

 private:
  static uint64_t LineOfBucket(uint64_t j) {
    return (kHeaderBytes + j * kBucketBytes) / kLineBytes;
  }
  bool Durable(uint64_t j) const { return !dirty_.contains(LineOfBucket(j)); }
  const uint8_t* Bucket(uint64_t j) const {
    return table_->data() + kHeaderBytes + j * kBucketBytes;
  }

  // A store of bucket j's word 0 (info and hop bits).
  void CheckWord0(uint64_t j, uint64_t before, uint64_t after) {
    for (uint32_t bits = WordHop(after) & ~WordHop(before); bits != 0; bits &= bits - 1) {
      const uint64_t named = j + std::countr_zero(bits);
      if (!Durable(named)) {
        violations_.push_back(absl::StrFormat(
            "store %u: hop bit of home %u published bucket %u before it was durable", stores_, j,
            named));
      }
      const uint8_t info = InfoOf(Bucket(named));
      if (!IsOccupied(info) || IsBusy(info)) {
        violations_.push_back(
            absl::StrFormat("store %u: hop bit of home %u names bucket %u, not a complete line",
                            stores_, j, named));
      }
    }
    if (IsOccupied(WordInfo(before)) && !IsOccupied(WordInfo(after))) {  // a source cleared
      const char* key = reinterpret_cast<const char*>(Bucket(j) + kKeyOffset);
      const uint64_t home = table_->HomeOf(std::string_view(key, strnlen(key, kKeyBytes)));
      if (!Durable(home)) {
        violations_.push_back(absl::StrFormat(
            "store %u: bucket %u cleared before the hop switch of home %u was durable", stores_, j,
            home));
      }
      if (((HopOf(Bucket(home)) >> (j - home)) & 1u) != 0) {
        violations_.push_back(absl::StrFormat(
            "store %u: bucket %u cleared while home %u still names it", stores_, j, home));
      }
    }
  }

  const Table* table_ = nullptr;
  std::set<uint64_t> dirty_;  // lines stored to since they were last made durable
  std::vector<std::string> violations_;
  uint64_t stores_ = 0;
  uint64_t persists_ = 0;
};

Value Numbered(std::string_view key, uint32_t n) {
  Value v = ExpectedValue(key);
  std::memcpy(v.data(), &n, sizeof(n));
  return v;
}

// Random inserts, with one update in four, until `target` items or the table is full; checks
// the ordering after every Insert and every value at the end.
void InsertAndCheckOrdering(Table& table, const OrderChecker& checker, uint64_t target) {
  std::mt19937_64 rng(21);
  std::vector<std::string> keys;
  std::vector<uint32_t> versions;
  while (table.items() < target) {
    size_t i = keys.size();
    if (!keys.empty() && rng() % 4 == 0) {
      i = rng() % keys.size();
      ++versions[i];
    } else {
      keys.push_back(absl::StrFormat("user%d", rng()));
      versions.push_back(0);
    }
    const absl::Status s = table.Insert(keys[i], Numbered(keys[i], versions[i]));
    if (absl::IsResourceExhausted(s)) break;
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(checker.violations().empty()) << checker.violations().front();
    ASSERT_TRUE(checker.AllDurable()) << "Insert returned before its lines were durable";
  }
  EXPECT_GT(table.stats().moves, 100u);
  EXPECT_GT(table.stats().updates, 100u);
  EXPECT_GT(table.stats().updates_in_place, 0u);
  ASSERT_TRUE(table.CheckInvariants().ok()) << table.CheckInvariants();
  for (size_t i = 0; i < keys.size(); ++i) {
    const LookupResult r = table.Lookup(keys[i]);
    ASSERT_EQ(r.kind, Kind::kFound) << keys[i];
    EXPECT_EQ(r.value, Numbered(keys[i], versions[i])) << keys[i];
  }
}

constexpr uint64_t kHomeBuckets = 2048;
constexpr uint64_t kHighLoad = kHomeBuckets * 93 / 100;

TEST(PowerFailure, OrderingInMemory) {
  OrderChecker checker;
  TableOptions options;
  options.persistence = Persistence::kPowerFailure;
  options.observer = &checker;
  absl::StatusOr<Table> t = Table::CreateInMemory(kHomeBuckets, 3, options);
  ASSERT_TRUE(t.ok()) << t.status();
  checker.Attach(&*t);
  InsertAndCheckOrdering(*t, checker, kHighLoad);
  EXPECT_GT(checker.persists(), checker.stores() / 16);
}

TEST(PowerFailure, OrderingOnADeviceWithCacheLineFlushes) {
  if (!DevZeroUsable()) GTEST_SKIP() << "no /dev/zero character device here";
  OrderChecker checker;  // outlives the table: Close reports its flushes
  TableOptions options;
  options.persistence = Persistence::kPowerFailure;
  options.observer = &checker;
  options.sysfs_root = FakeSysfs("sys_persist", std::to_string(uint64_t{8} << 20), "2097152");
  options.lock = false;  // /dev/zero is shared with other test processes (fake_sysfs.h)
  absl::StatusOr<Table> t = Table::Create(kDevZero, kHomeBuckets, 4, {}, options);
  ASSERT_TRUE(t.ok()) << t.status();
  checker.Attach(&*t);
  ASSERT_TRUE(checker.AllDurable());
  InsertAndCheckOrdering(*t, checker, kHighLoad);
  std::printf("%s: %lu stores, %lu lines flushed\n",
              std::string(FlushInstructionName(BestFlushInstruction())).c_str(), checker.stores(),
              checker.persists());
}

TEST(PowerFailure, ProcessCrashModeRecordsAndFlushesNothing) {
  OrderChecker checker;
  TableOptions options;
  options.observer = &checker;  // ignored: kProcessCrash has no durability points
  absl::StatusOr<Table> t = Table::CreateInMemory(256, 0, options);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->persistence(), Persistence::kProcessCrash);
  for (int i = 0; i < 200; ++i) {
    const std::string key = absl::StrFormat("user%d", i);
    ASSERT_TRUE(t->Insert(key, ExpectedValue(key)).ok());
  }
  EXPECT_EQ(checker.stores(), 0u);
  EXPECT_EQ(checker.persists(), 0u);
}

// Every key of `keys` is in the table at `path` (reopened writable, repairing if dirty) with
// its value (the first `updated` were rewritten with Numbered(key, 1)).
void ExpectAll(const std::string& path, const TableOptions& options,
               const std::vector<std::string>& keys, size_t updated) {
  absl::StatusOr<Table> t = Table::Open(path, /*writable=*/true, options);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->CheckInvariants().ok()) << t->CheckInvariants();
  EXPECT_EQ(t->items(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const LookupResult r = t->Lookup(keys[i]);
    ASSERT_EQ(r.kind, Kind::kFound) << keys[i];
    EXPECT_EQ(r.value, i < updated ? Numbered(keys[i], 1) : ExpectedValue(keys[i])) << keys[i];
  }
}

// msync at every ordering point of a page-cache file: inserts with displacement and updates,
// Close, reopen in power-failure mode, everything there; then a writer process that exits
// without Close (the header left dirty): its insert is there after the repair.
TEST(PowerFailure, RegularFileEndToEnd) {
  const std::string path = TmpPath("power.hop");
  TableOptions options;
  options.persistence = Persistence::kPowerFailure;
  constexpr size_t kUpdated = 20;
  std::vector<std::string> keys;
  {
    absl::StatusOr<Table> t = Table::Create(path, 256, 7, {}, options);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->persistence(), Persistence::kPowerFailure);
    for (int i = 0; t->items() < 220; ++i) {  // 86%
      keys.push_back(absl::StrFormat("user%d", i));
      ASSERT_TRUE(t->Insert(keys.back(), ExpectedValue(keys.back())).ok());
    }
    EXPECT_GT(t->stats().moves, 0u);
    for (size_t i = 0; i < kUpdated; ++i) {
      ASSERT_TRUE(t->Insert(keys[i], Numbered(keys[i], 1)).ok());
    }
    ASSERT_TRUE(t->Close().ok());
  }
  ExpectAll(path, options, keys, kUpdated);
  keys.push_back("child");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<Table> t = Table::Open(path, true, options);
    if (!t.ok() || !t->Insert("child", ExpectedValue("child")).ok()) _exit(1);
    _exit(0);  // no Close: the header stays dirty
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ExpectAll(path, options, keys, kUpdated);
}

TEST(PowerFailure, ParsePersistence) {
  EXPECT_EQ(*ParsePersistence("process"), Persistence::kProcessCrash);
  EXPECT_EQ(*ParsePersistence("power"), Persistence::kPowerFailure);
  EXPECT_FALSE(ParsePersistence("disk").ok());
  EXPECT_EQ(PersistenceName(Persistence::kPowerFailure), "power");
}

}  // namespace
}  // namespace hopscotch
