// A statistics counter with one writer and any number of readers.
#ifndef HERD_UTIL_COUNTER_H_
#define HERD_UTIL_COUNTER_H_

#include <atomic>
#include <cstdint>

namespace util {

// One thread adds (the owner of the QP, CQ or partition it counts); any thread may read. A
// relaxed load and store is a plain add on x86 (no lock prefix) and keeps readers free of data
// races; two concurrent writers would lose counts, so only one may write (except RaiseTo).
struct Counter {
  std::atomic<uint64_t> value{0};
  void Add(uint64_t n = 1) {
    value.store(value.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  uint64_t Get() const { return value.load(std::memory_order_relaxed); }
  // Sets the counter to `total` unless it already shows more: for a counter whose total is
  // computed from monotonic sources by any thread (see transport::QueuePair::SyncCounters).
  void RaiseTo(uint64_t total) {
    uint64_t shown = value.load(std::memory_order_relaxed);
    while (shown < total && !value.compare_exchange_weak(shown, total, std::memory_order_relaxed)) {
    }
  }
};

// A level (not a running total) with one writer that sets it and any number of readers.
struct Gauge {
  std::atomic<uint64_t> value{0};
  void Set(uint64_t v) { value.store(v, std::memory_order_relaxed); }
  uint64_t Get() const { return value.load(std::memory_order_relaxed); }
};

}  // namespace util

#endif  // HERD_UTIL_COUNTER_H_
