// SharedMemory's page policy: small pages by default, 2 MiB hugepages when asked and the kernel's
// pool has them, a logged fallback or a clear error when it does not. Cases that need free
// hugepages skip, saying how to get them, when the pool is empty (scripts/test.sh fills a small
// pool when it runs as root).
#include "transport/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
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

// Its file is sealed at its size, whichever pages back it: the shm fabric's peers map it, and
// map only files their owner cannot shrink under them (a truncated file SIGBUSes every process
// that touches a page past the new end).
TEST(SharedMemory, ItsFileCanNeitherShrinkNorGrow) {
  std::vector<SharedMemory> memories;
  memories.push_back(*SharedMemory::Allocate(8192));
  // On hugepages too where the pool has one free (another test may have taken it meanwhile).
  if (auto huge = SharedMemory::Allocate(100, "sealed", PagePolicy::kHugeRequired); huge.ok()) {
    memories.push_back(*std::move(huge));
  }
  for (const SharedMemory& memory : memories) {
    SCOPED_TRACE(absl::StrFormat("%d-byte pages", memory.page_bytes()));
    const int seals = fcntl(memory.fd(), F_GET_SEALS);
    ASSERT_GE(seals, 0) << "not a memfd that takes seals";
    EXPECT_NE(seals & F_SEAL_SHRINK, 0);
    EXPECT_NE(seals & F_SEAL_GROW, 0);
    EXPECT_NE(ftruncate(memory.fd(), 0), 0) << "the owner shrank its own registered memory";
    EXPECT_EQ(errno, EPERM);
    const auto bigger = static_cast<off_t>(memory.size() + memory.page_bytes());
    EXPECT_NE(ftruncate(memory.fd(), bigger), 0) << "it grew";
    EXPECT_EQ(errno, EPERM);
    memory.data()[memory.size() - 1] = 1;  // every page is still there
  }
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

// ------------------------------------------------------------------------------ FindBackings
size_t Page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// How /proc/self/maps lines name an address (FindBackings' errors name addresses the same way).
std::string AddressText(const void* addr) {
  return absl::StrFormat("%#x", reinterpret_cast<uintptr_t>(addr));
}

// The /proc/self/maps lines that overlap [addr, addr + length).
int MapsLinesOver(const void* addr, size_t length) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return -1;
  const auto begin = reinterpret_cast<uintptr_t>(addr);
  char line[4096];
  int lines = 0;
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    uintptr_t lo, hi;
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2 && lo < begin + length &&
        hi > begin) {
      ++lines;
    }
  }
  std::fclose(maps);
  return lines;
}

// `pages` pages of address space, reserved inaccessible (anonymous), with pieces of one memfd
// mapped over them by MapPage; all unmapped and closed when it goes.
class Patchwork {
 public:
  explicit Patchwork(size_t pages)
      : bytes_(pages * Page()),
        base_(static_cast<uint8_t*>(
            mmap(nullptr, bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0))),
        fd_(memfd_create("patchwork", MFD_CLOEXEC)) {
    EXPECT_NE(base_, MAP_FAILED);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(bytes_)), 0);
  }
  ~Patchwork() {
    munmap(base_, bytes_);
    close(fd_);
  }
  // Page `page` of the range shows page `file_page` of the memfd.
  void MapPage(size_t page, size_t file_page) {
    ASSERT_NE(mmap(base_ + page * Page(), Page(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                   fd_, static_cast<off_t>(file_page * Page())),
              MAP_FAILED);
  }
  uint8_t* page(size_t index) const { return base_ + index * Page(); }
  int fd() const { return fd_; }

 private:
  size_t bytes_;
  uint8_t* base_;
  int fd_;
};

TEST(FindBackings, ARangeInOneAllocationIsOneExtentAtItsFileOffset) {
  auto memory = SharedMemory::Allocate(3 * Page());
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto extents = FindBackings(memory->data() + 100, 2 * Page());
  ASSERT_TRUE(extents.ok()) << extents.status();
  ASSERT_EQ(extents->size(), 1u);
  EXPECT_EQ((*extents)[0].fd, memory->fd());
  EXPECT_EQ((*extents)[0].file_offset, 100u);
  EXPECT_EQ((*extents)[0].length, 2 * Page());
}

// ibv_reg_mr's madvise(MADV_DONTFORK) splits a mapping where a registration begins and ends:
// the pieces continue one file, so they are one extent.
TEST(FindBackings, PiecesOfOneMappingTheKernelSplitAreOneExtent) {
  auto memory = SharedMemory::Allocate(3 * Page());
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_EQ(madvise(memory->data() + Page(), Page(), MADV_DONTFORK), 0);
  ASSERT_EQ(MapsLinesOver(memory->data(), memory->size()), 3);
  auto extents = FindBackings(memory->data(), memory->size());
  ASSERT_TRUE(extents.ok()) << extents.status();
  ASSERT_EQ(extents->size(), 1u);
  EXPECT_EQ((*extents)[0].file_offset, 0u);
  EXPECT_EQ((*extents)[0].length, memory->size());
}

// A file mapped twice in a row (a mirrored ring): two extents, each where its line says.
TEST(FindBackings, AFileMappedAgainAfterItselfIsTwoExtents) {
  Patchwork range(3);
  range.MapPage(0, 0);
  range.MapPage(1, 1);
  range.MapPage(2, 0);
  auto extents = FindBackings(range.page(0) + 10, 3 * Page() - 20);
  ASSERT_TRUE(extents.ok()) << extents.status();
  ASSERT_EQ(extents->size(), 2u);
  EXPECT_EQ((*extents)[0].fd, range.fd());
  EXPECT_EQ((*extents)[0].file_offset, 10u);
  EXPECT_EQ((*extents)[0].length, 2 * Page() - 10);
  EXPECT_EQ((*extents)[1].fd, range.fd());
  EXPECT_EQ((*extents)[1].file_offset, 0u);
  EXPECT_EQ((*extents)[1].length, Page() - 10);
}

TEST(FindBackings, AnAnonymousPartIsRefusedNamingWhere) {
  Patchwork range(3);
  range.MapPage(0, 0);
  range.MapPage(1, 1);  // page 2 stays the anonymous reservation
  auto extents = FindBackings(range.page(0), 3 * Page());
  ASSERT_EQ(extents.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(extents.status().message().find("private or anonymous mapping at " +
                                            AddressText(range.page(2))),
            std::string::npos)
      << extents.status();
}

TEST(FindBackings, AHoleIsRefusedNamingWhere) {
  Patchwork range(3);
  range.MapPage(0, 0);
  range.MapPage(2, 2);
  ASSERT_EQ(munmap(range.page(1), Page()), 0);
  auto extents = FindBackings(range.page(0), 3 * Page());
  ASSERT_EQ(extents.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(extents.status().message().find("nothing is mapped at " + AddressText(range.page(1))),
            std::string::npos)
      << extents.status();
}

// kMaxMrExtents pieces that do not continue each other are accepted; one more is refused.
TEST(FindBackings, MoreThanTheMaximumOfExtentsIsRefused) {
  Patchwork range(kMaxMrExtents + 1);
  for (size_t page = 0; page <= kMaxMrExtents; ++page) range.MapPage(page, kMaxMrExtents - page);
  auto most = FindBackings(range.page(0), kMaxMrExtents * Page());
  ASSERT_TRUE(most.ok()) << most.status();
  EXPECT_EQ(most->size(), kMaxMrExtents);
  auto extents = FindBackings(range.page(0), (kMaxMrExtents + 1) * Page());
  ASSERT_EQ(extents.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(extents.status().message().find(
                absl::StrFormat("more than %d file mappings (the next at %s)", kMaxMrExtents,
                                AddressText(range.page(kMaxMrExtents)))),
            std::string::npos)
      << extents.status();
}

TEST(FindBackings, PrivateMemoryAndAnEmptyRangeAreRefused) {
  std::vector<char> heap(4096);
  EXPECT_EQ(FindBackings(heap.data(), heap.size()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto memory = SharedMemory::Allocate(Page());
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(FindBackings(memory->data(), 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace transport
