// DirtyRanges: the byte ranges of a partition's region that its operations changed, so a replica
// of the same layout is kept byte-identical by copying only those ranges (herd's replication
// RDMA-WRITEs them at the same offsets). The partition and its slab allocator report changes to
// one; they know nothing else of replication.
#ifndef HERD_MICA_DIRTY_RANGES_H_
#define HERD_MICA_DIRTY_RANGES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace mica {

// Fixed capacity, no allocation:
// overlapping or touching ranges merge; when full, a new range merges into the one it is
// nearest to (a superset, never a loss) and overflowed() says so.
struct ByteRange {
  uint64_t offset;
  uint64_t bytes;
};
class DirtyRanges {
 public:
  static constexpr size_t kDefaultCapacity = 64;

  // Storage for `capacity` ranges is allocated here, once: Add never allocates.
  explicit DirtyRanges(size_t capacity = kDefaultCapacity) : ranges_(capacity) {}

  void Add(uint64_t offset, uint64_t bytes);
  void Clear() {
    count_ = 0;
    overflowed_ = false;
  }
  absl::Span<const ByteRange> ranges() const { return {ranges_.data(), count_}; }
  bool overflowed() const { return overflowed_; }
  size_t capacity() const { return ranges_.size(); }

 private:
  std::vector<ByteRange> ranges_;
  size_t count_ = 0;
  bool overflowed_ = false;
};

}  // namespace mica

#endif  // HERD_MICA_DIRTY_RANGES_H_
