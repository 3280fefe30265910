// The shared-memory fabric's data path: PostSend executes each WR against the peer's segment.
#include "transport/shm/shm_qp.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "absl/strings/str_format.h"
#include "transport/shm/ordered_copy.h"

namespace transport::shm {

namespace {

// rnr_retry = 7 means "retry forever" in verbs; the device's progress thread does (it moves on to
// other QPs meanwhile), in both modes.
constexpr uint8_t kRnrRetryForever = 7;
constexpr uint32_t kAtomicBytes = 8;

bool IsError(QpState state) { return state == QpState::kError; }

// Seeds write disorder's generator apart from the loss generator of the same QP.
constexpr uint64_t kDisorderStream = 0x6469736f72646572ull;  // "disorder"
// ... and delay jitter's.
constexpr uint64_t kJitterStream = 0x6a69747465720000ull;  // "jitter"
constexpr uint64_t kWordBytes = 8;

// splitmix64: one multiply-xorshift step per draw.
uint64_t NextRandom(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A uniform double in [0, 1) from the top 53 bits of a draw.
double NextUniform(uint64_t* state) {
  return static_cast<double>(NextRandom(state) >> 11) * 0x1.0p-53;
}

CompletionOpcode CompletionOpcodeOf(Opcode opcode) {
  switch (opcode) {
    case Opcode::kSend:
    case Opcode::kSendWithImm:
      return CompletionOpcode::kSend;
    case Opcode::kWrite:
    case Opcode::kWriteWithImm:
      return CompletionOpcode::kWrite;
    case Opcode::kRead:
      return CompletionOpcode::kRead;
    case Opcode::kCompareSwap:
      return CompletionOpcode::kCompareSwap;
    case Opcode::kFetchAdd:
      return CompletionOpcode::kFetchAdd;
  }
  return CompletionOpcode::kSend;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmQp>> ShmQp::Create(ShmDevice* device, const QpConfig& config,
                                                     uint32_t pd) {
  if (config.send_cq == nullptr || config.recv_cq == nullptr) {
    return absl::InvalidArgumentError("a QP needs a send CQ and a receive CQ");
  }
  auto* send_cq = dynamic_cast<ShmCq*>(config.send_cq);
  auto* recv_cq = dynamic_cast<ShmCq*>(config.recv_cq);
  if (send_cq == nullptr || recv_cq == nullptr || send_cq->device() != device ||
      recv_cq->device() != device) {
    return absl::InvalidArgumentError("the QP's CQs must belong to the same shm device");
  }
  if (config.max_send_wr == 0 || config.max_recv_wr == 0 || config.max_send_sge == 0) {
    return absl::InvalidArgumentError("max_send_wr, max_recv_wr and max_send_sge must be > 0");
  }
  if (config.max_recv_sge != 1) {
    return absl::InvalidArgumentError("the shm fabric supports exactly one SGE per receive");
  }
  std::unique_ptr<ShmQp> qp(new ShmQp(device, config));
  qp->pd_ = pd;
  const uint64_t ring_bytes = sizeof(RecvRing) + uint64_t{config.max_recv_wr} * sizeof(RecvEntry);
  absl::StatusOr<ShmDevice::Extent> ring = device->Carve(ring_bytes);
  if (!ring.ok()) return ring.status();
  absl::StatusOr<QpEntry*> entry = device->AddQp(qp.get(), config.type, pd);
  if (!entry.ok()) {
    device->Release(ring->offset, ring_bytes);
    return entry.status();
  }
  // Published in RESET, which every sender refuses: the ring is made ready before its offset
  // is written, and a reused one (segment.h) gets its owner first, then counters past its last
  // life's.
  qp->entry_ = *entry;
  qp->recv_ring_offset_ = ring->offset;
  qp->recv_ring_bytes_ = ring_bytes;
  RecvRing* recv = ring->fresh ? new (device->segment().base() + ring->offset) RecvRing()
                               : device->segment().At<RecvRing>(ring->offset);
  const uint64_t start =
      ring->fresh ? 0
                  : NextLifeStart(recv->head.load(std::memory_order_acquire),
                                  recv->tail.load(std::memory_order_acquire), config.max_recv_wr);
  recv->owner.store(qp->entry_->qp_num.load(std::memory_order_relaxed), std::memory_order_release);
  recv->depth = config.max_recv_wr;
  recv->tail_seen.store(start, std::memory_order_release);
  recv->head.store(start, std::memory_order_release);
  recv->tail.store(start, std::memory_order_release);
  qp->recv_ring_ = recv;
  qp->recv_head_seen_ = start;
  qp->entry_->recv_ring_offset = ring->offset;
  qp->entry_->recv_cq_offset = recv_cq->offset();
  qp->entry_->recv_cq_id.store(recv_cq->id(), std::memory_order_release);
  qp->send_cq_ = send_cq;
  // Decided once: the device's mode and faults are fixed for its life.
  qp->ud_runs_ = config.type == QpType::kUd && !device->async() && !device->faults().any();
  // An InfiniBand-layout GRH naming the sender: its device's GID, which a program using this
  // fabric cannot choose (the segment's fabric, pid and descriptor).
  const Gid source = device->port().gid;
  std::memcpy(qp->grh_image_ + kGrhSourceGidOffset, source.data(), source.size());
  qp->loss_state_ = device->faults().seed ^ (uint64_t{qp->number()} << 32);
  qp->disorder_state_ = qp->loss_state_ ^ kDisorderStream;
  qp->jitter_state_ = qp->loss_state_ ^ kJitterStream;
  // Synchronous RC QPs queue WRs too, from one that meets a receiver not ready (Run).
  if (device->async() || config.type == QpType::kRc) {
    qp->pending_.resize(config.max_send_wr);
    qp->pending_sges_.resize(uint64_t{config.max_send_wr} * config.max_send_sge);
    qp->pending_inline_.resize(uint64_t{config.max_send_wr} * config.max_inline_data);
  }
  return qp;
}

ShmQp::~ShmQp() {
  if (entry_ != nullptr) {
    // The last inbound drops, before the table entry goes: the registry's last look.
    LeaveCounterRegistry();
    device_->RemoveQp(entry_);  // after it, the progress thread never enters this QP again
    device_->Release(recv_ring_offset_, recv_ring_bytes_);
  }
  // WRs that never executed no longer name their address handles.
  const uint64_t tail = pending_tail_.load(std::memory_order_acquire);
  for (uint64_t head = pending_head_.load(std::memory_order_acquire); head != tail; ++head) {
    ReleaseAh(pending_[head % pending_.size()].wr);
  }
}

void ShmQp::ReleaseAh(const SendWr& wr) const {
  if (config_.type == QpType::kUd) static_cast<const ShmAh*>(wr.ah)->RemovePending();
}

void ShmQp::SyncCounters() const {
  const uint64_t inbound = entry_ == nullptr ? 0 : entry_->dropped.load(std::memory_order_relaxed);
  counters_.dropped.RaiseTo(outbound_dropped_.Get() + inbound);
}

QpState ShmQp::state() const {
  return static_cast<QpState>(entry_->state.load(std::memory_order_acquire));
}

QpEndpoint ShmQp::endpoint() const {
  QpEndpoint endpoint;
  endpoint.qp_num = entry_->qp_num.load(std::memory_order_relaxed);
  endpoint.gid = device_->port().gid;
  return endpoint;
}

void ShmQp::SetError() {
  entry_->state.store(static_cast<uint8_t>(QpState::kError), std::memory_order_release);
}

absl::Status ShmQp::Connect(const ConnectConfig& config) {
  if (state() != QpState::kReset) {
    return absl::FailedPreconditionError(
        absl::StrFormat("Connect needs a QP in RESET, this one is %s", ToString(state())));
  }
  connect_ = config;
  if (config_.type != QpType::kUd) {
    ShmAddress address;
    std::memcpy(&address, config.remote.gid.data(), sizeof(address));
    if (address.fabric_id != device_->segment().header()->fabric_id) {
      return absl::InvalidArgumentError("remote GID is not a shm device of this fabric");
    }
    absl::StatusOr<std::shared_ptr<Peer>> peer = device_->PeerAt(address);
    if (!peer.ok()) return peer.status();
    const QpEntry& remote =
        (*peer)->header()->qps[config.remote.qp_num & ((1u << kQpIndexBits) - 1)];
    if (remote.qp_num.load(std::memory_order_acquire) != config.remote.qp_num ||
        remote.type != static_cast<uint8_t>(config_.type)) {
      return absl::NotFoundError(absl::StrFormat("remote QP %d does not exist or is not %s",
                                                 config.remote.qp_num, ToString(config_.type)));
    }
    connected_peer_ = *std::move(peer);
    entry_->remote_qpn = config.remote.qp_num;
    entry_->remote_pid = address.pid;
    entry_->remote_fd = address.fd;
  }
  entry_->qkey = config.qkey;
  entry_->state.store(static_cast<uint8_t>(QpState::kRts), std::memory_order_release);
  return absl::OkStatus();
}

absl::Status ShmQp::PostRecv(RecvWr* chain, RecvWr** bad) {
  if (state() == QpState::kReset) {
    *bad = chain;
    return absl::FailedPreconditionError("PostRecv on a QP in RESET");
  }
  for (RecvWr* wr = chain; wr != nullptr; wr = wr->next) {
    const uint64_t tail = recv_ring_->tail.load(std::memory_order_relaxed);
    // No SGE: a receive for WRITE_WITH_IMM (its data goes to the WRITE's address) or an empty
    // SEND, as verbs allows.
    if (wr->num_sge > 1) {
      *bad = wr;
      return absl::InvalidArgumentError("shm receives take at most one SGE");
    }
    const uint32_t depth = config_.max_recv_wr;  // not the ring's copy: peers can write it
    // Senders write head: read it only when the ring looks full by the last value seen, not per
    // receive (each read would pull the line from the sender's core).
    if (tail - recv_head_seen_ >= depth) {
      recv_head_seen_ = recv_ring_->head.load(std::memory_order_acquire);
    }
    if (tail - recv_head_seen_ >= depth) {
      *bad = wr;
      return absl::ResourceExhaustedError(absl::StrFormat("receive queue full (%d)", depth));
    }
    recv_ring_->entries[tail % depth] =
        wr->num_sge == 0
            ? RecvEntry{wr->wr_id, 0, 0, 0}
            : RecvEntry{wr->wr_id, wr->sg_list[0].addr, wr->sg_list[0].length, wr->sg_list[0].lkey};
    recv_ring_->tail.store(tail + 1, std::memory_order_release);
    counters_.recv_wrs.Add();
  }
  return absl::OkStatus();
}

uint64_t ShmQp::TotalLength(const SendWr& wr) const {
  uint64_t total = 0;
  for (uint32_t i = 0; i < wr.num_sge; ++i) total += wr.sg_list[i].length;
  return total;
}

absl::Status ShmQp::PostSend(SendWr* chain, SendWr** bad) {
  if (state() == QpState::kReset || state() == QpState::kInit) {
    *bad = chain;
    return absl::FailedPreconditionError(
        absl::StrFormat("PostSend on a QP in %s", ToString(state())));
  }
  bool rang = false;
  // The poller advances `retired` (in the segment): read it once per chain, again only if the
  // queue looks full.
  uint64_t retired = entry_->retired.load(std::memory_order_acquire) & kRetiredCountMask;
  // One jitter draw per doorbell: the chain lands late as a whole (a link that lags), not each
  // WR by its own draw (a chain's last WR would then land near the maximum on every QP).
  const uint32_t jitter_us = device_->faults().delay_jitter_us;
  const int64_t jitter_ns =
      jitter_us == 0
          ? 0
          : static_cast<int64_t>(NextRandom(&jitter_state_) % (uint64_t{jitter_us} * 1000 + 1));
  // Synchronous UD: consecutive SENDs, executed together (kMaxUdBatch).
  SendWr* batch[kMaxUdBatch];
  uint32_t batch_length = 0;
  uint64_t batch_sequence = 0;
  auto flush_batch = [&] {
    if (batch_length > 0) RunUdBatch(batch, batch_length, batch_sequence);
    batch_length = 0;
  };
  // A chain refused partway still rang for the WRs before the refusal (as a NIC does).
  auto refuse = [&](SendWr* wr, absl::Status status) {
    flush_batch();
    if (rang) counters_.doorbells.Add();
    *bad = wr;
    return status;
  };
  for (SendWr* wr = chain; wr != nullptr; wr = wr->next) {
    if (absl::Status status = ValidateSend(*wr); !status.ok()) return refuse(wr, status);
    if (posted_ - retired >= config_.max_send_wr) {
      retired = entry_->retired.load(std::memory_order_acquire) & kRetiredCountMask;
    }
    if (posted_ - retired >= config_.max_send_wr) {
      return refuse(wr, absl::ResourceExhaustedError(absl::StrFormat(
                            "send queue full (%d WRs outstanding): signal a WR and poll its "
                            "completion",
                            config_.max_send_wr)));
    }
    const uint64_t sequence = ++posted_;
    const uint64_t bytes = TotalLength(*wr);
    rang = true;
    counters_.wrs.Add();
    counters_.bytes.Add(bytes);
    if (wr->flags & kSignaled) counters_.signaled_wrs.Add();
    if (wr->flags & kInline) counters_.inline_wrs.Add();
    if (device_->async()) {
      Enqueue(*wr, sequence, SteadyNanos() + int64_t{device_->faults().delay_us} * 1000 + jitter_ns,
              RnrRetries{});
    } else if (batch_length > 0 && batch_length < kMaxUdBatch && StartsUdRun(*wr)) {
      batch[batch_length++] = wr;
    } else {
      flush_batch();
      if (StartsUdRun(*wr)) {
        batch[batch_length++] = wr;
        batch_sequence = sequence;
      } else {
        Run(*wr, sequence);
      }
    }
  }
  flush_batch();
  if (rang) counters_.doorbells.Add();
  return absl::OkStatus();
}

void ShmQp::Run(const SendWr& wr, uint64_t sequence) {
  if (deferring_ && pending_head_.load(std::memory_order_acquire) ==
                        pending_tail_.load(std::memory_order_relaxed)) {
    deferring_ = false;  // every queued WR has completed: execute inline again
  }
  if (deferring_) {
    Enqueue(wr, sequence, SteadyNanos(), RnrRetries{});
    device_->WakeProgress();
    return;
  }
  uint32_t byte_len = static_cast<uint32_t>(TotalLength(wr));
  RnrRetries rnr;
  const std::optional<CompletionStatus> status =
      IsError(state()) ? CompletionStatus::kFlushed : Execute(wr, &byte_len, &rnr);
  if (!status.has_value()) {
    // Receiver not ready: the RNR timer runs on the progress thread, not in PostSend (a poster
    // never waits on one peer; the old synchronous wait slept up to a second here).
    Enqueue(wr, sequence, SteadyNanos() + int64_t{connect_.min_rnr_timer_us} * 1000, rnr);
    deferring_ = true;
    device_->WakeProgress();
    return;
  }
  Finish(wr, *status, byte_len, sequence);
}

void ShmQp::Finish(const SendWr& wr, CompletionStatus status, uint32_t byte_len,
                   uint64_t sequence) {
  if (status != CompletionStatus::kSuccess) SetError();
  Complete(wr, status, byte_len, sequence);
}

void ShmQp::Enqueue(const SendWr& wr, uint64_t sequence, int64_t due_ns, RnrRetries rnr) {
  const uint64_t tail = pending_tail_.load(std::memory_order_relaxed);
  const uint64_t index = tail % pending_.size();
  Pending& p = pending_[index];
  p.wr = wr;
  p.wr.next = nullptr;
  p.sequence = sequence;
  p.due_ns = due_ns;
  p.rnr = rnr;
  Sge* sges = &pending_sges_[index * config_.max_send_sge];
  if (wr.flags & kInline) {
    // The bytes are the WR's from now on: the caller may reuse its buffer at once.
    uint8_t* copy = &pending_inline_[index * config_.max_inline_data];
    uint64_t at = 0;
    for (uint32_t i = 0; i < wr.num_sge; ++i) {
      std::memcpy(copy + at, reinterpret_cast<const void*>(wr.sg_list[i].addr),
                  wr.sg_list[i].length);
      at += wr.sg_list[i].length;
    }
    sges[0] = Sge{reinterpret_cast<uint64_t>(copy), static_cast<uint32_t>(at), 0};
    p.wr.num_sge = 1;
  } else {
    for (uint32_t i = 0; i < wr.num_sge; ++i) sges[i] = wr.sg_list[i];
  }
  p.wr.sg_list = sges;
  if (config_.type == QpType::kUd) static_cast<const ShmAh*>(wr.ah)->AddPending();
  pending_tail_.store(tail + 1, std::memory_order_release);
}

uint32_t ShmQp::Progress(int64_t now_ns, bool* waiting) {
  uint64_t head = pending_head_.load(std::memory_order_relaxed);
  const uint64_t tail = pending_tail_.load(std::memory_order_acquire);
  if (head == tail) return 0;
  uint32_t executed = 0;
  for (; head != tail; ++head, ++executed) {
    Pending& p = pending_[head % pending_.size()];
    if (p.due_ns > now_ns) break;  // in order: nothing behind a WR that is not due yet runs
    uint32_t byte_len = static_cast<uint32_t>(TotalLength(p.wr));
    const std::optional<CompletionStatus> status =
        IsError(state()) ? CompletionStatus::kFlushed : Execute(p.wr, &byte_len, &p.rnr);
    if (!status.has_value()) {
      // Receiver not ready: this QP waits out the RNR timer; the device's other QPs do not.
      p.due_ns = now_ns + int64_t{connect_.min_rnr_timer_us} * 1000;
      break;
    }
    // The AH is released BEFORE the completion is pushed: once the poster can see the
    // completion, its send queue has room again and it may reuse this very pending entry (the
    // ring's head moves only after this pass), so nothing of `p` may be read after Finish.
    ReleaseAh(p.wr);
    Finish(p.wr, *status, byte_len, p.sequence);
  }
  pending_head_.store(head, std::memory_order_release);
  if (head != tail) *waiting = true;
  return executed;
}

void ShmQp::Complete(const SendWr& wr, CompletionStatus status, uint32_t byte_len,
                     uint64_t sequence) {
  // Errors always complete, signalled or not, as on hardware; an unsignalled success does not.
  if ((wr.flags & kSignaled) == 0 && status == CompletionStatus::kSuccess) return;
  Completion c;
  c.wr_id = wr.wr_id;
  c.status = status;
  c.opcode = CompletionOpcodeOf(wr.opcode);
  c.byte_len = byte_len;
  c.qp_num = number();
  PushCompletion(device_->segment().At<CqRing>(send_cq_->offset()), send_cq_->depth(),
                 send_cq_->id(), c, sequence);
}

uint8_t* ShmQp::LocalBuffer(const Sge& sge, uint32_t need_access) const {
  const uint32_t index = sge.lkey >> kMrIndexShift;
  if (index >= kMaxMrs) return nullptr;
  const MrEntry& entry = device_->segment().header()->mrs[index];
  if (!Grants(entry, sge.lkey, sge.addr, sge.length, need_access) || entry.pd != pd_) {
    return nullptr;
  }
  return reinterpret_cast<uint8_t*>(sge.addr);
}

Peer* ShmQp::PeerFor(const SendWr& wr) {
  // Address handles of this backend are ShmAh (CreateAddressHandle makes no other).
  return config_.type == QpType::kUd ? static_cast<const ShmAh*>(wr.ah)->peer()
                                     : connected_peer_.get();
}

std::optional<CompletionStatus> ShmQp::Execute(const SendWr& wr, uint32_t* byte_len,
                                               RnrRetries* rnr) {
  const bool reliable = config_.type == QpType::kRc;
  // Local buffers first: a bad lkey is the sender's own error on every QP type.
  if ((wr.flags & kInline) == 0 && wr.opcode != Opcode::kRead &&
      wr.opcode != Opcode::kCompareSwap && wr.opcode != Opcode::kFetchAdd) {
    for (uint32_t i = 0; i < wr.num_sge; ++i) {
      if (LocalBuffer(wr.sg_list[i], 0) == nullptr) return CompletionStatus::kLocalProtectionError;
    }
  }
  if (InjectLoss()) {
    outbound_dropped_.Add();
    return CompletionStatus::kSuccess;
  }
  Peer* peer = PeerFor(wr);
  // A partitioned peer looks like a dead one: nothing arrives, RC gives up on it.
  if (peer == nullptr || peer->header()->alive.load(std::memory_order_acquire) == 0 ||
      device_->CutFrom(*peer)) {
    if (reliable) return CompletionStatus::kRetryExceeded;
    outbound_dropped_.Add();
    return CompletionStatus::kSuccess;
  }
  switch (wr.opcode) {
    case Opcode::kSend:
    case Opcode::kSendWithImm: {
      const uint32_t dst = config_.type == QpType::kUd ? wr.remote_qpn : connect_.remote.qp_num;
      return Deliver(*peer, dst, wr, byte_len, rnr);
    }
    case Opcode::kWriteWithImm:
      return Deliver(*peer, connect_.remote.qp_num, wr, byte_len, rnr);
    case Opcode::kWrite:
    case Opcode::kRead:
    case Opcode::kCompareSwap:
    case Opcode::kFetchAdd:
      break;
  }
  if (!reliable && wr.opcode != Opcode::kWrite) return CompletionStatus::kLocalQpOperationError;
  QpEntry* responder = Responder(*peer);
  if (responder == nullptr) {
    if (reliable) return CompletionStatus::kRetryExceeded;
    outbound_dropped_.Add();
    return CompletionStatus::kSuccess;
  }
  switch (wr.opcode) {
    case Opcode::kWrite:
      return RdmaWrite(*peer, *responder, wr);
    case Opcode::kRead:
      return RdmaRead(*peer, *responder, wr, byte_len);
    case Opcode::kCompareSwap:
    case Opcode::kFetchAdd:
      return Atomic(*peer, *responder, wr);
    default:
      break;
  }
  return CompletionStatus::kLocalQpOperationError;
}

bool ShmQp::InjectLoss() {
  const FaultOptions& faults = device_->faults();
  double probability = 0;
  if (config_.type == QpType::kUd) probability = faults.ud_loss;
  if (config_.type == QpType::kUc) probability = faults.uc_loss;
  if (probability <= 0) return false;
  return NextUniform(&loss_state_) < probability;
}

void ShmQp::DisorderedCopy(uint8_t* dst, const SendWr& wr, uint64_t length) {
  // Copies the WRITE's bytes [begin, end) (gathered from its SGEs) to dst + begin.
  auto copy = [&](uint64_t begin, uint64_t end) {
    uint64_t at = 0;
    for (uint32_t i = 0; i < wr.num_sge && at < end; ++i) {
      const uint64_t sge_end = at + wr.sg_list[i].length;
      const uint64_t from = std::max(begin, at), to = std::min(end, sge_end);
      if (from < to) {
        std::memcpy(dst + from, reinterpret_cast<const uint8_t*>(wr.sg_list[i].addr) + (from - at),
                    to - from);
      }
      at = sge_end;
    }
  };
  auto copy_word = [&](uint64_t word) {
    copy(word * kWordBytes, std::min(length, (word + 1) * kWordBytes));
  };
  const uint64_t words = (length + kWordBytes - 1) / kWordBytes;
  if (words == 0) return;
  // A random order without a table: start anywhere, step by a stride coprime with the count.
  uint64_t word = NextRandom(&disorder_state_) % words;
  uint64_t stride = 1 + NextRandom(&disorder_state_) % words;
  while (std::gcd(stride, words) != 1) stride = stride % words + 1;
  for (uint64_t k = 0; k < words; ++k, word = (word + stride) % words) copy_word(word);
  std::this_thread::sleep_for(std::chrono::microseconds(device_->faults().disorder_pause_us));
  // Again: each word but the last with probability 1/2, then the last one.
  uint64_t bits = 0;
  for (uint64_t w = 0; w + 1 < words; ++w, bits >>= 1) {
    if (w % 64 == 0) bits = NextRandom(&disorder_state_);
    if (bits & 1) copy_word(w);
  }
  copy_word(words - 1);
}

QpEntry* ShmQp::Responder(Peer& peer) const {
  const uint32_t qpn = connect_.remote.qp_num;
  QpEntry& entry = peer.header()->qps[qpn & ((1u << kQpIndexBits) - 1)];
  return entry.qp_num.load(std::memory_order_acquire) == qpn && ConnectedToUs(entry) ? &entry
                                                                                     : nullptr;
}

bool ShmQp::ConnectedToUs(const QpEntry& entry) const {
  // The peer may be rewriting its entry: one relaxed read of each field.
  const ShmAddress self = device_->segment().address();
  auto& e = const_cast<QpEntry&>(entry);  // atomic_ref needs a mutable object; only loads here
  return std::atomic_ref<uint32_t>(e.remote_qpn).load(std::memory_order_relaxed) == number() &&
         std::atomic_ref<int32_t>(e.remote_pid).load(std::memory_order_relaxed) == self.pid &&
         std::atomic_ref<int32_t>(e.remote_fd).load(std::memory_order_relaxed) == self.fd;
}

CompletionStatus ShmQp::RdmaWrite(Peer& peer, QpEntry& responder, const SendWr& wr) {
  const uint64_t length = TotalLength(wr);
  uint8_t* dst = peer.Resolve(wr.rkey, wr.remote_addr, length, kRemoteWrite, responder.pd);
  if (dst == nullptr) {
    if (config_.type == QpType::kRc) return CompletionStatus::kRemoteAccessError;
    // UC: the responder silently drops a bad WRITE; both ends count it.
    outbound_dropped_.Add();
    responder.dropped.fetch_add(1, std::memory_order_relaxed);
    return CompletionStatus::kSuccess;
  }
  if (const double p = device_->faults().write_disorder;
      p > 0 && NextUniform(&disorder_state_) < p) {
    DisorderedCopy(dst, wr, length);
    return CompletionStatus::kSuccess;
  }
  for (uint32_t i = 0; i < wr.num_sge; ++i) {
    OrderedCopy(dst, reinterpret_cast<const uint8_t*>(wr.sg_list[i].addr), wr.sg_list[i].length);
    dst += wr.sg_list[i].length;
  }
  return CompletionStatus::kSuccess;
}

std::optional<CompletionStatus> ShmQp::Deliver(Peer& peer, uint32_t dst_qpn, const SendWr& wr,
                                               uint32_t* byte_len, RnrRetries* rnr) {
  const bool reliable = config_.type == QpType::kRc;
  QpEntry& dst = peer.header()->qps[dst_qpn & ((1u << kQpIndexBits) - 1)];
  const auto dst_state = static_cast<QpState>(dst.state.load(std::memory_order_acquire));
  auto drop = [&]() -> CompletionStatus {
    outbound_dropped_.Add();
    dst.dropped.fetch_add(1, std::memory_order_relaxed);
    return CompletionStatus::kSuccess;
  };
  if (dst.qp_num.load(std::memory_order_acquire) != dst_qpn || dst_state == QpState::kError ||
      dst_state == QpState::kReset || dst.type != static_cast<uint8_t>(config_.type) ||
      (config_.type != QpType::kUd && !ConnectedToUs(dst))) {
    return reliable ? CompletionStatus::kRetryExceeded : drop();
  }
  const uint64_t length = TotalLength(wr);
  const uint32_t grh = config_.type == QpType::kUd ? kGrhBytes : 0;
  if (config_.type == QpType::kUd && (length > peer.header()->mtu || wr.remote_qkey != dst.qkey)) {
    return drop();
  }
  // WRITE_WITH_IMM: the data goes to remote_addr; the receive only carries the immediate.
  const bool write_with_imm = wr.opcode == Opcode::kWriteWithImm;
  if (write_with_imm &&
      peer.Resolve(wr.rkey, wr.remote_addr, length, kRemoteWrite, dst.pd) == nullptr) {
    return reliable ? CompletionStatus::kRemoteAccessError : drop();
  }
  Receiver receiver;
  if (!FindRings(peer, dst, &receiver)) return reliable ? CompletionStatus::kRetryExceeded : drop();
  RecvRing* const ring = receiver.ring;
  const uint32_t ring_depth = receiver.ring_depth;
  CqRing* const cq = receiver.cq;
  const uint32_t cq_depth = receiver.cq_depth;
  const uint32_t cq_id = receiver.cq_id;
  // UD: a message larger than the receive at the head is the sender's problem: dropped (counted
  // at the receiver) before it takes the receive; the receiver's QP stays usable.
  const uint64_t min_length = config_.type == QpType::kUd ? length + grh : 0;
  RecvEntry recv;
  if (const Pop pop = PopReceive(ring, ring_depth, dst_qpn, &recv, min_length);
      pop != Pop::kTaken) {
    // The QP was destroyed (its ring is another's now): as if it was gone when looked up.
    if (pop == Pop::kGone) return reliable ? CompletionStatus::kRetryExceeded : drop();
    if (!reliable || pop == Pop::kTooSmall) return drop();
    // Receiver not ready: one attempt now, the next after the RNR timer (the progress thread's).
    if (connect_.rnr_retry != kRnrRetryForever && rnr->attempts >= connect_.rnr_retry) {
      return CompletionStatus::kRnrRetryExceeded;
    }
    ++rnr->attempts;
    return std::nullopt;
  }
  // The completion's ticket before the bytes are placed (see ReserveCompletion); a
  // WRITE_WITH_IMM's after its write, which can fail and then completes nothing.
  uint64_t ticket = 0;
  bool reserved = !write_with_imm && ReserveCompletion(cq, cq_depth, cq_id, &ticket);
  Completion c = ArrivalOf(wr, recv.wr_id, dst_qpn, length);
  CompletionStatus sender_status = CompletionStatus::kSuccess;
  if (write_with_imm) {
    if (RdmaWrite(peer, dst, wr) != CompletionStatus::kSuccess)
      return CompletionStatus::kRemoteAccessError;
    reserved = ReserveCompletion(cq, cq_depth, cq_id, &ticket);
  } else {
    sender_status = PlaceSend(peer, dst, wr, recv, length, &c);
  }
  if (reserved) {
    PublishCompletion(cq, cq_depth, ticket, c, 0);
  } else {
    dst.dropped.fetch_add(1, std::memory_order_relaxed);  // receiver's CQ overran
  }
  *byte_len = static_cast<uint32_t>(length);
  return sender_status;
}

bool ShmQp::FindRings(Peer& peer, const QpEntry& dst, Receiver* out) {
  out->ring = ValidRing<RecvRing, RecvEntry>(
      peer.segment(),
      std::atomic_ref<const uint64_t>(dst.recv_ring_offset).load(std::memory_order_relaxed),
      &out->ring_depth);
  out->cq = ValidRing<CqRing, CqEntry>(
      peer.segment(),
      std::atomic_ref<const uint64_t>(dst.recv_cq_offset).load(std::memory_order_relaxed),
      &out->cq_depth);
  out->cq_id = dst.recv_cq_id.load(std::memory_order_acquire);
  return out->ring != nullptr && out->cq != nullptr;
}

Completion ShmQp::ArrivalOf(const SendWr& wr, uint64_t wr_id, uint32_t dst_qpn,
                            uint64_t length) const {
  Completion c;
  c.wr_id = wr_id;
  c.qp_num = dst_qpn;
  c.src_qp = number();
  c.has_imm = wr.opcode == Opcode::kSendWithImm || wr.opcode == Opcode::kWriteWithImm;
  c.imm_data = wr.imm_data;
  c.opcode = c.has_imm ? CompletionOpcode::kRecvWithImm : CompletionOpcode::kRecv;
  c.byte_len = static_cast<uint32_t>(length) + (config_.type == QpType::kUd ? kGrhBytes : 0);
  return c;
}

CompletionStatus ShmQp::PlaceSend(Peer& peer, QpEntry& dst, const SendWr& wr, const RecvEntry& recv,
                                  uint64_t length, Completion* c) {
  const bool reliable = config_.type == QpType::kRc;
  const uint32_t grh = config_.type == QpType::kUd ? kGrhBytes : 0;
  // An empty message needs no buffer (a receive with no SGE takes it).
  if (length + grh == 0) return CompletionStatus::kSuccess;
  uint8_t* buffer = recv.length < length + grh
                        ? nullptr
                        : peer.Resolve(recv.lkey, recv.addr, length + grh, kLocalWrite, dst.pd);
  if (buffer == nullptr) {
    c->status = recv.length < length + grh ? CompletionStatus::kLocalLengthError
                                           : CompletionStatus::kLocalProtectionError;
    dst.state.store(static_cast<uint8_t>(QpState::kError), std::memory_order_release);
    return reliable ? CompletionStatus::kRemoteInvalidRequest : CompletionStatus::kSuccess;
  }
  if (grh != 0) std::memcpy(buffer, grh_image_, sizeof(grh_image_));
  buffer += grh;
  for (uint32_t i = 0; i < wr.num_sge; ++i) {
    OrderedCopy(buffer, reinterpret_cast<const uint8_t*>(wr.sg_list[i].addr), wr.sg_list[i].length);
    buffer += wr.sg_list[i].length;
  }
  return CompletionStatus::kSuccess;
}

bool ShmQp::StartsUdRun(const SendWr& wr) const {
  if (!ud_runs_) return false;
  if (wr.opcode != Opcode::kSend && wr.opcode != Opcode::kSendWithImm) return false;
  if ((wr.flags & kInline) != 0) return true;
  // A bad local buffer is the sender's own error (Execute): such a WR goes alone.
  for (uint32_t i = 0; i < wr.num_sge; ++i) {
    if (LocalBuffer(wr.sg_list[i], 0) == nullptr) return false;
  }
  return true;
}

bool ShmQp::SameUdReceiver(const SendWr& a, const SendWr& b) {
  return a.ah == b.ah && a.remote_qpn == b.remote_qpn && a.remote_qkey == b.remote_qkey;
}

void ShmQp::RunUdBatch(SendWr* const* batch, uint32_t n, uint64_t first_sequence) {
  // The runs: run r is batch[begin[r], begin[r + 1]).
  uint32_t begin[kMaxUdBatch + 1];
  uint32_t runs = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (runs == 0 || !SameUdReceiver(*batch[begin[runs - 1]], *batch[i])) begin[runs++] = i;
  }
  begin[runs] = n;
  UdClaim claims[kMaxUdBatch];
  uint64_t lengths[kMaxUdBatch];
  RecvEntry recvs[kMaxUdBatch];
  // Every run's receiver first (loads only: their misses overlap) ...
  uint32_t located = 0;
  if (!IsError(state())) {
    while (located < runs &&
           LocateUdRun(batch + begin[located], begin[located + 1] - begin[located],
                       lengths + begin[located], &claims[located])) {
      ++located;
    }
  }
  // ... then the claims, in post order, up to and including the first run that got less than
  // all of its WRs: what follows it goes after its remainder (below), as one by one would. And
  // up to and including the first run whose receives lie in a region not mapped here yet:
  // placing it opens and maps the receiver's file, which may wait, and a later run's
  // completions, reserved and not yet published, would wait with it and hide every other
  // sender's behind them in their CQs (one receiver's memory must hold up no other receiver).
  uint32_t claimed = 0;
  while (claimed < located) {
    const uint32_t b = begin[claimed];
    UdClaim& claim = claims[claimed];
    ClaimUdRun(batch[b]->remote_qpn, lengths + b, recvs + b, &claim);
    ++claimed;
    if (claim.taken < begin[claimed] - b) break;
    if (claimed < located && !ReceivesMapped(claim, recvs + b)) break;
  }
  // ... then the bytes and completions of everything claimed.
  for (uint32_t r = 0; r < claimed; ++r) {
    PlaceUdRun(batch + begin[r], lengths + begin[r], recvs + begin[r], claims[r]);
  }
  // The sender's completions, in post order (UD SENDs complete successfully whatever became of
  // them at the receiver); a partly claimed run's rest one by one; the runs after it each as a
  // batch of its own.
  for (uint32_t r = 0; r < runs; ++r) {
    const uint32_t b = begin[r], e = begin[r + 1];
    if (r >= claimed) {
      if (runs == 1) {
        for (uint32_t i = b; i < e; ++i) Run(*batch[i], first_sequence + i);
      } else {
        RunUdBatch(batch + b, e - b, first_sequence + b);
      }
      continue;
    }
    const uint32_t done = b + claims[r].taken;
    for (uint32_t i = b; i < done; ++i) {
      Finish(*batch[i], CompletionStatus::kSuccess, static_cast<uint32_t>(lengths[i]),
             first_sequence + i);
    }
    for (uint32_t i = done; i < e; ++i) Run(*batch[i], first_sequence + i);
  }
}

bool ShmQp::LocateUdRun(SendWr* const* run, uint32_t n, uint64_t* lengths, UdClaim* claim) {
  Peer* peer = PeerFor(*run[0]);
  if (peer == nullptr || peer->header()->alive.load(std::memory_order_acquire) == 0 ||
      device_->CutFrom(*peer)) {
    return false;
  }
  const uint32_t dst_qpn = run[0]->remote_qpn;
  QpEntry& dst = peer->header()->qps[dst_qpn & ((1u << kQpIndexBits) - 1)];
  const auto dst_state = static_cast<QpState>(dst.state.load(std::memory_order_acquire));
  // Anything but a receiver ready for all of them: one by one (Deliver counts each drop).
  if (dst.qp_num.load(std::memory_order_acquire) != dst_qpn || dst_state == QpState::kError ||
      dst_state == QpState::kReset || dst.type != static_cast<uint8_t>(QpType::kUd) ||
      run[0]->remote_qkey != dst.qkey) {
    return false;
  }
  if (!FindRings(*peer, dst, &claim->receiver)) return false;
  uint32_t fit = 0;
  for (; fit < n; ++fit) {
    lengths[fit] = TotalLength(*run[fit]);
    if (lengths[fit] > peer->header()->mtu) break;  // dropped, by Deliver
  }
  if (fit == 0) return false;
  claim->peer = peer;
  claim->dst = &dst;
  claim->fit = fit;
  return true;
}

void ShmQp::ClaimUdRun(uint32_t dst_qpn, const uint64_t* lengths, RecvEntry* recvs,
                       UdClaim* claim) {
  uint64_t min_lengths[kMaxUdBatch];
  for (uint32_t i = 0; i < claim->fit; ++i) min_lengths[i] = lengths[i] + kGrhBytes;
  const Receiver& r = claim->receiver;
  Pop stop = Pop::kTaken;
  claim->taken = PopReceives(r.ring, r.ring_depth, dst_qpn, min_lengths, claim->fit, recvs, &stop);
  claim->reserved = claim->taken == 0 ? 0
                                      : ReserveCompletions(r.cq, r.cq_depth, r.cq_id, claim->taken,
                                                           &claim->ticket);
}

bool ShmQp::ReceivesMapped(const UdClaim& claim, const RecvEntry* recvs) {
  // A receiver posts its receives from one region or a few: one look per key change.
  for (uint32_t i = 0; i < claim.taken; ++i) {
    if ((i == 0 || recvs[i].lkey != recvs[i - 1].lkey) && !claim.peer->Mapped(recvs[i].lkey)) {
      return false;
    }
  }
  return true;
}

void ShmQp::PlaceUdRun(SendWr* const* run, const uint64_t* lengths, const RecvEntry* recvs,
                       const UdClaim& claim) {
  QpEntry& dst = *claim.dst;
  const uint32_t dst_qpn = run[0]->remote_qpn;
  // A receiver that went to ERR since its receives were claimed (a buffer not its own, found by
  // an earlier run of this batch or by another sender): its claimed receives flush.
  bool receiver_failed =
      static_cast<QpState>(dst.state.load(std::memory_order_acquire)) == QpState::kError;
  for (uint32_t i = 0; i < claim.taken; ++i) {
    Completion c = ArrivalOf(*run[i], recvs[i].wr_id, dst_qpn, lengths[i]);
    if (receiver_failed) {
      // A receive of a QP that went to ERR flushes, as on a NIC; one by one, the messages after
      // would have found the QP in ERR and been dropped.
      c.status = CompletionStatus::kFlushed;
      dst.dropped.fetch_add(1, std::memory_order_relaxed);
    } else {
      PlaceSend(*claim.peer, dst, *run[i], recvs[i], lengths[i], &c);
      receiver_failed = c.status != CompletionStatus::kSuccess;
    }
    if (i < claim.reserved) {
      PublishCompletion(claim.receiver.cq, claim.receiver.cq_depth, claim.ticket + i, c, 0);
    } else {
      dst.dropped.fetch_add(1, std::memory_order_relaxed);  // receiver's CQ overran
    }
  }
}

CompletionStatus ShmQp::RdmaRead(Peer& peer, const QpEntry& responder, const SendWr& wr,
                                 uint32_t* byte_len) {
  const uint64_t length = TotalLength(wr);
  const uint8_t* src = peer.Resolve(wr.rkey, wr.remote_addr, length, kRemoteRead, responder.pd);
  if (src == nullptr) return CompletionStatus::kRemoteAccessError;
  const uint32_t pause_us = device_->faults().slow_read_us;
  // Slow READs: a pause after every chunk of this many bytes, whole lines, so a pause never
  // splits a line's copy (StableLineCopy).
  const uint64_t chunk = pause_us == 0
                             ? UINT64_MAX
                             : std::max<uint64_t>((length + kSlowReadChunks * kLineBytes - 1) /
                                                      (kSlowReadChunks * kLineBytes) * kLineBytes,
                                                  kLineBytes);
  uint64_t since_pause = 0;
  for (uint32_t i = 0; i < wr.num_sge; ++i) {
    uint8_t* dst = LocalBuffer(wr.sg_list[i], kLocalWrite);
    if (dst == nullptr) return CompletionStatus::kLocalProtectionError;
    for (uint64_t done = 0; done < wr.sg_list[i].length;) {
      // Up to the end of the source's current line.
      const uint64_t to_line_end = kLineBytes - reinterpret_cast<uintptr_t>(src) % kLineBytes;
      const uint64_t n = std::min<uint64_t>(wr.sg_list[i].length - done, to_line_end);
      StableLineCopy(dst + done, src, n);
      src += n;
      done += n;
      since_pause += n;
      if (since_pause >= chunk && n == to_line_end) {
        since_pause = 0;
        std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      }
    }
  }
  *byte_len = static_cast<uint32_t>(length);
  return CompletionStatus::kSuccess;
}

CompletionStatus ShmQp::Atomic(Peer& peer, const QpEntry& responder, const SendWr& wr) {
  if (wr.num_sge != 1 || wr.sg_list[0].length != kAtomicBytes) {
    return CompletionStatus::kLocalLengthError;
  }
  if (wr.remote_addr % kAtomicBytes != 0) return CompletionStatus::kRemoteInvalidRequest;
  uint8_t* target =
      peer.Resolve(wr.rkey, wr.remote_addr, kAtomicBytes, kRemoteAtomic, responder.pd);
  if (target == nullptr) return CompletionStatus::kRemoteAccessError;
  uint8_t* result = LocalBuffer(wr.sg_list[0], kLocalWrite);
  if (result == nullptr) return CompletionStatus::kLocalProtectionError;
  std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(target));
  uint64_t original;
  if (wr.opcode == Opcode::kFetchAdd) {
    original = word.fetch_add(wr.compare_add, std::memory_order_acq_rel);
  } else {
    original = wr.compare_add;
    word.compare_exchange_strong(original, wr.swap, std::memory_order_acq_rel);
  }
  std::memcpy(result, &original, kAtomicBytes);
  return CompletionStatus::kSuccess;
}

}  // namespace transport::shm
