// Selective signalling and send-queue flow control for one QP, as both sides of herd use it:
// one WR in `unsig_batch` is signalled, and a signalled completion retires every WR posted
// before it, so the sender knows which queue slots (and which staging buffers) are free without
// a completion per WR.
#ifndef HERD_HERD_SEND_QUEUE_H_
#define HERD_HERD_SEND_QUEUE_H_

#include <cstdint>

#include "transport/fabric.h"
#include "util/modulo.h"

namespace herd {

// wr_id layout of a signalled send: [table slot : 16][generation : 8][WR index : 40]. The slot
// finds the queue among many sharing one CQ; the generation rejects a completion that belongs to
// an earlier QP in the same slot.
inline constexpr int kWrIndexBits = 40;
inline constexpr int kWrGenerationBits = 8;
inline constexpr uint64_t kWrIndexMask = (uint64_t{1} << kWrIndexBits) - 1;

struct SendQueue {
  transport::QueuePair* qp = nullptr;
  uint32_t depth = 0;        // the QP's max_send_wr
  uint32_t unsig_batch = 1;  // one WR in this many is signalled
  uint16_t table_slot = 0;
  uint8_t generation = 0;
  uint64_t posted = 0;    // WRs posted, ever (the next WR's index)
  uint64_t retired = 0;   // WRs known complete
  bool broken = false;    // an error completion arrived: the QP is in ERR, post nothing more
  uint32_t unposted = 0;  // WRs assigned in the batch being built, not yet posted
  // Staging buffers: WR i uses buffer i % depth, free again once WR i - depth retired (which
  // the depth limit guarantees before WR i can be posted).
  uint8_t* staging = nullptr;
  uint32_t staging_lkey = 0;
  uint32_t buffer_bytes = 0;

  // Room for one more WR after those already assigned.
  bool HasRoom() const { return posted + unposted - retired < depth; }
  uint8_t* StagingFor(uint64_t index) const {
    return staging + util::Mod(index, depth) * buffer_bytes;
  }
  bool Signal(uint64_t index) const { return util::Mod(index, unsig_batch) == unsig_batch - 1; }
  uint64_t WrId(uint64_t index) const {
    return (uint64_t{table_slot} << (kWrIndexBits + kWrGenerationBits)) |
           (uint64_t{generation} << kWrIndexBits) | (index & kWrIndexMask);
  }
  // Applies a signalled completion's wr_id (already matched to this queue's slot). The wr_id
  // carries only the low kWrIndexBits of the WR's index: the full index is the one in
  // (posted - 2^kWrIndexBits, posted) with those low bits (at most `depth` WRs are in flight).
  void Complete(uint64_t wr_id, bool success) {
    if (static_cast<uint8_t>(wr_id >> kWrIndexBits) != generation) return;  // an older QP's
    if (!success) broken = true;
    const uint64_t behind = (posted - 1 - wr_id) & kWrIndexMask;  // how far before the newest
    if (behind >= posted) return;                                 // names a WR never posted
    const uint64_t index = posted - 1 - behind;
    if (index >= retired) retired = index + 1;
  }
};

inline uint16_t TableSlotOf(uint64_t wr_id) {
  return static_cast<uint16_t>(wr_id >> (kWrIndexBits + kWrGenerationBits));
}

}  // namespace herd

#endif  // HERD_HERD_SEND_QUEUE_H_
