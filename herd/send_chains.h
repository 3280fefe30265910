// Posting WRs with one doorbell per send queue: the worker's responses, the client's requests
// (doorbell batching on both sides, as HERD does) and the raw echo baseline's responses. The
// caller reserves a WR of a queue (its index and staging buffer), fills it, and
// appends it; Post() then rings one doorbell per queue used, in append order within each, and
// keeps the queues' accounting (posted, broken) true whatever the fabric accepted.
#ifndef HERD_HERD_SEND_CHAINS_H_
#define HERD_HERD_SEND_CHAINS_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "herd/send_queue.h"
#include "transport/fabric.h"

namespace herd {

class SendChains {
 public:
  // At most `max_wrs` WRs between two Post()s (the postlist).
  explicit SendChains(uint32_t max_wrs);

  // Reserves the next WR of `queue` (the caller checked HasRoom) and returns its index in the
  // queue; the WR's staging buffer is queue.StagingFor(index).
  static uint64_t Reserve(SendQueue& queue) { return queue.posted + queue.unposted++; }
  // A WR to fill for the next response, with its SGE, both reset; appended by Append.
  transport::SendWr& NextWr() {
    transport::ResetSendWr(wrs_[count_]);
    return wrs_[count_];
  }
  transport::Sge& NextSge() { return sges_[count_]; }
  // Appends the WR returned by NextWr() to `queue`'s chain.
  void Append(SendQueue* queue);
  uint32_t size() const { return count_; }

  // One post_send per queue; returns the WRs that were not posted (a full or broken queue),
  // after marking such a queue broken when its QP is in the error state.
  uint32_t Post();

 private:
  std::vector<transport::SendWr> wrs_;
  std::vector<transport::Sge> sges_;
  std::vector<SendQueue*> queues_;  // one per chain
  std::vector<transport::SendWr*> heads_, tails_;
  uint32_t count_ = 0;
  uint32_t chains_ = 0;
};

// Waits until `queue` has room for one more WR, reaping completions with reap(); false when it
// is broken or still full after `max_wait` (a stuck peer or NIC: the caller drops the request
// and the client's retransmission runs it). Checks the clock every `reaps_per_clock_check`
// reaps only.
template <typename Reap>
bool AwaitRoom(SendQueue& queue, Reap&& reap, absl::Duration max_wait,
               uint32_t reaps_per_clock_check) {
  if (queue.broken) return false;
  if (queue.HasRoom()) return true;
  const absl::Time give_up = absl::Now() + max_wait;
  for (uint32_t reaps = 1; !queue.broken && !queue.HasRoom(); ++reaps) {
    reap();
    if (reaps % reaps_per_clock_check == 0 && absl::Now() > give_up) return false;
  }
  return !queue.broken;
}

}  // namespace herd

#endif  // HERD_HERD_SEND_CHAINS_H_
