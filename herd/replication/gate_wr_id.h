// The replication gate's work request ids: which link (and which adoption of its slot) a
// completion belongs to, and what it completes (a batch's chain, a transfer chunk, an idle
// watermark). Include only from herd/replication/gate*.cc.
#ifndef HERD_HERD_REPLICATION_GATE_WR_ID_H_
#define HERD_HERD_REPLICATION_GATE_WR_ID_H_

#include <cstddef>
#include <cstdint>

namespace herd::gate_wr_id {

// A completion's wr_id: the link's index, then its epoch (the adoptions of its slot: a flushed
// completion of a dropped link's old QP names an older one), then a batch, or a transfer chunk.
inline constexpr int kLinkShift = 56;
inline constexpr int kEpochShift = 48;
inline constexpr uint64_t kEpochMask = 0xff;
inline constexpr uint64_t kChunkFlag = uint64_t{1} << 47;
// An idle watermark WRITE (PostWatermarks); its low bits name the last batch posted before it.
inline constexpr uint64_t kWatermarkFlag = uint64_t{1} << 46;
inline constexpr uint64_t kBatchMask = kWatermarkFlag - 1;
inline uint64_t WrIdOf(size_t link, uint64_t epoch, uint64_t low) {
  return (uint64_t{link} << kLinkShift) | ((epoch & kEpochMask) << kEpochShift) | low;
}

}  // namespace herd::gate_wr_id

#endif  // HERD_HERD_REPLICATION_GATE_WR_ID_H_
