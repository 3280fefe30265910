#include "herd/send_chains.h"

#include "glog/logging.h"

namespace herd {

SendChains::SendChains(uint32_t max_wrs)
    : wrs_(max_wrs), sges_(max_wrs), queues_(max_wrs), heads_(max_wrs), tails_(max_wrs) {}

void SendChains::Append(SendQueue* queue) {
  transport::SendWr& wr = wrs_[count_];
  wr.sg_list = &sges_[count_];
  ++count_;
  uint32_t c = 0;
  while (c < chains_ && queues_[c] != queue) ++c;
  if (c == chains_) {
    queues_[chains_++] = queue;
    heads_[c] = &wr;
  } else {
    tails_[c]->next = &wr;
  }
  tails_[c] = &wr;
}

uint32_t SendChains::Post() {
  uint32_t not_posted = 0;
  for (uint32_t c = 0; c < chains_; ++c) {
    SendQueue& queue = *queues_[c];
    transport::SendWr* bad = nullptr;
    const absl::Status status = queue.qp->PostSend(heads_[c], &bad);
    uint32_t posted = 0;
    for (transport::SendWr* wr = heads_[c]; wr != nullptr && wr != bad; wr = wr->next) ++posted;
    if (!status.ok()) {
      LOG_EVERY_N(WARNING, 1000) << "post_send failed: " << status;
      not_posted += queue.unposted - posted;
      queue.broken = queue.qp->state() == transport::QpState::kError;
    }
    queue.posted += posted;
    queue.unposted = 0;
  }
  count_ = 0;
  chains_ = 0;
  return not_posted;
}

}  // namespace herd
