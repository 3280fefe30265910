// Cache-line prefetch hints that stay in the binary.
//
// On x86 an asm volatile, not __builtin_prefetch: GCC 12 deletes a loop whose only effect
// is __builtin_prefetch as dead code (MICA's item prefetches vanished from the binary when their
// loop moved into a function of its own). A prefetch never faults, but the address must be one
// the program may form: inside (or one past) an object it holds.
#ifndef HERD_UTIL_PREFETCH_H_
#define HERD_UTIL_PREFETCH_H_

#include <cstdint>

namespace util {

// Fetches the line holding `address` into every cache level, for reading.
inline void PrefetchForRead(const void* address) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(address)));
#else
  __builtin_prefetch(address, 0, 3);
#endif
}

// Fetches every line overlapping [address, address + bytes): a batch of messages another core
// (or a NIC) just wrote, prefetched together before the first is read, waits for their misses
// once instead of once per message.
// Every address touched lies inside the range (a step of a line from its start visits every
// line but maybe the last, which its last byte names).
inline void PrefetchRangeForRead(const void* address, uint64_t bytes) {
  constexpr uint64_t kLineBytes = 64;
  if (bytes == 0) return;
  const auto* p = static_cast<const char*>(address);
  for (uint64_t offset = 0; offset < bytes; offset += kLineBytes) PrefetchForRead(p + offset);
  PrefetchForRead(p + bytes - 1);
}

}  // namespace util

#endif  // HERD_UTIL_PREFETCH_H_
