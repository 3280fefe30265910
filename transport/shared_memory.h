// Shared memory that every fabric backend can register: a memfd mapping, so the shm fabric can
// let peer processes map it, and the verbs backend can register it like any memory. It can be
// backed by 2 MiB hugepages: fewer TLB misses on the CPU, and on a NIC fewer translation
// entries for the same region (the NIC's MTT cache misses cost a PCIe round trip each).
#ifndef HERD_TRANSPORT_SHARED_MEMORY_H_
#define HERD_TRANSPORT_SHARED_MEMORY_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "util/memfd.h"

namespace transport {

using util::kHugePageBytes;

// Which pages back a SharedMemory. Hugepages come from the kernel's pool
// (/proc/sys/vm/nr_hugepages), which is empty unless an administrator fills it; the whole
// mapping is reserved from the pool at allocation, so a shortage is an error (or a fallback)
// then, never a SIGBUS later.
enum class PagePolicy {
  kSmall,            // the base page size (4 KiB on x86-64)
  kHugeIfAvailable,  // 2 MiB pages when the pool can hold the whole mapping, else small pages
                     // (logged with the pool's state); mappings under 2 MiB stay on small pages
  kHugeRequired,     // 2 MiB pages, or an error that says how to fill the pool
};
// "off", "auto", "required" (the --hugepages flag's values).
absl::StatusOr<PagePolicy> ParsePagePolicy(std::string_view name);
std::string_view Name(PagePolicy policy);

class SharedMemory {
 public:
  // A zero-filled mapping of at least `bytes` (rounded up to the page size used).
  static absl::StatusOr<SharedMemory> Allocate(size_t bytes, const char* name = "herd-shared",
                                               PagePolicy pages = PagePolicy::kSmall);

  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }
  size_t page_bytes() const { return page_bytes_; }
  bool hugepages() const { return page_bytes_ == kHugePageBytes; }

 private:
  SharedMemory() = default;
  void Release();  // unmaps and closes; leaves an empty object
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
  size_t page_bytes_ = 0;
};

// The 2 MiB hugepage pool (util/memfd.h).
using util::HugepagePool;
using util::ReadHugepagePool;

// The most file mappings one registered range may span (after merging neighbours that continue
// one file). A mirrored partition needs 2 ([head | ring] and the mirror); the rest is headroom.
// Fixed and small because the shm fabric keeps every region's extents in its segment's MR table,
// which peers map (kMaxMrs entries of this many extents each).
inline constexpr size_t kMaxMrExtents = 4;

// One piece of a registered range in a shareable file: the descriptor this process holds, the
// file offset of the piece's first byte and its length. The pieces of a range follow each other
// in its virtual addresses.
struct Backing {
  int fd = -1;
  uint64_t file_offset = 0;
  uint64_t length = 0;
  // The file's identity (the mapping's device and inode), which `fd` named when it was found:
  // another thread may close that descriptor and reuse its number for another file at any time
  // (a same-process peer opens the file transiently to map it), so a caller that keeps one
  // duplicates it and checks the duplicate against these.
  dev_t device = 0;
  ino_t inode = 0;
};

// The shared file mappings (memfd, /dev/shm, a file on disk) that hold [addr, addr + length), in
// address order, with an open descriptor of each file in this process. (The shm fabric's peers
// map a region only from a file sealed against shrinking, as SharedMemory's are, unless they
// opt in: DeviceOptions::shm_map_unsealed_regions.) The range may span several
// mappings (a mirrored ring maps part of its file twice), at most kMaxMrExtents after
// consecutive mappings that continue one file at the next offset are merged (the kernel splits
// a mapping where madvise or mprotect changed part of it). InvalidArgument, naming the address,
// when part of the range is unmapped, private or anonymous, or spans more mappings than that;
// FailedPrecondition when a mapped file has no open descriptor. Control path only: reads
// /proc/self.
absl::StatusOr<std::vector<Backing>> FindBackings(const void* addr, size_t length);

}  // namespace transport

#endif  // HERD_TRANSPORT_SHARED_MEMORY_H_
