// Memory for one partition, laid out so the circular log never needs a split copy:
//
//   [ head (index) | ring (log) | mirror ]
//
// The mirror maps the ring's first `mirror_bytes` a second time, so an item that starts near the
// ring's end continues into its first bytes while staying contiguous in virtual memory. The whole
// range is backed by one file (memfd), which fd() shares with another process. It registers as
// one region on either fabric: a NIC pins whatever pages the range maps, and the shm fabric
// records its two file mappings ([head | ring] at offset 0, the mirror at head_bytes) and maps
// them the same way in a peer, so a remote WRITE or READ across the ring's end works alike.
#ifndef HERD_MICA_MIRRORED_REGION_H_
#define HERD_MICA_MIRRORED_REGION_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "util/memfd.h"

namespace mica {

// Each size is rounded up to 2 MiB when hugepages are tried (try_hugepages and ring_bytes >= 2
// MiB), whether or not the pool had them, else to 4 KiB: the layout depends on the request only.
struct RegionRequest {
  size_t head_bytes = 0;
  size_t ring_bytes = 0;  // mirror_bytes <= ring_bytes
  size_t mirror_bytes = 0;
  bool try_hugepages = true;  // 2 MiB pages when the pool has them, else 4 KiB pages
};

class MirroredRegion {
 public:
  // Maps a fresh, zero-filled region. Falls back to small pages when no hugepages are free.
  static absl::StatusOr<MirroredRegion> Create(const RegionRequest& request);

  MirroredRegion(MirroredRegion&& other) noexcept;
  MirroredRegion& operator=(MirroredRegion&& other) noexcept;
  MirroredRegion(const MirroredRegion&) = delete;
  MirroredRegion& operator=(const MirroredRegion&) = delete;
  ~MirroredRegion();

  uint8_t* head() const { return base_; }
  uint8_t* ring() const { return base_ + head_bytes_; }
  size_t head_bytes() const { return head_bytes_; }
  size_t ring_bytes() const { return ring_bytes_; }
  size_t mirror_bytes() const { return mirror_bytes_; }
  // The whole mapped range, mirror included: what a NIC registration covers.
  uint8_t* base() const { return base_; }
  size_t mapped_bytes() const { return head_bytes_ + ring_bytes_ + mirror_bytes_; }
  // The backing memfd (head then ring, mirror_bytes not repeated): lets another process map it.
  int fd() const { return fd_; }
  bool hugepages() const { return page_bytes_ > kSmallPageBytes; }
  size_t page_bytes() const { return page_bytes_; }

  static constexpr size_t kSmallPageBytes = 4096;
  static constexpr size_t kHugePageBytes = util::kHugePageBytes;

 private:
  MirroredRegion() = default;
  void Release();

  uint8_t* base_ = nullptr;
  size_t reserved_bytes_ = 0;  // virtual reservation, alignment slack included
  uint8_t* reservation_ = nullptr;
  size_t head_bytes_ = 0;
  size_t ring_bytes_ = 0;
  size_t mirror_bytes_ = 0;
  size_t page_bytes_ = kSmallPageBytes;
  int fd_ = -1;
};

}  // namespace mica

#endif  // HERD_MICA_MIRRORED_REGION_H_
