#include "mica/dirty_ranges.h"

#include <algorithm>

namespace mica {

void DirtyRanges::Add(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return;
  const uint64_t end = offset + bytes;
  for (size_t i = 0; i < count_; ++i) {
    ByteRange& r = ranges_[i];
    if (offset <= r.offset + r.bytes && r.offset <= end) {  // overlapping or touching
      const uint64_t lo = std::min(r.offset, offset);
      r.bytes = std::max(r.offset + r.bytes, end) - lo;
      r.offset = lo;
      return;
    }
  }
  if (count_ < ranges_.size()) {
    ranges_[count_++] = ByteRange{offset, bytes};
    return;
  }
  overflowed_ = true;
  size_t nearest = 0;
  uint64_t nearest_gap = UINT64_MAX;
  for (size_t i = 0; i < count_; ++i) {
    const ByteRange& r = ranges_[i];
    const uint64_t gap =
        offset >= r.offset + r.bytes ? offset - (r.offset + r.bytes) : r.offset - end;
    if (gap < nearest_gap) {
      nearest = i;
      nearest_gap = gap;
    }
  }
  ByteRange& r = ranges_[nearest];
  const uint64_t lo = std::min(r.offset, offset);
  r.bytes = std::max(r.offset + r.bytes, end) - lo;
  r.offset = lo;
}

}  // namespace mica
