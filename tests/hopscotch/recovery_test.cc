// Durability: every prefix of the writer's stores reopens consistent. First each prefix of a
// move, an insert and an update, laid into a closed file by hand; then a writer process killed
// with SIGKILL at random points: every insert it acknowledged is there after reopening.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "hopscotch/hash.h"
#include "hopscotch/table.h"

namespace hopscotch {
namespace {

using Kind = LookupResult::Kind;

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// A closed table of 256 home buckets at 60% load; its keys in *keys.
std::string Build(const std::string& name, std::vector<std::string>* keys) {
  const std::string path = TmpPath(name);
  absl::StatusOr<Table> t = Table::Create(path, 256);
  EXPECT_TRUE(t.ok());
  for (int i = 0; t->items() < 154; ++i) {
    keys->push_back(absl::StrFormat("user%d", i));
    EXPECT_TRUE(t->Insert(keys->back(), ExpectedValue(keys->back())).ok());
  }
  EXPECT_TRUE(t->Close().ok());
  return path;
}

struct Line {
  uint8_t bytes[kBucketBytes];
};

class RawFile {
 public:
  explicit RawFile(const std::string& path) : fd_(open(path.c_str(), O_RDWR)) {}
  ~RawFile() { close(fd_); }
  Line Get(uint64_t j) {
    Line l;
    EXPECT_EQ(pread(fd_, l.bytes, kBucketBytes, kHeaderBytes + j * kBucketBytes), kBucketBytes);
    return l;
  }
  void Put(uint64_t j, const Line& l) {
    EXPECT_EQ(pwrite(fd_, l.bytes, kBucketBytes, kHeaderBytes + j * kBucketBytes), kBucketBytes);
  }
  void SetHop(uint64_t j, uint32_t hop) {
    Line l = Get(j);
    std::memcpy(l.bytes + kHopOffset, &hop, 4);
    Put(j, l);
  }
  void MarkDirty() {
    const uint64_t dirty = kStateDirty;
    EXPECT_EQ(pwrite(fd_, &dirty, 8, offsetof(Header, state)), 8);
  }

 private:
  int fd_;
};

// Some key x at bucket s, home g, with a free bucket e in (s, g + H).
struct MoveSite {
  std::string key;
  uint64_t s = 0, e = 0, g = 0;
};

MoveSite FindMoveSite(const std::string& path, const std::vector<std::string>& keys) {
  absl::StatusOr<Table> t = Table::Open(path, false);
  EXPECT_TRUE(t.ok());
  RawFile raw(path);
  for (const std::string& key : keys) {
    const uint64_t g = t->HomeOf(key);
    const LookupResult r = t->Lookup(key);
    const uint64_t s = g + r.offset;
    for (uint64_t e = s + 1; e < g + kNeighbourhood; ++e) {
      if (!IsOccupied(raw.Get(e).bytes[0])) return MoveSite{key, s, e, g};
    }
  }
  ADD_FAILURE() << "no key with a free bucket above it";
  return {};
}

// Reopens writable (repairing) and checks: invariants, every key with its value, `items` keys.
Table ReopenAndCheck(const std::string& path, const std::vector<std::string>& keys) {
  absl::StatusOr<Table> t = Table::Open(path, true);
  EXPECT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->CheckInvariants().ok()) << t->CheckInvariants();
  EXPECT_EQ(t->items(), keys.size());
  for (const std::string& key : keys) {
    const LookupResult r = t->Lookup(key);
    EXPECT_EQ(r.kind, Kind::kFound) << key;
    EXPECT_EQ(r.value, ExpectedValue(key)) << key;
  }
  return *std::move(t);
}

TEST(Recovery, MoveCutAfterTheCopy) {
  std::vector<std::string> keys;
  const std::string path = Build("move1.hop", &keys);
  const MoveSite m = FindMoveSite(path, keys);
  RawFile raw(path);
  raw.Put(m.e, raw.Get(m.s));  // the destination filled; no hop switch yet
  raw.MarkDirty();
  Table t = ReopenAndCheck(path, keys);
  EXPECT_EQ(t.stats().recovered_orphans, 1u);
}

TEST(Recovery, MoveCutAfterTheSwitch) {
  std::vector<std::string> keys;
  const std::string path = Build("move2.hop", &keys);
  const MoveSite m = FindMoveSite(path, keys);
  RawFile raw(path);
  raw.Put(m.e, raw.Get(m.s));
  const uint32_t hop = HopOf(raw.Get(m.g).bytes);
  raw.SetHop(m.g, (hop | (1u << (m.e - m.g))) & ~(1u << (m.s - m.g)));  // source not cleared
  raw.MarkDirty();
  Table t = ReopenAndCheck(path, keys);
  EXPECT_EQ(t.stats().recovered_orphans, 1u);
  EXPECT_EQ(t.Lookup(m.key).offset, static_cast<int>(m.e - m.g));
}

TEST(Recovery, FillCutShortAndInsertNotYetLinked) {
  std::vector<std::string> keys;
  const std::string path = Build("fill.hop", &keys);
  const MoveSite m = FindMoveSite(path, keys);
  RawFile raw(path);
  Line busy = raw.Get(m.s);
  busy.bytes[0] = 1;  // busy, empty: a fill cut short, half its words written
  std::memset(busy.bytes + 40, 0xab, 24);
  raw.Put(m.e, busy);
  raw.MarkDirty();
  {
    Table t = ReopenAndCheck(path, keys);
    EXPECT_EQ(t.stats().recovered_busy, 1u);
  }
  // A new key's line complete but no hop bit yet: never acknowledged, so absent after reopen.
  Line orphan = raw.Get(m.s);
  std::memcpy(orphan.bytes + kKeyOffset, PadKey("unlinked").data(), kKeyBytes);
  raw.Put(m.e, orphan);
  raw.MarkDirty();
  Table t = ReopenAndCheck(path, keys);
  EXPECT_EQ(t.stats().recovered_orphans, 1u);
  EXPECT_EQ(t.Lookup("unlinked").kind, Kind::kMiss);
}

TEST(Recovery, InPlaceUpdateCutShortKeepsTheKey) {
  std::vector<std::string> keys;
  const std::string path = Build("update.hop", &keys);
  const MoveSite m = FindMoveSite(path, keys);
  RawFile raw(path);
  Line l = raw.Get(m.s);
  l.bytes[0] = static_cast<uint8_t>(kOccupied | ((l.bytes[0] + 1) & kVersionMask));  // odd
  raw.Put(m.s, l);
  raw.MarkDirty();
  Table t = ReopenAndCheck(path, keys);  // value bytes unchanged here, so still the old value
  EXPECT_EQ(t.stats().recovered_busy, 1u);
}

// Issue 36: a file marked clean was trusted line by line, so one busy line in it (damage, or a
// hand edit) made every lookup reaching it reread it to the limit and end torn. Read-only it is
// refused, naming the file and the bucket; writable it is repaired as a dirty file is.
TEST(Recovery, BusyLineInACleanFileIsRefusedReadOnlyAndRepairedWritable) {
  std::vector<std::string> keys;
  const std::string path = Build("clean_busy.hop", &keys);
  const MoveSite m = FindMoveSite(path, keys);  // m.key sits in bucket m.s
  {
    RawFile raw(path);
    Line l = raw.Get(m.s);
    l.bytes[0] = static_cast<uint8_t>(kOccupied | ((l.bytes[0] + 1) & kVersionMask));  // odd
    raw.Put(m.s, l);  // the header still says clean
  }
  {
    absl::StatusOr<Table> t = Table::Open(path, /*writable=*/false);
    ASSERT_FALSE(t.ok()) << "a clean file with a busy line was served read-only";
    const std::string message(t.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(
        message.find(absl::StrFormat("1 buckets are busy (mid-rewrite), the first bucket %u", m.s)),
        std::string::npos)
        << message;
  }
  Table t = ReopenAndCheck(path, keys);  // writable: repaired, every key with its value
  EXPECT_EQ(t.stats().recovered_busy, 1u);
  const LookupResult r = t.Lookup(m.key, /*max_reads=*/2);
  EXPECT_EQ(r.kind, Kind::kFound);
  EXPECT_EQ(r.rereads, 0);
  ASSERT_TRUE(t.Close().ok());
  absl::StatusOr<Table> again = Table::Open(path, /*writable=*/false);  // clean and sound now
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->items(), keys.size());
}

// A writer process inserting and acknowledging each insert over a pipe, killed with SIGKILL.
TEST(Recovery, KillNineKeepsEveryAcknowledgedInsert) {
  std::mt19937_64 rng(11);
  for (int run = 0; run < 4; ++run) {
    const std::string path = TmpPath(absl::StrFormat("kill%d.hop", run));
    ASSERT_TRUE(Table::Create(path, 1 << 14).ok());  // created and closed clean, empty
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(fds[0]);
      absl::StatusOr<Table> t = Table::Open(path, true);
      if (!t.ok()) _exit(2);
      for (uint32_t i = 0;; ++i) {
        const std::string key = absl::StrFormat("user%u", i);
        if (!t->Insert(key, ExpectedValue(key)).ok()) break;
        if (write(fds[1], &i, sizeof(i)) != sizeof(i)) _exit(3);
      }
      for (;;) pause();  // full: wait for the kill
    }
    close(fds[1]);
    const uint32_t kill_after = 1000 + static_cast<uint32_t>(rng() % 10000);
    uint32_t acked = 0, i;
    while (acked < kill_after && read(fds[0], &i, sizeof(i)) == sizeof(i)) acked = i + 1;
    kill(child, SIGKILL);
    int status;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status));
    while (read(fds[0], &i, sizeof(i)) == sizeof(i)) acked = i + 1;  // written before the kill
    close(fds[0]);
    absl::StatusOr<Table> t = Table::Open(path, true);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(t->CheckInvariants().ok()) << t->CheckInvariants();
    EXPECT_GE(t->items(), acked);
    EXPECT_LE(t->items(), acked + 1);  // at most the insert in flight
    for (uint32_t k = 0; k < acked; ++k) {
      const std::string key = absl::StrFormat("user%u", k);
      const LookupResult r = t->Lookup(key);
      ASSERT_EQ(r.kind, Kind::kFound) << key << " of " << acked << " acknowledged";
      EXPECT_EQ(r.value, ExpectedValue(key));
    }
  }
}

}  // namespace
}  // namespace hopscotch
