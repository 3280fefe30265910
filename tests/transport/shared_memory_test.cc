// SharedMemory's page policy: small pages by default, 2 MiB hugepages when asked and the kernel's
// pool has them, a logged fallback or a clear error when it does not. Cases that need free
// hugepages skip, saying how to get them, when the pool is empty (scripts/test.sh fills a small
// pool when it runs as root).
#include "transport/shared_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "gtest/gtest.h"

namespace transport {
namespace {

constexpr const char* kNoPool =
    "no free 2 MiB hugepages here (as root: echo 16 > /proc/sys/vm/nr_hugepages)";

// The kernel's page size for the mapping that holds `addr`, from /proc/self/smaps (0 if unknown).
size_t KernelPageBytes(const void* addr) {
  FILE* smaps = std::fopen("/proc/self/smaps", "r");
  if (smaps == nullptr) return 0;
  const auto target = reinterpret_cast<uintptr_t>(addr);
  char line[512];
  bool inside = false;
  size_t kib = 0;
  while (std::fgets(line, sizeof(line), smaps) != nullptr) {
    uintptr_t lo, hi;
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2) {  // a mapping's first line
      inside = target >= lo && target < hi;
      continue;
    }
    if (inside && std::sscanf(line, "KernelPageSize: %zu kB", &kib) == 1) break;
  }
  std::fclose(smaps);
  return kib << 10;
}

TEST(SharedMemory, SmallPagesByDefault) {
  auto memory = SharedMemory::Allocate(5000);
  ASSERT_TRUE(memory.ok()) << memory.status();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(memory->page_bytes(), page);
  EXPECT_FALSE(memory->hugepages());
  EXPECT_EQ(memory->size(), 2 * page);
  EXPECT_EQ(KernelPageBytes(memory->data()), page);
  EXPECT_EQ(memory->data()[4999], 0);  // zero-filled
}

// Moving into a live SharedMemory releases what it held (its descriptor is closed) and leaves
// the source empty in every field, so nothing is unmapped or closed twice.
TEST(SharedMemory, MoveAssignmentReleasesTheTargetAndEmptiesTheSource) {
  constexpr size_t kBytes = 8192;
  auto target = SharedMemory::Allocate(kBytes);
  auto source = SharedMemory::Allocate(kBytes);
  ASSERT_TRUE(target.ok() && source.ok());
  const int old_fd = target->fd();
  const int moved_fd = source->fd();
  source->data()[0] = 42;
  *target = std::move(*source);
  EXPECT_EQ(fcntl(old_fd, F_GETFD), -1) << "the target's old memfd is still open";
  EXPECT_EQ(target->fd(), moved_fd);
  EXPECT_EQ(target->data()[0], 42);
  EXPECT_EQ(source->data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(source->size(), 0u);
  EXPECT_EQ(source->fd(), -1);
  EXPECT_EQ(source->page_bytes(), 0u);
}

TEST(SharedMemory, AutoLeavesMappingsUnderOneHugepageOnSmallPages) {
  auto memory = SharedMemory::Allocate(64 << 10, "small", PagePolicy::kHugeIfAvailable);
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_FALSE(memory->hugepages());
  EXPECT_EQ(memory->size(), size_t{64} << 10);
}

TEST(SharedMemory, AutoUsesHugepagesWhenThePoolHasThemAndFallsBackWhenNot) {
  const HugepagePool pool = ReadHugepagePool();
  auto memory = SharedMemory::Allocate(3 << 20, "auto", PagePolicy::kHugeIfAvailable);
  ASSERT_TRUE(memory.ok()) << memory.status();
  memory->data()[memory->size() - 1] = 1;  // every byte is usable, whichever pages back it
  if (memory->hugepages()) {
    EXPECT_EQ(memory->size(), 2 * kHugePageBytes);
    EXPECT_EQ(KernelPageBytes(memory->data()), kHugePageBytes);
  } else {
    // Only a pool without two free pages (now: parallel tests share it) explains a fallback.
    EXPECT_LT(ReadHugepagePool().free, 2u) << "pool had " << pool.free << " free pages";
    EXPECT_EQ(memory->size(), size_t{3} << 20);
  }
}

TEST(SharedMemory, RequiredHugepagesFailClearlyWhenThePoolIsShort) {
  const HugepagePool pool = ReadHugepagePool();
  // One page more than the pool has free: the reservation fails at once, nothing is consumed.
  const size_t bytes = (pool.free + 1) * kHugePageBytes;
  auto memory = SharedMemory::Allocate(bytes, "too-much", PagePolicy::kHugeRequired);
  ASSERT_FALSE(memory.ok());
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(memory.status().message().find("/proc/sys/vm/nr_hugepages"), std::string::npos)
      << memory.status();
  EXPECT_NE(memory.status().message().find("too-much"), std::string::npos) << memory.status();
}

TEST(SharedMemory, RequiredHugepagesBackTheWholeMapping) {
  if (ReadHugepagePool().free < 1) GTEST_SKIP() << kNoPool;
  auto memory = SharedMemory::Allocate(100, "required", PagePolicy::kHugeRequired);
  if (!memory.ok() && ReadHugepagePool().free < 1) GTEST_SKIP() << "a parallel test took the pool";
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_TRUE(memory->hugepages());
  EXPECT_EQ(memory->size(), kHugePageBytes);
  EXPECT_EQ(KernelPageBytes(memory->data()), kHugePageBytes);
  SharedMemory moved = *std::move(memory);
  EXPECT_TRUE(moved.hugepages());
}

TEST(SharedMemory, PagePolicyNamesRoundTripAndABadOneIsRejected) {
  for (PagePolicy policy :
       {PagePolicy::kSmall, PagePolicy::kHugeIfAvailable, PagePolicy::kHugeRequired}) {
    auto parsed = ParsePagePolicy(Name(policy));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, policy);
  }
  const auto bad = ParsePagePolicy("always");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("off, auto or required"), std::string::npos);
}

}  // namespace
}  // namespace transport
