// The writer's and the copier's access to one bucket line: 64-bit atomic words (so racing a
// reader is defined behaviour, and free on x86). Internal to hopscotch/.
#ifndef HERD_HOPSCOTCH_LINE_H_
#define HERD_HOPSCOTCH_LINE_H_

#include <atomic>
#include <cstdint>

namespace hopscotch {

inline uint64_t LoadWord(const uint8_t* bucket, int w) {
  auto* words = reinterpret_cast<uint64_t*>(const_cast<uint8_t*>(bucket));
  return std::atomic_ref<uint64_t>(words[w]).load(std::memory_order_relaxed);
}

inline void StoreWord(uint8_t* bucket, int w, uint64_t value,
                      std::memory_order order = std::memory_order_relaxed) {
  std::atomic_ref<uint64_t>(reinterpret_cast<uint64_t*>(bucket)[w]).store(value, order);
}

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_LINE_H_
