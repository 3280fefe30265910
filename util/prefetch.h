// Cache-line prefetch hints that stay in the binary.
//
// On x86 an asm volatile, not __builtin_prefetch: GCC 12 deletes a loop whose only effect
// is __builtin_prefetch as dead code (MICA's item prefetches vanished from the binary when their
// loop moved into a function of its own). A prefetch never faults, but the address must be one
// the program may form: inside (or one past) an object it holds.
#ifndef HERD_UTIL_PREFETCH_H_
#define HERD_UTIL_PREFETCH_H_

namespace util {

// Fetches the line holding `address` into every cache level, for reading.
inline void PrefetchForRead(const void* address) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(address)));
#else
  __builtin_prefetch(address, 0, 3);
#endif
}

}  // namespace util

#endif  // HERD_UTIL_PREFETCH_H_
