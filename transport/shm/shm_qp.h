// A queue pair of the shared-memory fabric. In the synchronous mode the sender performs each
// transfer inside PostSend, in order, so RC's ordering and reliability hold by construction. In
// the asynchronous mode PostSend copies each WR (and its inline data) into the QP's pending ring
// and the device's progress thread executes them later, still in post order.
#ifndef HERD_TRANSPORT_SHM_SHM_QP_H_
#define HERD_TRANSPORT_SHM_SHM_QP_H_

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "transport/fabric.h"
#include "transport/shm/shm_internal.h"

namespace transport::shm {

class ShmQp : public QueuePair {
 public:
  static absl::StatusOr<std::unique_ptr<ShmQp>> Create(ShmDevice* device, const QpConfig& config,
                                                       uint32_t pd);
  ~ShmQp() override;

  absl::Status PostSend(SendWr* chain, SendWr** bad) override;
  absl::Status PostRecv(RecvWr* chain, RecvWr** bad) override;
  absl::Status Connect(const ConnectConfig& config) override;
  void SetError() override;
  QpState state() const override;
  QpEndpoint endpoint() const override;

  // qp_num() without building a whole endpoint: for the data path.
  uint32_t number() const { return entry_->qp_num.load(std::memory_order_relaxed); }
  // Progress thread only: executes the pending WRs that are due at `now_ns` (steady clock);
  // returns how many it executed, and sets *waiting when WRs remain.
  uint32_t Progress(int64_t now_ns, bool* waiting);

 private:
  ShmQp(ShmDevice* device, const QpConfig& config) : QueuePair(config), device_(device) {}
  // Receiver-not-ready retries of one RC WR.
  struct RnrRetries {
    uint32_t attempts = 0;
  };
  // Executes one WR; returns its completion status (kSuccess also for silent UC/UD drops). An RC
  // SEND or WRITE_WITH_IMM whose receiver has no receive posted is tried once: std::nullopt
  // means "retry after the RNR timer" (nothing was changed: the retry is the same attempt
  // again), counted in `rnr`.
  std::optional<CompletionStatus> Execute(const SendWr& wr, uint32_t* byte_len, RnrRetries* rnr);
  std::optional<CompletionStatus> Deliver(Peer& peer, uint32_t dst_qpn, const SendWr& wr,
                                          uint32_t* byte_len, RnrRetries* rnr);
  // The receiving QP's table entry and rings as `peer`'s segment describes them now (validated:
  // a peer's segment is hostile input).
  // No initializers: FindRings sets every field it succeeds with, and a batch's claims (below)
  // are not zeroed on every post.
  struct Receiver {
    RecvRing* ring;
    uint32_t ring_depth;
    CqRing* cq;
    uint32_t cq_depth;
    uint32_t cq_id;
  };
  // False when a ring is not valid.
  static bool FindRings(Peer& peer, const QpEntry& dst, Receiver* out);
  // The receive completion a message of `length` bytes from `wr` makes in receive `wr_id`.
  Completion ArrivalOf(const SendWr& wr, uint64_t wr_id, uint32_t dst_qpn, uint64_t length) const;
  // Places a SEND's bytes (after a GRH on UD) in the receive it took; a receive too short, or not
  // the receiver's memory, sets c->status and puts the receiver in ERR. Returns the sender's
  // status (RC: an error then).
  CompletionStatus PlaceSend(Peer& peer, QpEntry& dst, const SendWr& wr, const RecvEntry& recv,
                             uint64_t length, Completion* c);
  // Synchronous mode, UD, no fault injection: up to kMaxUdBatch SENDs posted together go as a
  // batch of runs (a run: consecutive SENDs to one receiver). A run's receives are claimed with
  // one CAS and its completions reserved with one, not two locked instructions per message. A
  // batch claims for its runs before it places any bytes: a locked instruction waits for every
  // earlier store to leave the store buffer, so a claim made after the previous receiver's bytes
  // and completion were stored waited for their lines to arrive from that receiver's core (a
  // sender answering many clients paid a cross-core miss per message). The batch first looks up
  // every run's receiver (loads only, so their misses overlap). (Prefetching each receiver's ring
  // entries and, for writing, its completion slots in that pass was slower: fabric_bench
  // --rows=fanout, 1.3x.) Same outcome as one by one, save that a claimed receive of a receiver
  // that went to ERR before its bytes were placed (by an earlier run of the batch, or by another
  // sender) completes flushed (a NIC flushes an ERR QP's receives) and counts a drop at the
  // receiver only, where one by one the message would have been dropped unclaimed (counted at
  // both ends). A run whose receives lie in a region not mapped here yet (the first message to
  // it maps the owner's file, which may wait) is the last one claimed, so no other receiver's
  // completions wait, reserved and unpublished, while it is mapped; its own receiver's do, as one
  // by one (Deliver reserves before it places). Known cost left: whatever else holds this thread
  // between the claims and the last placement holds the later runs' completions too, where one by
  // one held one receiver's at a time: being descheduled, a first touch of a fresh mapping's
  // page, a fault on this sender's own buffers, or a fault on a region's file (a memfd; a disk
  // file's page read back where the device maps unsealed files: shm_map_unsealed_regions).
  static constexpr uint32_t kMaxUdBatch = 16;
  bool StartsUdRun(const SendWr& wr) const;
  // Whether two SENDs of a batch (each one StartsUdRun took) go to one receiver: one run.
  static bool SameUdReceiver(const SendWr& a, const SendWr& b);
  // One run's receiver, and what was claimed there for the run's first WRs. Set by LocateUdRun
  // (the first four) and ClaimUdRun (the rest); no initializers, as for Receiver.
  struct UdClaim {
    Peer* peer;
    QpEntry* dst;
    Receiver receiver;
    uint32_t fit;       // the run's leading WRs within the receiver's MTU
    uint32_t taken;     // receives claimed, for the first `taken` WRs
    uint32_t reserved;  // completions reserved, from `ticket`, for the first `reserved`
    uint64_t ticket;
  };
  // Executes and completes batch[0, n) (WRs with sequences first_sequence...).
  void RunUdBatch(SendWr* const* batch, uint32_t n, uint64_t first_sequence);
  // Finds the receiver of run[0, n) and each WR's length; false when it takes no run (a dead or
  // cut peer, a receiver not ready for UD, no WR within its MTU): those go one by one.
  bool LocateUdRun(SendWr* const* run, uint32_t n, uint64_t* lengths, UdClaim* claim);
  // Claims receives for the run's first claim->fit WRs (into recvs) and their completions.
  void ClaimUdRun(uint32_t dst_qpn, const uint64_t* lengths, RecvEntry* recvs, UdClaim* claim);
  // Whether every receive the run claimed lies in a region mapped here (Peer::Mapped).
  static bool ReceivesMapped(const UdClaim& claim, const RecvEntry* recvs);
  // Places the claimed WRs' bytes and publishes their completions.
  void PlaceUdRun(SendWr* const* run, const uint64_t* lengths, const RecvEntry* recvs,
                  const UdClaim& claim);
  // The responder of an RDMA operation: our connected peer QP's table entry, or nullptr when that
  // QP is gone (RC: retry exceeded; UC: a silent drop, as from a NIC).
  QpEntry* Responder(Peer& peer) const;
  CompletionStatus RdmaWrite(Peer& peer, QpEntry& responder, const SendWr& wr);
  CompletionStatus RdmaRead(Peer& peer, const QpEntry& responder, const SendWr& wr,
                            uint32_t* byte_len);
  CompletionStatus Atomic(Peer& peer, const QpEntry& responder, const SendWr& wr);
  // Our address for a local SGE, or nullptr if its key or range is wrong.
  uint8_t* LocalBuffer(const Sge& sge, uint32_t need_access) const;
  Peer* PeerFor(const SendWr& wr);
  uint64_t TotalLength(const SendWr& wr) const;
  void Complete(const SendWr& wr, CompletionStatus status, uint32_t byte_len, uint64_t seq);
  // Synchronous mode: executes one WR now and completes it; or, for an RC WR that meets a
  // receiver not ready (or follows one that did), queues it for the device's progress thread,
  // which retries it after the RNR timer as a NIC would: PostSend never waits on a peer.
  void Run(const SendWr& wr, uint64_t sequence);
  // Completes an executed WR; a failure puts the QP in ERR.
  void Finish(const SendWr& wr, CompletionStatus status, uint32_t byte_len, uint64_t sequence);
  // Copies `wr` into the pending ring, due at `due_ns` with `rnr` retries behind it (room is
  // guaranteed by the send-queue depth check: a WR leaves the ring before its completion can
  // free its slot). Asynchronous mode: every WR; synchronous mode: an RC QP's WRs from one that
  // met a receiver not ready until the ring drains.
  void Enqueue(const SendWr& wr, uint64_t sequence, int64_t due_ns, RnrRetries rnr);
  // Asynchronous mode: a pending UD WR executed or was discarded; its AH may go.
  void ReleaseAh(const SendWr& wr) const;

  // One pending WR: a copy whose sg_list points at its own SGE copies (or, for inline data, at
  // its own copy of the bytes).
  struct Pending {
    SendWr wr;
    uint64_t sequence;
    int64_t due_ns;  // steady clock: the injected delay, then each RNR timer
    RnrRetries rnr;
  };
  std::vector<Pending> pending_;
  std::vector<Sge> pending_sges_;          // max_send_sge per entry
  std::vector<uint8_t> pending_inline_;    // max_inline_data per entry
  std::atomic<uint64_t> pending_tail_{0};  // written by PostSend
  std::atomic<uint64_t> pending_head_{0};  // written by the progress thread
  // Synchronous RC: the poster's view of whether WRs wait in the pending ring (a later WR must
  // queue behind them: an RC QP executes in order). Read and written by the poster only.
  bool deferring_ = false;
  ShmDevice* device_;
  uint32_t pd_ = 0;  // our protection domain: local SGEs must be registered in it
  QpEntry* entry_ = nullptr;
  RecvRing* recv_ring_ = nullptr;
  uint64_t recv_ring_offset_ = 0, recv_ring_bytes_ = 0;  // given back when destroyed
  ShmCq* send_cq_ = nullptr;
  ConnectConfig connect_{};
  std::shared_ptr<Peer> connected_peer_;  // RC/UC
  // True when fault injection loses the next WR (UD SEND; UC WRITE or SEND).
  bool InjectLoss();
  // Fault injection: lands a WRITE's bytes at `dst` out of order and partly twice (see
  // FaultOptions::write_disorder).
  void DisorderedCopy(uint8_t* dst, const SendWr& wr, uint64_t length);
  // RC/UC: whether `entry` (a peer's QP) is connected to this QP of this device.
  bool ConnectedToUs(const QpEntry& entry) const;

  void SyncCounters() const override;
  // This QP's own messages lost silently (the outbound half of counters().dropped).
  Counter outbound_dropped_;

  bool ud_runs_ = false;  // UD, synchronous, no fault injection: SENDs may go as runs
  // UD: the GRH every SEND of this QP lands with (its device's GID, which never changes), built
  // once. Built per SEND from a PortInfo returned through the stack, the GID's 16-byte reload
  // failed store forwarding and so waited for every earlier store of the run to leave the store
  // buffer, the last receiver's completion line included: one cross-core miss per message.
  alignas(8) uint8_t grh_image_[kGrhBytes] = {};
  uint64_t posted_ = 0;          // send WRs posted, ever
  uint64_t recv_head_seen_ = 0;  // PostRecv's last read of the receive ring's head (see there)
  uint64_t loss_state_ = 0;      // fault injection generator (splitmix64 state)
  uint64_t disorder_state_ = 0;  // write disorder's own generator: loss draws stay as they were
  uint64_t jitter_state_ = 0;    // delay jitter's own generator
};

}  // namespace transport::shm

#endif  // HERD_TRANSPORT_SHM_SHM_QP_H_
