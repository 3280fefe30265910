// Key-rank generators with YCSB's semantics: uniform, and Zipfian (Gray et al., "Quickly
// generating billion-record synthetic databases", as YCSB's ZipfianGenerator implements it).
// Ranks are in [0, n); rank 0 is the most popular. Scrambling (YCSB's ScrambledZipfian) spreads
// the popular ranks over the key space so they do not share index buckets or partitions.
#ifndef HERD_BENCH_ZIPF_H_
#define HERD_BENCH_ZIPF_H_

#include <cstdint>
#include <random>

namespace bench {

inline constexpr double kYcsbZipfTheta = 0.99;

class ZipfGenerator {
 public:
  // theta in (0, 1); n >= 2. Computing zeta(n) costs O(n) once.
  ZipfGenerator(uint64_t n, double theta, bool scrambled);

  uint64_t Next(std::mt19937_64& rng);
  uint64_t n() const { return n_; }
  double theta() const { return theta_; }

 private:
  uint64_t n_;
  double theta_;
  bool scrambled_;
  double alpha_;
  double zeta_n_;
  double eta_;
  double half_pow_theta_;  // 0.5^theta: the threshold that picks rank 1
};

// Maps a rank to a key index in [0, n), a bijection-free but well spread hash (as YCSB does).
uint64_t ScrambleRank(uint64_t rank, uint64_t n);

}  // namespace bench

#endif  // HERD_BENCH_ZIPF_H_
