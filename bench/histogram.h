// A log-linear latency histogram (HdrHistogram's idea, sized for nanoseconds up to ~1 minute):
// each power of two is split into kSubBuckets linear buckets, so any recorded value is reported
// within 1/kSubBuckets (~3%) of itself. Fixed storage: Record never allocates.
#ifndef HERD_BENCH_HISTOGRAM_H_
#define HERD_BENCH_HISTOGRAM_H_

#include <array>
#include <bit>
#include <cstdint>

namespace bench {

class Histogram {
 public:
  static constexpr int kSubBucketBits = 5;  // 32 linear buckets per power of two
  static constexpr int kSubBuckets = 1 << kSubBucketBits;
  static constexpr int kMaxExponent = 36;  // 2^36 ns ~ 69 s; longer values clamp here

  void Record(uint64_t value) {
    ++counts_[IndexOf(value)];
    ++total_;
    if (value > max_) max_ = value;
  }
  void Merge(const Histogram& other) {
    for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
    total_ += other.total_;
    if (other.max_ > max_) max_ = other.max_;
  }
  uint64_t count() const { return total_; }
  uint64_t max() const { return max_; }
  // The value at quantile q in [0, 1] (upper edge of its bucket, never above max()).
  uint64_t Quantile(double q) const {
    if (total_ == 0) return 0;
    const auto rank = static_cast<uint64_t>(q * static_cast<double>(total_ - 1)) + 1;
    uint64_t seen = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen >= rank) {
        const uint64_t edge = UpperEdge(i);
        return edge < max_ ? edge : max_;
      }
    }
    return max_;
  }

 private:
  static constexpr size_t kBuckets = (kMaxExponent + 1) * kSubBuckets;
  static size_t IndexOf(uint64_t v) {
    if (v < kSubBuckets) return static_cast<size_t>(v);
    int exponent = std::bit_width(v) - 1 - kSubBucketBits + 1;  // shift keeping kSubBucketBits
    if (exponent > kMaxExponent) return kBuckets - 1;
    const uint64_t sub = (v >> (exponent - 1)) & (kSubBuckets - 1);
    return static_cast<size_t>(exponent) * kSubBuckets + sub;
  }
  static uint64_t UpperEdge(size_t index) {
    const uint64_t exponent = index / kSubBuckets, sub = index % kSubBuckets;
    if (exponent == 0) return sub;
    return ((kSubBuckets + sub + 1) << (exponent - 1)) - 1;
  }
  std::array<uint64_t, kBuckets> counts_{};
  uint64_t total_ = 0;
  uint64_t max_ = 0;
};

}  // namespace bench

#endif  // HERD_BENCH_HISTOGRAM_H_
