// The copy behind every shm WRITE: bytes become visible in increasing address order and the last
// 8 bytes become visible last, as RDMA NICs deliver a WRITE in practice. HERD-style slot polling
// depends on it. memcpy does not guarantee it (x86 fast-string copies may store out of order),
// so this copies with ordinary 8-byte stores, which x86-64 (TSO) makes visible in program order;
// release stores keep the compiler from reordering or merging them into a memcpy call.
#ifndef HERD_TRANSPORT_SHM_ORDERED_COPY_H_
#define HERD_TRANSPORT_SHM_ORDERED_COPY_H_

#include <atomic>
#include <cstdint>
#include <cstring>

namespace transport::shm {

inline void OrderedCopy(uint8_t* dst, const uint8_t* src, size_t n) {
  // Byte stores until dst is 8-aligned, then whole words, then the tail bytes: all in order.
  while (n > 0 && (reinterpret_cast<uintptr_t>(dst) & 7) != 0) {
    std::atomic_ref<uint8_t>(*dst++).store(*src++, std::memory_order_release);
    --n;
  }
  for (; n >= 8; n -= 8, dst += 8, src += 8) {
    uint64_t word;
    std::memcpy(&word, src, 8);
    std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(dst))
        .store(word, std::memory_order_release);
  }
  for (; n > 0; --n) std::atomic_ref<uint8_t>(*dst++).store(*src++, std::memory_order_release);
}

}  // namespace transport::shm

#endif  // HERD_TRANSPORT_SHM_ORDERED_COPY_H_
