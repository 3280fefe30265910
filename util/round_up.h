// Rounding to a multiple of a unit (a page, an alignment).
#ifndef HERD_UTIL_ROUND_UP_H_
#define HERD_UTIL_ROUND_UP_H_

#include <cstdint>

namespace util {

// The smallest multiple of `unit` (> 0) that is >= n.
constexpr uint64_t RoundUp(uint64_t n, uint64_t unit) { return (n + unit - 1) / unit * unit; }

}  // namespace util

#endif  // HERD_UTIL_ROUND_UP_H_
