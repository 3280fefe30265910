#include "mica/mirrored_region.h"

#include <sys/mman.h>

#include <cstring>

#include "gtest/gtest.h"

namespace mica {
namespace {

TEST(MirroredRegion, MirrorAliasesTheRingStart) {
  RegionRequest request;
  request.head_bytes = 100;  // rounded up to a page
  request.ring_bytes = 64 * 1024;
  request.mirror_bytes = 8192;
  request.try_hugepages = false;
  auto region = MirroredRegion::Create(request);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(region->head_bytes(), 4096u);
  EXPECT_EQ(region->ring_bytes(), 64u * 1024);
  EXPECT_EQ(region->ring(), region->head() + 4096);
  // Zero-filled.
  for (size_t i = 0; i < region->mapped_bytes(); i += 512) ASSERT_EQ(region->base()[i], 0);
  // A write that crosses the ring's end lands at its start.
  const char text[] = "straddles the end";
  std::memcpy(region->ring() + region->ring_bytes() - 5, text, sizeof(text));
  EXPECT_EQ(std::memcmp(region->ring(), text + 5, sizeof(text) - 5), 0);
  // And a write at the start shows through the mirror.
  region->ring()[100] = 'x';
  EXPECT_EQ(region->ring()[region->ring_bytes() + 100], 'x');
}

TEST(MirroredRegion, FdMapsTheSameMemoryElsewhere) {
  RegionRequest request;
  request.head_bytes = 4096;
  request.ring_bytes = 8192;
  request.try_hugepages = false;
  auto region = MirroredRegion::Create(request);
  ASSERT_TRUE(region.ok()) << region.status();
  void* other = mmap(nullptr, 4096 + 8192, PROT_READ, MAP_SHARED, region->fd(), 0);
  ASSERT_NE(other, MAP_FAILED);
  region->ring()[7] = 42;
  EXPECT_EQ(static_cast<const char*>(other)[4096 + 7], 42);
  munmap(other, 4096 + 8192);
}

TEST(MirroredRegion, HugepageRequestFallsBackWhenThePoolIsEmpty) {
  RegionRequest request;
  request.ring_bytes = MirroredRegion::kHugePageBytes;
  request.mirror_bytes = 4096;
  request.try_hugepages = true;
  auto region = MirroredRegion::Create(request);
  ASSERT_TRUE(region.ok()) << region.status();
  // Either page size is valid; the mirror must work with whichever was used.
  region->ring()[0] = 'h';
  EXPECT_EQ(region->ring()[region->ring_bytes()], 'h');
  EXPECT_EQ(region->mirror_bytes() % region->page_bytes(), 0u);
}

// A backup refused its primary for ever ("index bytes: 2097152 there, 204800 here") when one
// of them found the hugepage pool empty at start and fell back to 4 KiB rounding: the layout a
// request gets must not depend on what the pool had then (on a machine with no hugepages free
// this fails without the fix; with hugepages it holds trivially).
TEST(MirroredRegion, TheLayoutDependsOnTheRequestNotOnThePool) {
  RegionRequest request;
  request.head_bytes = 204800;
  request.ring_bytes = 3 * MirroredRegion::kHugePageBytes;
  request.mirror_bytes = 4096;
  request.try_hugepages = true;
  auto region = MirroredRegion::Create(request);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(region->head_bytes(), MirroredRegion::kHugePageBytes)
      << "hugepages: " << region->hugepages();
  EXPECT_EQ(region->ring_bytes(), 3 * MirroredRegion::kHugePageBytes);
  EXPECT_EQ(region->mirror_bytes(), MirroredRegion::kHugePageBytes);
  region->ring()[1] = 'm';
  EXPECT_EQ(region->ring()[region->ring_bytes() + 1], 'm') << "the mirror, on whichever pages";
  // Below 2 MiB of ring no hugepage is tried: 4 KiB rounding, as before.
  request.ring_bytes = 8192;
  auto small = MirroredRegion::Create(request);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->head_bytes(), 204800u);
  EXPECT_EQ(small->ring_bytes(), 8192u);
}

TEST(MirroredRegion, RejectsAMirrorLargerThanTheRing) {
  RegionRequest request;
  request.ring_bytes = 4096;
  request.mirror_bytes = 8192;
  EXPECT_EQ(MirroredRegion::Create(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MirroredRegion, MoveTransfersOwnership) {
  RegionRequest request;
  request.ring_bytes = 4096;
  request.try_hugepages = false;
  auto region = MirroredRegion::Create(request);
  ASSERT_TRUE(region.ok());
  uint8_t* ring = region->ring();
  MirroredRegion moved = *std::move(region);
  EXPECT_EQ(moved.ring(), ring);
  ring[0] = 1;
  EXPECT_EQ(moved.ring()[0], 1);
}

}  // namespace
}  // namespace mica
