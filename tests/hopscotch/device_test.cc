// Tables on a character device (device-DAX): /dev/zero with a fake sysfs stands in for
// /dev/dax0.0 (fake_sysfs.h). A table there works (inserts with displacement, lookups,
// invariants); a device too small for the table, a missing or malformed sysfs attribute, and
// paths that are neither a regular file nor a character device (FIFO, directory) are refused
// with an error naming the path.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
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

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kDaxAlign = 2 * kMiB;  // device-DAX's usual alignment

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// /dev/zero is one inode for every test process: a lock there would make the test binaries
// sharing it refuse each other.
TableOptions DeviceOptions(const std::string& root) {
  TableOptions options;
  options.sysfs_root = root;
  options.lock = false;
  return options;
}

// `status` failed, naming `path` and containing `what`.
void ExpectError(const absl::Status& status, const std::string& path, const std::string& what) {
  ASSERT_FALSE(status.ok()) << path;
  const std::string message(status.message());
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(what), std::string::npos) << message;
}

class Device : public testing::Test {
 protected:
  void SetUp() override {
    if (!DevZeroUsable()) GTEST_SKIP() << "no /dev/zero character device here";
  }
};

TEST_F(Device, TableOnACharacterDeviceWorks) {
  for (Persistence persistence : {Persistence::kProcessCrash, Persistence::kPowerFailure}) {
    TableOptions options =
        DeviceOptions(FakeSysfs("sys_ok", std::to_string(8 * kMiB), std::to_string(kDaxAlign)));
    options.persistence = persistence;
    absl::StatusOr<Table> t = Table::Create(kDevZero, 4096, /*seed=*/5, {}, options);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->device());
    EXPECT_EQ(t->persistence(), persistence);
    std::mt19937_64 rng(6);
    std::vector<std::string> keys;
    while (t->items() < 3600) {  // 88%: displacement
      keys.push_back(absl::StrFormat("user%d", rng()));
      ASSERT_TRUE(t->Insert(keys.back(), ExpectedValue(keys.back())).ok());
    }
    EXPECT_GT(t->stats().moves, 0u);
    ASSERT_TRUE(t->CheckInvariants().ok()) << t->CheckInvariants();
    for (const std::string& key : keys) {
      const LookupResult r = t->Lookup(key);
      ASSERT_EQ(r.kind, Kind::kFound) << key;
      EXPECT_EQ(r.value, ExpectedValue(key));
    }
    EXPECT_EQ(t->Lookup("absent").kind, Kind::kMiss);
    EXPECT_TRUE(t->Close().ok());  // cache-line flushes: a device has no msync
  }
}

TEST_F(Device, TooSmallForTheTableIsRefused) {
  // 64 home buckets are 10176 bytes, mapped as one 2 MiB alignment unit: a 1 MiB device is short.
  absl::StatusOr<Table> t = Table::Create(
      kDevZero, 64, 0, {},
      DeviceOptions(FakeSysfs("sys_small", std::to_string(kMiB), std::to_string(kDaxAlign))));
  ExpectError(t.status(), kDevZero, "the device is 1048576 bytes");
  ExpectError(t.status(), kDevZero, "2097152-byte alignment");
  // 2^16 home buckets need more than 4 MiB, even at a page's alignment.
  t = Table::Create(
      kDevZero, uint64_t{1} << 16, 0, {},
      DeviceOptions(FakeSysfs("sys_small2", std::to_string(4 * kMiB), std::to_string(4096))));
  ExpectError(t.status(), kDevZero, "use fewer buckets or a bigger device");
}

TEST_F(Device, MissingOrMalformedSysfsAttributesAreRefused) {
  const std::string no_size = FakeSysfs("sys_nosize", std::nullopt, std::to_string(kDaxAlign));
  for (const TableOptions& options : {DeviceOptions(no_size), DeviceOptions("/sys")}) {
    // The real /sys has no size for /dev/zero either: it is not a device-DAX device.
    ExpectError(Table::Create(kDevZero, 64, 0, {}, options).status(), kDevZero,
                "not a device-DAX device?");
    ExpectError(Table::Open(kDevZero, false, options).status(), kDevZero, "/size");
  }
  ExpectError(Table::Create(kDevZero, 64, 0, {},
                            DeviceOptions(FakeSysfs("sys_badsize", "lots", std::nullopt)))
                  .status(),
              kDevZero, "'lots' is not a byte count");
  ExpectError(Table::Create(kDevZero, 64, 0, {},
                            DeviceOptions(FakeSysfs("sys_badalign", "8388608", "3000")))
                  .status(),
              kDevZero, "3000 is not a power of two");
  // No align attribute (an older kernel): the page size.
  EXPECT_TRUE(Table::Create(kDevZero, 64, 0, {},
                            DeviceOptions(FakeSysfs("sys_noalign", "8388608", std::nullopt)))
                  .ok());
}

TEST_F(Device, OpenReadsTheHeaderThroughTheMapping) {
  // /dev/zero reads as zeros through a mapping: a device with no table on it.
  const TableOptions options =
      DeviceOptions(FakeSysfs("sys_open", std::to_string(8 * kMiB), std::to_string(kDaxAlign)));
  for (bool writable : {false, true}) {
    ExpectError(Table::Open(kDevZero, writable, options).status(), kDevZero,
                "not a hopscotch table");
  }
  ExpectError(
      Table::Open(kDevZero, false, DeviceOptions(FakeSysfs("sys_tiny", "100", std::nullopt)))
          .status(),
      kDevZero, "shorter than the 4096-byte header");
}

// The header's size check: exact for a file, "fits" for a device.
TEST(DeviceHeader, ATableFitsADeviceButMustFillAFile) {
  const std::string path = TmpPath("header.hop");
  ASSERT_TRUE(Table::Create(path, 64).ok());
  Header h;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_EQ(std::fread(&h, sizeof(h), 1, f), 1u);
  std::fclose(f);
  const uint64_t bytes = FileBytes(64);
  EXPECT_TRUE(ValidateHeader(h, bytes, /*device=*/false).ok());
  EXPECT_TRUE(ValidateHeader(h, bytes, /*device=*/true).ok());
  EXPECT_TRUE(ValidateHeader(h, 8 * kMiB, /*device=*/true).ok());
  EXPECT_NE(ValidateHeader(h, 8 * kMiB, false).message().find("truncated or extended"),
            std::string::npos);
  EXPECT_NE(ValidateHeader(h, bytes - 1, true).message().find("the device only 10175"),
            std::string::npos)
      << ValidateHeader(h, bytes - 1, true);
}

TEST(DeviceHeader, FifosAndDirectoriesAreRefused) {
  const std::string fifo = TmpPath("table.fifo");
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const std::string dir = TmpPath("table.dir");
  mkdir(dir.c_str(), 0755);
  for (const auto& [path, what] : {std::pair<std::string, std::string>{fifo, "(a FIFO)"},
                                   std::pair<std::string, std::string>{dir, "(a directory)"}}) {
    ExpectError(Table::Create(path, 64).status(), path,
                "not a regular file or a device-DAX character device " + what);
    for (bool writable : {false, true}) {  // never blocks on the FIFO
      ExpectError(Table::Open(path, writable).status(), path, what);
    }
  }
}

}  // namespace
}  // namespace hopscotch
