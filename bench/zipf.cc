#include "bench/zipf.h"

#include <cmath>

#include "glog/logging.h"

namespace bench {
namespace {

double Zeta(uint64_t n, double theta) {
  double sum = 0;
  for (uint64_t i = 1; i <= n; ++i) sum += 1.0 / std::pow(static_cast<double>(i), theta);
  return sum;
}

// 64-bit FNV-1a over the rank's bytes, as YCSB's scrambled generator hashes ranks.
uint64_t Fnv1a64(uint64_t value) {
  constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ULL;
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  uint64_t hash = kOffsetBasis;
  for (int i = 0; i < 8; ++i) {
    hash ^= value & 0xff;
    hash *= kPrime;
    value >>= 8;
  }
  return hash;
}

}  // namespace

uint64_t ScrambleRank(uint64_t rank, uint64_t n) { return Fnv1a64(rank) % n; }

ZipfGenerator::ZipfGenerator(uint64_t n, double theta, bool scrambled)
    : n_(n), theta_(theta), scrambled_(scrambled) {
  CHECK_GE(n, 2u) << "a Zipf distribution needs at least two items";
  CHECK(theta > 0 && theta < 1) << "theta must be in (0, 1), got " << theta;
  alpha_ = 1.0 / (1.0 - theta);
  zeta_n_ = Zeta(n, theta);
  const double zeta_2 = Zeta(2, theta);
  eta_ = (1.0 - std::pow(2.0 / static_cast<double>(n), 1.0 - theta)) / (1.0 - zeta_2 / zeta_n_);
  half_pow_theta_ = std::pow(0.5, theta);
}

uint64_t ZipfGenerator::Next(std::mt19937_64& rng) {
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  const double uz = u * zeta_n_;
  uint64_t rank;
  if (uz < 1.0) {
    rank = 0;
  } else if (uz < 1.0 + half_pow_theta_) {
    rank = 1;
  } else {
    rank = static_cast<uint64_t>(static_cast<double>(n_) * std::pow(eta_ * u - eta_ + 1.0, alpha_));
    if (rank >= n_) rank = n_ - 1;
  }
  return scrambled_ ? ScrambleRank(rank, n_) : rank;
}

}  // namespace bench
