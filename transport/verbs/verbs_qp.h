// A queue pair of the libibverbs backend. PostSend translates our chain into a work-request array
// preallocated at creation and rings ONE doorbell (one ibv_post_send) for the whole chain.
//
// Send-queue depth is enforced in software at exactly max_send_wr, as on the shm fabric:
// providers round queue sizes up (rxe: to 2^k - 1, mlx5: further), so without this a program
// that forgets to signal would pass here with the provider's slack and fail on another NIC.
#ifndef HERD_TRANSPORT_VERBS_VERBS_QP_H_
#define HERD_TRANSPORT_VERBS_VERBS_QP_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <memory>

#include "transport/verbs/verbs_internal.h"

namespace transport::verbs {

class VerbsQp : public QueuePair {
 public:
  static absl::StatusOr<std::unique_ptr<VerbsQp>> Create(VerbsDevice* device, ibv_pd* pd,
                                                         const QpConfig& config);
  ~VerbsQp() override;

  absl::Status PostSend(SendWr* chain, SendWr** bad) override;
  absl::Status PostRecv(RecvWr* chain, RecvWr** bad) override;
  absl::Status Connect(const ConnectConfig& config) override;
  void SetError() override;
  QpState state() const override;
  QpEndpoint endpoint() const override;

  // Called by the send CQ's poller for each send completion of this QP: a signalled success
  // frees the queue slots up to it; an error means the provider flushes everything.
  void OnSendCompletion(bool success);

 private:
  VerbsQp(VerbsDevice* device, const QpConfig& config) : QueuePair(config), device_(device) {}
  // Writes the fields of `out` (a pre-linked WR: next and sg_list stay) that `wr` sets.
  void Translate(const SendWr& wr, ibv_send_wr* out) const;
  absl::Status ModifyToInit(const ConnectConfig& config);
  absl::Status ModifyToRtr(const ConnectConfig& config);
  absl::Status ModifyToRts(const ConnectConfig& config);
  // Posts the first `count` translated WRs of the chain starting at `chain`.
  absl::Status Ring(SendWr* chain, size_t count, SendWr** bad);

  VerbsDevice* device_;
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0;
  std::atomic<QpState> state_{QpState::kReset};

  // Preallocated translation buffers: max_send_wr WRs x max_send_sge SGEs (and the same for
  // receives), so the data path allocates nothing; each WR linked to the next and to its own
  // SGEs at creation.
  std::unique_ptr<ibv_send_wr[]> send_wrs_;
  std::unique_ptr<ibv_sge[]> send_sges_;
  std::unique_ptr<ibv_recv_wr[]> recv_wrs_;
  std::unique_ptr<ibv_sge[]> recv_sges_;

  // Software send-queue accounting. posted_ is written by the posting thread; the ring of
  // signalled sequence numbers is single-producer (poster) single-consumer (poller).
  std::atomic<uint64_t> posted_{0};
  std::atomic<uint64_t> retired_{0};
  std::unique_ptr<uint64_t[]> signaled_ring_;  // max_send_wr entries
  std::atomic<uint64_t> ring_head_{0};         // poller
  std::atomic<uint64_t> ring_tail_{0};         // poster
};

}  // namespace transport::verbs

#endif  // HERD_TRANSPORT_VERBS_VERBS_QP_H_
