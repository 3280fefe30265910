#include "mica/mirrored_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "util/errno_status.h"
#include "util/memfd.h"
#include "util/round_up.h"

namespace mica {
namespace {

using util::RoundUp;

absl::Status Errno(const char* what) {
  return util::ErrnoStatus(absl::StatusCode::kInternal, what);
}

// The memfd's name (in /proc/PID/fd and in the hugepage fallback's log line).
constexpr const char* kMemfdName = "herd-mica-partition";

// Maps [head | ring | mirror] from a new memfd with the given page size, or fails (e.g. ENOMEM
// when the hugepage pool is too small: hugetlbfs reserves all pages at mmap time, so a shortage
// shows here and never as a SIGBUS later).
absl::Status MapRegion(size_t page, size_t head, size_t ring, size_t mirror, int* fd_out,
                       uint8_t** reservation_out, size_t* reserved_out, uint8_t** base_out) {
  absl::StatusOr<int> memfd = util::CreateMemfd(kMemfdName, head + ring, page);
  if (!memfd.ok()) return memfd.status();
  const int fd = *memfd;
  // Reserve address space with slack so the base can be page-aligned, then map over it.
  const size_t total = head + ring + mirror;
  const size_t reserved = total + page;
  void* reservation =
      mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reservation == MAP_FAILED) {
    const absl::Status status = Errno("mmap reserve");
    close(fd);
    return status;
  }
  auto* base = reinterpret_cast<uint8_t*>(RoundUp(reinterpret_cast<uintptr_t>(reservation), page));
  const int prot = PROT_READ | PROT_WRITE;
  const int map = MAP_SHARED | MAP_FIXED | MAP_POPULATE;
  if (mmap(base, head + ring, prot, map, fd, 0) == MAP_FAILED ||
      (mirror > 0 &&
       mmap(base + head + ring, mirror, prot, map, fd, static_cast<off_t>(head)) == MAP_FAILED)) {
    const absl::Status status = Errno("mmap memfd");
    munmap(reservation, reserved);
    close(fd);
    return status;
  }
  *fd_out = fd;
  *reservation_out = static_cast<uint8_t*>(reservation);
  *reserved_out = reserved;
  *base_out = base;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MirroredRegion> MirroredRegion::Create(const RegionRequest& request) {
  if (request.ring_bytes == 0) return absl::InvalidArgumentError("ring_bytes must be positive");
  if (request.mirror_bytes > request.ring_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat("mirror_bytes %d exceeds ring_bytes %d",
                                                      request.mirror_bytes, request.ring_bytes));
  }
  MirroredRegion region;
  absl::Status last = absl::OkStatus();
  // The layout (where the ring and the mirror start, how long each is) follows from the request
  // alone, never from whether the pool had hugepages when the region was made: a primary and
  // its backups mirror each other at the same offsets, and a member restarted once the pool ran
  // dry must still match them. A small-page fallback keeps the hugepage rounding (it costs
  // address space only: the padding is never touched).
  const bool huge_eligible = request.try_hugepages && request.ring_bytes >= kHugePageBytes;
  const size_t unit = huge_eligible ? kHugePageBytes : kSmallPageBytes;
  const size_t head = RoundUp(request.head_bytes, unit);
  const size_t ring = RoundUp(request.ring_bytes, unit);
  const size_t mirror = RoundUp(request.mirror_bytes, unit);
  for (const size_t page : {kHugePageBytes, kSmallPageBytes}) {
    if (page == kHugePageBytes && !huge_eligible) continue;
    last = MapRegion(page, head, ring, mirror, &region.fd_, &region.reservation_,
                     &region.reserved_bytes_, &region.base_);
    if (last.ok()) {
      region.head_bytes_ = head;
      region.ring_bytes_ = ring;
      region.mirror_bytes_ = mirror;
      region.page_bytes_ = page;
      return region;
    }
    if (page == kHugePageBytes) util::LogSmallPageFallback(kMemfdName, head + ring, last);
  }
  return last;
}

MirroredRegion::MirroredRegion(MirroredRegion&& other) noexcept { *this = std::move(other); }

MirroredRegion& MirroredRegion::operator=(MirroredRegion&& other) noexcept {
  if (this != &other) {
    Release();
    base_ = std::exchange(other.base_, nullptr);
    reservation_ = std::exchange(other.reservation_, nullptr);
    reserved_bytes_ = std::exchange(other.reserved_bytes_, 0);
    head_bytes_ = std::exchange(other.head_bytes_, 0);
    ring_bytes_ = std::exchange(other.ring_bytes_, 0);
    mirror_bytes_ = std::exchange(other.mirror_bytes_, 0);
    page_bytes_ = std::exchange(other.page_bytes_, kSmallPageBytes);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

MirroredRegion::~MirroredRegion() { Release(); }

void MirroredRegion::Release() {
  if (reservation_ != nullptr) munmap(reservation_, reserved_bytes_);
  if (fd_ >= 0) close(fd_);
  reservation_ = nullptr;
  base_ = nullptr;
  fd_ = -1;
}

}  // namespace mica
