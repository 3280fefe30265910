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
#include <thread>

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

// The copy behind every shm READ: the source is taken one 64-byte line at a time (lines of the
// SOURCE's addresses, in ascending order), each line copied until two consecutive copies agree.
// For a line whose words never return to an earlier value between the two copies (a versioned
// line: a seqlock word, a counter), agreement proves that the copy is the line's content at one
// instant (each word held its value from its first load to its second, and every first load
// precedes every second one), as a NIC's DMA read of a cache line is in practice. A responder
// that rewrites a line without pause holds the READ up (it yields after a few tries): on the shm
// fabric a peer process shares the memory anyway, so this is no new power over the requester.
inline constexpr uint64_t kLineBytes = 64;
// Disagreeing copies of one line before the copier yields its core to the writer.
inline constexpr int kStableCopyTriesBeforeYield = 64;

// Copies [src, src + n), which lies within one source line, to dst, as of one instant.
inline void StableLineCopy(uint8_t* dst, const uint8_t* src, size_t n) {
  std::memcpy(dst, src, n);
  // Every load of the first copy happens before any load of the comparison (x86 keeps loads in
  // order; the fence keeps the compiler from merging or reordering the two passes).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int tries = 1; std::memcmp(dst, src, n) != 0; ++tries) {
    if (tries % kStableCopyTriesBeforeYield == 0) std::this_thread::yield();
    std::memcpy(dst, src, n);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

}  // namespace transport::shm

#endif  // HERD_TRANSPORT_SHM_ORDERED_COPY_H_
