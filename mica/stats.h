// Per-partition counters. One core writes them (EREW); any thread may read them.
#ifndef HERD_MICA_STATS_H_
#define HERD_MICA_STATS_H_

#include <atomic>
#include <cstdint>

namespace mica {

// A counter with a single writer: a relaxed load and store (a plain add on x86, no lock prefix)
// keep concurrent readers free of data races.
class Counter {
 public:
  void Add(uint64_t n = 1) {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  uint64_t Get() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

struct PartitionStats {
  Counter get_hits;
  Counter get_misses;
  Counter inserts;     // PUT of a key the index did not hold
  Counter overwrites;  // PUT of a key the index held
  Counter deletes;
  Counter delete_misses;
  Counter cas_ok;
  Counter cas_failed;  // version mismatch
  Counter cas_misses;
  Counter evictions;  // live index entries displaced from a full bucket
  Counter rejected;   // key or value out of bounds
  Counter log_wraps;  // times the log tail passed the ring's end
};

}  // namespace mica

#endif  // HERD_MICA_STATS_H_
