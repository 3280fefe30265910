// util::Mod is x % d for every d > 0: by a mask for powers of two, by the division otherwise.
#include "util/modulo.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace util {
namespace {

TEST(ModTest, EqualsTheRemainderForPowersOfTwoAndOthers) {
  const uint64_t divisors[] = {1,
                               2,
                               3,
                               4,
                               5,
                               7,
                               8,
                               12,
                               16,
                               31,
                               32,
                               33,
                               128,
                               1000,
                               1024,
                               (uint64_t{1} << 32) - 1,
                               uint64_t{1} << 32,
                               uint64_t{1} << 63};
  const uint64_t values[] = {0,
                             1,
                             2,
                             3,
                             7,
                             8,
                             9,
                             63,
                             64,
                             65,
                             1023,
                             1024,
                             1025,
                             (uint64_t{1} << 48) - 1,
                             (uint64_t{1} << 48) + 5,
                             ~uint64_t{0},
                             ~uint64_t{0} - 1,
                             0x9e3779b97f4a7c15ULL};
  for (uint64_t d : divisors) {
    for (uint64_t x : values) EXPECT_EQ(Mod(x, d), x % d) << x << " % " << d;
  }
}

}  // namespace
}  // namespace util
