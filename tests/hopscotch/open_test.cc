// Table::Open on hostile files: each gets a clear error naming the file and the problem, and
// none crashes; a valid header over garbage buckets is readable and repairable.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "hopscotch/hash.h"
#include "hopscotch/table.h"
#include "util/word_checksum.h"

namespace hopscotch {
namespace {

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::string MakeTable(const std::string& name, uint64_t buckets = 64) {
  const std::string path = TmpPath(name);
  absl::StatusOr<Table> t = Table::Create(path, buckets);
  EXPECT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < 20; ++i) {
    const std::string key = absl::StrFormat("user%d", i);
    EXPECT_TRUE(t->Insert(key, ExpectedValue(key)).ok());
  }
  EXPECT_TRUE(t->Close().ok());
  return path;
}

Header ReadHeader(const std::string& path) {
  Header h;
  const int fd = open(path.c_str(), O_RDONLY);
  EXPECT_EQ(pread(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
  close(fd);
  return h;
}

void WriteHeader(const std::string& path, const Header& h, bool fix_checksum) {
  Header copy = h;
  if (fix_checksum) copy.checksum = HeaderChecksum(copy);
  const int fd = open(path.c_str(), O_WRONLY);
  EXPECT_EQ(pwrite(fd, &copy, sizeof(copy), 0), static_cast<ssize_t>(sizeof(copy)));
  close(fd);
}

// Open fails, naming the file and containing `what`.
void ExpectRejected(const std::string& path, const std::string& what) {
  for (bool writable : {false, true}) {
    absl::StatusOr<Table> t = Table::Open(path, writable);
    ASSERT_FALSE(t.ok()) << path;
    const std::string message(t.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

TEST(Open, MissingEmptyTruncatedAndExtendedFiles) {
  ExpectRejected(TmpPath("none.hop"), "No such file");
  const std::string path = MakeTable("sizes.hop");
  ASSERT_TRUE(Table::Open(path, false).ok());
  const uint64_t bytes = FileBytes(64);
  ASSERT_EQ(truncate(path.c_str(), bytes - kBucketBytes), 0);
  ExpectRejected(path, "truncated or extended");
  ASSERT_EQ(truncate(path.c_str(), bytes + 1), 0);
  ExpectRejected(path, "truncated or extended");
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  ExpectRejected(path, "shorter than the 4096-byte header");
  ASSERT_EQ(truncate(path.c_str(), 0), 0);
  ExpectRejected(path, "shorter than the 4096-byte header");
  absl::StatusOr<Table> dir = Table::Open(std::getenv("TEST_TMPDIR"), false);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("not a regular file"), std::string::npos) << dir.status();
  EXPECT_FALSE(Table::Open(std::getenv("TEST_TMPDIR"), true).ok());  // EISDIR
}

TEST(Open, WrongMagicVersionAndChecksum) {
  const std::string path = MakeTable("header.hop");
  const Header good = ReadHeader(path);
  Header h = good;
  h.magic[0] = 'X';
  WriteHeader(path, h, true);
  ExpectRejected(path, "not a hopscotch table");
  h = good;
  h.format_version = kFormatVersion + 1;
  WriteHeader(path, h, true);
  ExpectRejected(path, absl::StrFormat("format version %u, this build reads version %u",
                                       kFormatVersion + 1, kFormatVersion));
  h = good;
  h.checksum ^= 1;
  WriteHeader(path, h, false);
  ExpectRejected(path, "header checksum mismatch");
  h = good;
  h.hash_seed = 99;  // a checksummed field changed without the checksum
  WriteHeader(path, h, false);
  ExpectRejected(path, "header checksum mismatch");
  WriteHeader(path, good, false);
  EXPECT_TRUE(Table::Open(path, false).ok());
}

TEST(Open, BadGeometryWithAValidChecksum) {
  const std::string path = MakeTable("geometry.hop");
  const Header good = ReadHeader(path);
  Header h = good;
  h.home_buckets = 48;
  h.total_buckets = 48 + 31;
  WriteHeader(path, h, true);
  ExpectRejected(path, "bucket count 48 is not a power of two");
  h = good;
  h.home_buckets = uint64_t{1} << 40;
  WriteHeader(path, h, true);
  ExpectRejected(path, "not a power of two in 1..2^32");
  h = good;
  h.neighbourhood = 16;
  WriteHeader(path, h, true);
  ExpectRejected(path, "H=16");
  h = good;
  h.total_buckets = 64;
  WriteHeader(path, h, true);
  ExpectRejected(path, "total buckets 64");
  h = good;
  h.home_buckets = 128;  // a bigger table than the file holds
  h.total_buckets = 128 + 31;
  WriteHeader(path, h, true);
  ExpectRejected(path, "truncated or extended");
  h = good;
  h.state = 7;
  WriteHeader(path, h, true);
  ExpectRejected(path, "state 7");
  h = good;
  h.item_count = 1000;
  WriteHeader(path, h, true);
  ExpectRejected(path, "item count 1000 exceeds");
  h = good;
  h.shard = 3;
  h.shards = 3;
  WriteHeader(path, h, true);
  ExpectRejected(path, "shard 3 of 3");
  h = good;
  h.shards = kMaxShards + 1;
  WriteHeader(path, h, true);
  ExpectRejected(path, "shards and shard < shards");
  h = good;
  h.shards = 0;  // only version 1 files, written before sharding, had no shard count
  WriteHeader(path, h, true);
  ExpectRejected(path, "shard 0 of 0");
}

// Issue 36: the shard fields were outside the checksum, so a 4-byte change made shard 1 of 2
// claim every key (shards = 1): clients routed there got false misses, and no error. Now they are
// checksummed like the geometry.
TEST(Open, ShardFieldsAreUnderTheChecksum) {
  const std::string path = TmpPath("sharded.hop");
  {
    absl::StatusOr<Table> t = Table::Create(path, 64, /*seed=*/0, Sharding{1, 2});
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(t->Close().ok());
  }
  const Header good = ReadHeader(path);
  ASSERT_EQ(good.shards, 2u);
  Header h = good;
  h.shards = 1;  // the audit's change: one shard holding the whole key space
  h.shard = 0;
  WriteHeader(path, h, /*fix_checksum=*/false);
  ExpectRejected(path, "header checksum mismatch");
  h = good;
  h.shard = 0;  // the other shard's keys
  WriteHeader(path, h, /*fix_checksum=*/false);
  ExpectRejected(path, "header checksum mismatch");
  WriteHeader(path, good, /*fix_checksum=*/false);
  absl::StatusOr<Table> t = Table::Open(path, false);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->sharding().shard, 1u);
  EXPECT_EQ(t->sharding().shards, 2u);
}

// A file of the format before the shard fields joined the checksum is a clear error naming the
// version and the fix, not a checksum mismatch or a misread.
TEST(Open, FormatVersionOneIsAClearError) {
  const std::string path = MakeTable("version1.hop");
  Header h = ReadHeader(path);
  h.format_version = 1;
  // Its own (version 1) checksum, over bytes 0..55 only: a genuine old file.
  util::WordChecksum sum(kHeaderChecksumSeed, kChecksummedHeaderBytes);
  sum.AbsorbWords(reinterpret_cast<const uint8_t*>(&h), kChecksummedHeaderBytes / 8);
  h.checksum = sum.Finish();
  WriteHeader(path, h, /*fix_checksum=*/false);
  ExpectRejected(path, "table format version 1 (its shard fields are outside the header checksum)");
  ExpectRejected(path, "rebuild the table");
}

TEST(Open, RandomGarbageIsNotATable) {
  std::mt19937_64 rng(3);
  for (uint64_t size : {uint64_t{4096}, FileBytes(64), uint64_t{100000}}) {
    const std::string path = TmpPath(absl::StrFormat("garbage%u", size));
    std::string bytes(size, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    close(fd);
    ExpectRejected(path, "not a hopscotch table");
  }
}

// A valid header over garbage buckets: lookups never crash; a writable open of the dirty file
// repairs it into a table that passes every invariant.
TEST(Open, GarbageBucketsAreReadableAndRepairable) {
  const std::string path = MakeTable("buckets.hop", 256);
  std::mt19937_64 rng(4);
  std::string bytes((256 + 31) * kBucketBytes, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  const int fd = open(path.c_str(), O_WRONLY);
  ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), kHeaderBytes),
            static_cast<ssize_t>(bytes.size()));
  close(fd);
  {  // still marked clean: garbage has busy lines, which a clean file may not (issue 36)
    absl::StatusOr<Table> t = Table::Open(path, false);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("buckets are busy"), std::string::npos) << t.status();
  }
  Header h = ReadHeader(path);
  h.state = kStateDirty;
  WriteHeader(path, h, false);
  {
    absl::StatusOr<Table> t = Table::Open(path, false);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_FALSE(t->CheckInvariants().ok());
    for (int i = 0; i < 2000; ++i) t->Lookup(absl::StrFormat("user%d", i), /*max_reads=*/2);
  }
  absl::StatusOr<Table> t = Table::Open(path, true);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GT(t->stats().recovered_orphans + t->stats().recovered_busy, 0u);
  EXPECT_TRUE(t->CheckInvariants().ok()) << t->CheckInvariants();
  for (int i = 0; i < 200; ++i) {
    const std::string key = absl::StrFormat("new%d", i);
    ASSERT_TRUE(t->Insert(key, ExpectedValue(key)).ok());
  }
  EXPECT_TRUE(t->CheckInvariants().ok()) << t->CheckInvariants();
}

}  // namespace
}  // namespace hopscotch
