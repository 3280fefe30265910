// A mica partition's [head | ring | mirror] registered on the shm fabric as ONE region, although
// it spans two file mappings (the mirror maps the ring's start again): a peer maps it as the
// owner sees it, so an RDMA WRITE or READ across the ring's end reaches the ring's start, as a
// NIC's would through the owner's page tables.
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "mica/mirrored_region.h"
#include "tests/transport/fabric_fixture.h"

namespace transport::testing {
namespace {

constexpr size_t kHeadBytes = 4096;
constexpr size_t kRingBytes = 64 << 10;
constexpr size_t kMirrorBytes = 8 << 10;
constexpr uint32_t kRegionAccess = kLocalWrite | kRemoteRead | kRemoteWrite;
// Where a WRITE or READ begins before the ring's end, and how far it runs: across the end.
constexpr size_t kBeforeEnd = 100;
constexpr uint32_t kCrossingBytes = 200;

mica::MirroredRegion MakeRegion() {
  mica::RegionRequest request;
  request.head_bytes = kHeadBytes;
  request.ring_bytes = kRingBytes;
  request.mirror_bytes = kMirrorBytes;
  request.try_hugepages = false;  // small pages: the sizes above are exact
  auto region = mica::MirroredRegion::Create(request);
  EXPECT_TRUE(region.ok()) << region.status();
  return *std::move(region);
}

TEST(MirroredRegionBackings, TheRingAndItsMirrorAreTwoExtentsOfOneFile) {
  mica::MirroredRegion region = MakeRegion();
  ASSERT_EQ(region.head_bytes(), kHeadBytes);
  ASSERT_EQ(region.ring_bytes(), kRingBytes);
  ASSERT_EQ(region.mirror_bytes(), kMirrorBytes);
  auto whole = FindBackings(region.base(), region.mapped_bytes());
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->size(), 2u);
  EXPECT_EQ((*whole)[0].fd, region.fd());
  EXPECT_EQ((*whole)[0].file_offset, 0u);  // head then ring
  EXPECT_EQ((*whole)[0].length, kHeadBytes + kRingBytes);
  EXPECT_EQ((*whole)[1].fd, region.fd());
  EXPECT_EQ((*whole)[1].file_offset, kHeadBytes);  // the mirror: the ring's start again
  EXPECT_EQ((*whole)[1].length, kMirrorBytes);

  auto crossing = FindBackings(region.ring() + kRingBytes - kBeforeEnd, kCrossingBytes);
  ASSERT_TRUE(crossing.ok()) << crossing.status();
  ASSERT_EQ(crossing->size(), 2u);
  EXPECT_EQ((*crossing)[0].file_offset, kHeadBytes + kRingBytes - kBeforeEnd);
  EXPECT_EQ((*crossing)[0].length, kBeforeEnd);
  EXPECT_EQ((*crossing)[1].file_offset, kHeadBytes);
  EXPECT_EQ((*crossing)[1].length, kCrossingBytes - kBeforeEnd);
}

// The region's address-space reservation ends in inaccessible slack after the mirror.
TEST(MirroredRegionBackings, ARangeReachingPastTheMirrorIsRefused) {
  mica::MirroredRegion region = MakeRegion();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto extents = FindBackings(region.base(), region.mapped_bytes() + page);
  ASSERT_EQ(extents.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string where =
      absl::StrFormat("at %#x", reinterpret_cast<uintptr_t>(region.base() + region.mapped_bytes()));
  EXPECT_NE(extents.status().message().find(where), std::string::npos) << extents.status();
}

// a_ reaches b_'s partition, registered whole in b_'s PD, through an RC QP pair; a_'s QP maps
// the region itself (its own Peer mapping of b_'s memfd), as another process would.
class Link {
 public:
  // False (with the test failed) when something could not be set up.
  bool Open(const std::string& backend, mica::MirroredRegion region) {
    a_ = MakeNode(backend);
    b_ = MakeNode(backend);
    if (a_ == nullptr || b_ == nullptr) return false;
    region_.emplace(std::move(region));
    auto mr = b_->pd->RegisterMemory(region_->base(), region_->mapped_bytes(), kRegionAccess);
    EXPECT_TRUE(mr.ok()) << mr.status();
    if (!mr.ok()) return false;
    mr_ = *std::move(mr);
    qa_ = MakeQp(*a_, QpType::kRc);
    qb_ = MakeQp(*b_, QpType::kRc);
    ConnectPair(*qa_, *qb_);
    return !::testing::Test::HasFatalFailure();
  }
  // Runs `opcode` between a_'s bytes at `local` and b_'s ring from kBeforeEnd before its end,
  // kCrossingBytes long; returns its completion status.
  CompletionStatus Across(Opcode opcode, size_t local) {
    Sge sge = a_->sge(local, kCrossingBytes);
    SendWr wr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.flags = kSignaled;
    wr.remote_addr = reinterpret_cast<uint64_t>(ring() + ring_bytes() - kBeforeEnd);
    wr.rkey = mr_->rkey();
    EXPECT_TRUE(Post(*qa_, wr).ok());
    std::vector<Completion> done = PollN(*a_->send_cq, 1);
    EXPECT_EQ(done.size(), 1u) << "no completion";
    return done.empty() ? CompletionStatus::kOtherError : done[0].status;
  }
  uint8_t* local() const { return a_->bytes(); }
  uint8_t* ring() const { return region_->ring(); }
  size_t ring_bytes() const { return region_->ring_bytes(); }

 private:
  // Destroyed in reverse: QPs, the region's MR, the region, then the nodes.
  std::unique_ptr<Node> a_, b_;
  std::optional<mica::MirroredRegion> region_;
  std::unique_ptr<MemoryRegion> mr_;
  std::unique_ptr<QueuePair> qa_, qb_;
};

// Writes a pattern across b_'s ring end; the owner sees its head at the ring's end, the rest at
// the ring's start.
void ExpectWriteWrapsTheRing(Link& link) {
  uint8_t pattern[kCrossingBytes];
  for (size_t i = 0; i < kCrossingBytes; ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 1);
  std::memcpy(link.local(), pattern, kCrossingBytes);
  ASSERT_EQ(link.Across(Opcode::kWrite, 0), CompletionStatus::kSuccess);
  const uint8_t* ring = link.ring();
  EXPECT_EQ(std::memcmp(ring + link.ring_bytes() - kBeforeEnd, pattern, kBeforeEnd), 0);
  EXPECT_EQ(std::memcmp(ring, pattern + kBeforeEnd, kCrossingBytes - kBeforeEnd), 0);
  EXPECT_EQ(ring[kCrossingBytes - kBeforeEnd], 0);  // nothing beyond
}

// The owner writes the ring's last and first bytes (through the ring, not the mirror); a READ
// across the end returns them in a row.
void ExpectReadWrapsTheRing(Link& link) {
  uint8_t* ring = link.ring();
  for (size_t i = 0; i < kBeforeEnd; ++i) ring[link.ring_bytes() - kBeforeEnd + i] = 0xa0 ^ i;
  for (size_t i = 0; i < kCrossingBytes - kBeforeEnd; ++i) ring[i] = 0x50 ^ i;
  constexpr size_t kLocal = 1024;
  ASSERT_EQ(link.Across(Opcode::kRead, kLocal), CompletionStatus::kSuccess);
  for (size_t i = 0; i < kCrossingBytes; ++i) {
    const uint8_t want = i < kBeforeEnd ? 0xa0 ^ i : 0x50 ^ (i - kBeforeEnd);
    ASSERT_EQ(link.local()[kLocal + i], want) << "byte " << i;
  }
}

class MirroredRegistration : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ASSERT_TRUE(link_.Open(GetParam(), MakeRegion())); }
  Link link_;
};

TEST_P(MirroredRegistration, AWriteAcrossTheRingEndLandsAtTheRingStart) {
  ExpectWriteWrapsTheRing(link_);
}

TEST_P(MirroredRegistration, AReadAcrossTheRingEndReturnsTheRingStart) {
  ExpectReadWrapsTheRing(link_);
}

INSTANTIATE_TEST_SUITE_P(Shm, MirroredRegistration, ::testing::Values("shm", "shm_async"),
                         [](const auto& info) { return info.param; });

// On 2 MiB pages every extent must be mapped from a 2 MiB boundary of its file and of memory
// (hugetlbfs refuses any other): the peer lays the region out on the owner's alignment.
TEST(MirroredRegistrationOnHugepages, AWriteAndAReadAcrossTheRingEndWrap) {
  mica::RegionRequest request;
  request.head_bytes = kHeadBytes;  // each part rounds up to one hugepage
  request.ring_bytes = mica::MirroredRegion::kHugePageBytes;
  request.mirror_bytes = kMirrorBytes;
  request.try_hugepages = true;
  auto region = mica::MirroredRegion::Create(request);
  ASSERT_TRUE(region.ok()) << region.status();
  if (!region->hugepages()) {
    GTEST_SKIP() << "no 2 free hugepages (as root: echo 16 > /proc/sys/vm/nr_hugepages)";
  }
  Link link;
  ASSERT_TRUE(link.Open("shm", *std::move(region)));
  ExpectWriteWrapsTheRing(link);
  ExpectReadWrapsTheRing(link);
}

}  // namespace
}  // namespace transport::testing
