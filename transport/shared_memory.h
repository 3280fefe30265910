// Shared memory that every fabric backend can register: a memfd mapping, so the shm fabric can
// let peer processes map it, and the verbs backend can register it like any memory.
#ifndef HERD_TRANSPORT_SHARED_MEMORY_H_
#define HERD_TRANSPORT_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace transport {

class SharedMemory {
 public:
  // A zero-filled mapping of at least `bytes` (rounded up to the page size).
  static absl::StatusOr<SharedMemory> Allocate(size_t bytes, const char* name = "herd-shared");

  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  SharedMemory() = default;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

// Where a registered range lives in a shareable file: the descriptor this process holds and the
// file offset of the range's first byte.
struct Backing {
  int fd = -1;
  uint64_t file_offset = 0;
};

// Finds the shared file mapping (memfd or /dev/shm) that holds all of [addr, addr + length) and
// an open descriptor of that file in this process. Control path only: reads /proc/self.
absl::StatusOr<Backing> FindBacking(const void* addr, size_t length);

}  // namespace transport

#endif  // HERD_TRANSPORT_SHARED_MEMORY_H_
