// The remainder of a division on per-request paths, without the divide instruction where it can.
#ifndef HERD_UTIL_MODULO_H_
#define HERD_UTIL_MODULO_H_

#include <cstdint>

namespace util {

// x % d for d > 0. A power of two (herd's windows, queue depths and signalling batches as
// configured by default) takes a mask; anything else the division. The test of d is a branch the
// CPU predicts whenever d does not change.
inline uint64_t Mod(uint64_t x, uint64_t d) { return (d & (d - 1)) == 0 ? x & (d - 1) : x % d; }

}  // namespace util

#endif  // HERD_UTIL_MODULO_H_
