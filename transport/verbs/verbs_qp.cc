// The libibverbs backend's queue pair: state transitions and the data path.
#include "transport/verbs/verbs_qp.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace transport::verbs {

namespace {

// Posts the first `count` WRs of a pre-linked array (the chain is cut after its last WR for the
// call and joined again) and returns the provider's code; `accepted`: how many it took (a
// failure that names no bad WR took none).
template <typename Wr, typename Post>
int PostPrefix(Wr* wrs, size_t count, Post post, size_t* accepted) {
  Wr* const last = &wrs[count - 1];
  Wr* const after_last = last->next;
  last->next = nullptr;
  Wr* bad = nullptr;
  const int rc = post(wrs, &bad);
  last->next = after_last;
  *accepted = rc == 0          ? count
              : bad == nullptr ? 0
                               : std::min(count, static_cast<size_t>(bad - wrs));
  return rc;
}

// Packet sequence numbers are 24 bits.
constexpr uint32_t kPsnMask = (1u << 24) - 1;
// Partition key index 0 holds the default partition (0xffff) on every port.
constexpr uint16_t kDefaultPkeyIndex = 0;
// RC local ACK timeout, encoded as 4.096 us * 2^value: 14 is about 67 ms, the usual choice for a
// datacentre fabric (short enough to notice a dead peer, long enough for a loaded switch).
constexpr uint8_t kAckTimeoutExponent = 14;
// Outstanding RDMA READs / atomics per RC QP, each direction. 16 is what ConnectX and rxe allow.
constexpr uint8_t kMaxReadsInFlight = 16;

// IB spec table 45: RNR NAK timer codes and the wait each stands for, in microseconds. Code 0 is
// the longest (655.36 ms) and sorts last.
struct RnrCode {
  uint8_t code;
  uint32_t micros;
};
constexpr RnrCode kRnrCodes[] = {
    {1, 10},      {2, 20},      {3, 30},      {4, 40},     {5, 60},     {6, 80},      {7, 120},
    {8, 160},     {9, 240},     {10, 320},    {11, 480},   {12, 640},   {13, 960},    {14, 1280},
    {15, 1920},   {16, 2560},   {17, 3840},   {18, 5120},  {19, 7680},  {20, 10240},  {21, 15360},
    {22, 20480},  {23, 30720},  {24, 40960},  {25, 61440}, {26, 81920}, {27, 122880}, {28, 163840},
    {29, 245760}, {30, 327680}, {31, 491520}, {0, 655360},
};

// The smallest RNR timer code that waits at least `micros`.
uint8_t RnrTimerCode(uint32_t micros) {
  for (const RnrCode& c : kRnrCodes) {
    if (c.micros >= micros) return c.code;
  }
  return 0;
}

ibv_qp_type ToIbv(QpType type) {
  switch (type) {
    case QpType::kRc:
      return IBV_QPT_RC;
    case QpType::kUc:
      return IBV_QPT_UC;
    case QpType::kUd:
      return IBV_QPT_UD;
  }
  return IBV_QPT_RC;
}

ibv_wr_opcode ToIbv(Opcode opcode) {
  switch (opcode) {
    case Opcode::kSend:
      return IBV_WR_SEND;
    case Opcode::kSendWithImm:
      return IBV_WR_SEND_WITH_IMM;
    case Opcode::kWrite:
      return IBV_WR_RDMA_WRITE;
    case Opcode::kWriteWithImm:
      return IBV_WR_RDMA_WRITE_WITH_IMM;
    case Opcode::kRead:
      return IBV_WR_RDMA_READ;
    case Opcode::kCompareSwap:
      return IBV_WR_ATOMIC_CMP_AND_SWP;
    case Opcode::kFetchAdd:
      return IBV_WR_ATOMIC_FETCH_AND_ADD;
  }
  return IBV_WR_SEND;
}

QpState FromIbv(ibv_qp_state state) {
  switch (state) {
    case IBV_QPS_RESET:
      return QpState::kReset;
    case IBV_QPS_INIT:
      return QpState::kInit;
    case IBV_QPS_RTR:
      return QpState::kRtr;
    case IBV_QPS_RTS:
      return QpState::kRts;
    default:  // SQD, SQE, ERR and unknown states cannot carry traffic
      return QpState::kError;
  }
}

absl::Status ModifyError(const char* transition, int rc) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "ibv_modify_qp to %s failed: %s (on RoCE check --gid_index and that the peer's GID is "
      "reachable; on InfiniBand check the port is ACTIVE and the LID)",
      transition, std::strerror(rc)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<VerbsQp>> VerbsQp::Create(VerbsDevice* device, ibv_pd* pd,
                                                         const QpConfig& config) {
  auto* send_cq = dynamic_cast<VerbsCq*>(config.send_cq);
  auto* recv_cq = dynamic_cast<VerbsCq*>(config.recv_cq);
  if (send_cq == nullptr || recv_cq == nullptr || send_cq->device() != device ||
      recv_cq->device() != device) {
    return absl::InvalidArgumentError("a QP needs a send and a receive CQ of the same device");
  }
  if (config.max_send_wr == 0 || config.max_recv_wr == 0 || config.max_send_sge == 0 ||
      config.max_recv_sge == 0) {
    return absl::InvalidArgumentError("max_send_wr, max_recv_wr and the SGE counts must be > 0");
  }
  std::unique_ptr<VerbsQp> qp(new VerbsQp(device, config));
  ibv_qp_init_attr init{};
  init.send_cq = send_cq->cq();
  init.recv_cq = recv_cq->cq();
  init.qp_type = ToIbv(config.type);
  init.sq_sig_all = 0;  // selective signalling: the SendWr flags decide
  init.cap.max_send_wr = config.max_send_wr;
  init.cap.max_recv_wr = config.max_recv_wr;
  init.cap.max_send_sge = config.max_send_sge;
  init.cap.max_recv_sge = config.max_recv_sge;
  init.cap.max_inline_data = config.max_inline_data;
  qp->qp_ = ibv_create_qp(pd, &init);
  if (qp->qp_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "ibv_create_qp(%s, send %d x %d SGE, recv %d x %d SGE, inline %d) on %s: %s",
        ToString(config.type), config.max_send_wr, config.max_send_sge, config.max_recv_wr,
        config.max_recv_sge, config.max_inline_data, device->name(), std::strerror(errno)));
  }
  qp->send_wrs_.reset(new ibv_send_wr[config.max_send_wr]());
  qp->send_sges_.reset(new ibv_sge[size_t{config.max_send_wr} * config.max_send_sge]());
  qp->recv_wrs_.reset(new ibv_recv_wr[config.max_recv_wr]());
  qp->recv_sges_.reset(new ibv_sge[size_t{config.max_recv_wr} * config.max_recv_sge]());
  // Pre-linked, as eRPC keeps its WRs: each WR points at the next and at its own SGEs once and
  // for all, so a post writes only the fields that change (a chain is cut after its last WR for
  // the post and joined again after it).
  for (uint32_t i = 0; i < config.max_send_wr; ++i) {
    qp->send_wrs_[i].next = i + 1 < config.max_send_wr ? &qp->send_wrs_[i + 1] : nullptr;
    qp->send_wrs_[i].sg_list = &qp->send_sges_[size_t{i} * config.max_send_sge];
  }
  for (uint32_t i = 0; i < config.max_recv_wr; ++i) {
    qp->recv_wrs_[i].next = i + 1 < config.max_recv_wr ? &qp->recv_wrs_[i + 1] : nullptr;
    qp->recv_wrs_[i].sg_list = &qp->recv_sges_[size_t{i} * config.max_recv_sge];
  }
  qp->signaled_ring_.reset(new uint64_t[config.max_send_wr]);
  std::random_device entropy;
  qp->psn_ = entropy() & kPsnMask;
  if (absl::Status s = device->AddQp(qp.get()); !s.ok()) return s;
  return qp;
}

VerbsQp::~VerbsQp() {
  LeaveCounterRegistry();
  if (qp_ == nullptr) return;
  device_->RemoveQp(qp_->qp_num);
  // A poll of our send CQ on another thread may have found us just before the removal.
  static_cast<VerbsCq*>(config_.send_cq)->WaitForPollers();
  if (const int rc = ibv_destroy_qp(qp_); rc != 0) {
    LOG(ERROR) << "ibv_destroy_qp: " << std::strerror(rc);
  }
}

QpEndpoint VerbsQp::endpoint() const {
  QpEndpoint endpoint;
  endpoint.qp_num = qp_->qp_num;
  endpoint.lid = device_->port().lid;
  endpoint.gid = device_->port().gid;
  endpoint.psn = psn_;
  return endpoint;
}

QpState VerbsQp::state() const {
  // Ask the provider (control-path cost): it moves a QP to ERR on its own after an error.
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp_, &attr, IBV_QP_STATE, &init) != 0) return state_.load();
  return FromIbv(attr.qp_state);
}

void VerbsQp::SetError() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (const int rc = ibv_modify_qp(qp_, &attr, IBV_QP_STATE); rc != 0) {
    LOG(ERROR) << "ibv_modify_qp(ERR): " << std::strerror(rc);
  }
  state_ = QpState::kError;
}

absl::Status VerbsQp::Connect(const ConnectConfig& config) {
  if (state_.load() != QpState::kReset) {
    return absl::FailedPreconditionError(
        absl::StrFormat("Connect needs a QP in RESET, this one is %s", ToString(state_.load())));
  }
  if (absl::Status s = ModifyToInit(config); !s.ok()) return s;
  state_ = QpState::kInit;
  if (absl::Status s = ModifyToRtr(config); !s.ok()) return s;
  state_ = QpState::kRtr;
  if (absl::Status s = ModifyToRts(config); !s.ok()) return s;
  state_ = QpState::kRts;
  return absl::OkStatus();
}

absl::Status VerbsQp::ModifyToInit(const ConnectConfig& config) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = kDefaultPkeyIndex;
  attr.port_num = device_->port_num();
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (config_.type == QpType::kUd) {
    attr.qkey = config.qkey;
    mask |= IBV_QP_QKEY;
  } else {
    // The QP grants what its type can serve; each region's own access flags still apply.
    attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (config_.type == QpType::kRc) {
      attr.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    }
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  if (const int rc = ibv_modify_qp(qp_, &attr, mask); rc != 0) return ModifyError("INIT", rc);
  return absl::OkStatus();
}

absl::Status VerbsQp::ModifyToRtr(const ConnectConfig& config) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  int mask = IBV_QP_STATE;
  if (config_.type != QpType::kUd) {
    attr.path_mtu = device_->path_mtu();
    attr.dest_qp_num = config.remote.qp_num;
    attr.rq_psn = config.remote.psn & kPsnMask;
    attr.ah_attr = AddressVector(*device_, config.remote.lid, config.remote.gid);
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (config_.type == QpType::kRc) {
      attr.max_dest_rd_atomic = kMaxReadsInFlight;
      attr.min_rnr_timer = RnrTimerCode(config.min_rnr_timer_us);
      mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
  }
  if (const int rc = ibv_modify_qp(qp_, &attr, mask); rc != 0) return ModifyError("RTR", rc);
  return absl::OkStatus();
}

absl::Status VerbsQp::ModifyToRts(const ConnectConfig& config) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = psn_;
  int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (config_.type == QpType::kRc) {
    attr.timeout = kAckTimeoutExponent;
    attr.retry_cnt = config.retry_count;
    attr.rnr_retry = config.rnr_retry;
    attr.max_rd_atomic = kMaxReadsInFlight;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  if (const int rc = ibv_modify_qp(qp_, &attr, mask); rc != 0) return ModifyError("RTS", rc);
  return absl::OkStatus();
}

void VerbsQp::Translate(const SendWr& wr, ibv_send_wr* out) const {
  ibv_sge* sges = out->sg_list;  // its own, linked at creation
  for (uint32_t i = 0; i < wr.num_sge; ++i) {
    sges[i].addr = wr.sg_list[i].addr;
    sges[i].length = wr.sg_list[i].length;
    sges[i].lkey = wr.sg_list[i].lkey;
  }
  out->wr_id = wr.wr_id;
  out->num_sge = static_cast<int>(wr.num_sge);
  out->opcode = ToIbv(wr.opcode);
  unsigned int flags = 0;
  if (wr.flags & kSignaled) flags |= IBV_SEND_SIGNALED;
  if (wr.flags & kInline) flags |= IBV_SEND_INLINE;
  out->send_flags = flags;
  out->imm_data = htonl(wr.imm_data);  // the wire carries it big-endian; we hand out host order
  switch (wr.opcode) {
    case Opcode::kWrite:
    case Opcode::kWriteWithImm:
    case Opcode::kRead:
      out->wr.rdma.remote_addr = wr.remote_addr;
      out->wr.rdma.rkey = wr.rkey;
      break;
    case Opcode::kCompareSwap:
    case Opcode::kFetchAdd:
      out->wr.atomic.remote_addr = wr.remote_addr;
      out->wr.atomic.rkey = wr.rkey;
      out->wr.atomic.compare_add = wr.compare_add;
      out->wr.atomic.swap = wr.swap;
      break;
    case Opcode::kSend:
    case Opcode::kSendWithImm:
      if (config_.type == QpType::kUd) {
        // Address handles of this backend are VerbsAh (CreateAddressHandle makes no other).
        out->wr.ud.ah = static_cast<const VerbsAh*>(wr.ah)->ah();
        out->wr.ud.remote_qpn = wr.remote_qpn;
        out->wr.ud.remote_qkey = wr.remote_qkey;
      }
      break;
  }
}

absl::Status VerbsQp::PostSend(SendWr* chain, SendWr** bad) {
  const QpState state = state_.load(std::memory_order_relaxed);
  if (state == QpState::kReset || state == QpState::kInit) {
    *bad = chain;
    return absl::FailedPreconditionError(
        absl::StrFormat("PostSend on a QP in %s", ToString(state)));
  }
  const uint64_t posted = posted_.load(std::memory_order_relaxed);
  const uint64_t free_slots =
      config_.max_send_wr - (posted - retired_.load(std::memory_order_acquire));
  size_t count = 0;
  absl::Status refused;
  SendWr* wr = chain;
  for (; wr != nullptr; wr = wr->next, ++count) {
    if (count == free_slots) {
      refused = absl::ResourceExhaustedError(absl::StrFormat(
          "send queue full (%d WRs outstanding): signal a WR and poll its completion",
          config_.max_send_wr));
      break;
    }
    if (refused = ValidateSend(*wr); !refused.ok()) break;
    Translate(*wr, &send_wrs_[count]);
  }
  if (absl::Status rang = Ring(chain, count, bad); !rang.ok()) return rang;
  if (!refused.ok()) *bad = wr;
  return refused;
}

absl::Status VerbsQp::Ring(SendWr* chain, size_t count, SendWr** bad) {
  if (count == 0) return absl::OkStatus();
  size_t accepted = 0;
  const int rc = PostPrefix(
      send_wrs_.get(), count,
      [this](ibv_send_wr* wrs, ibv_send_wr** bad) { return ibv_post_send(qp_, wrs, bad); },
      &accepted);
  // Account for what the provider took, in post order.
  uint64_t sequence = posted_.load(std::memory_order_relaxed);
  uint64_t tail = ring_tail_.load(std::memory_order_relaxed);
  SendWr* wr = chain;
  for (size_t i = 0; i < accepted; ++i, wr = wr->next) {
    ++sequence;
    uint64_t bytes = 0;
    for (uint32_t s = 0; s < wr->num_sge; ++s) bytes += wr->sg_list[s].length;
    counters_.wrs.Add();
    counters_.bytes.Add(bytes);
    if (wr->flags & kInline) counters_.inline_wrs.Add();
    if (wr->flags & kSignaled) {
      counters_.signaled_wrs.Add();
      signaled_ring_[tail++ % config_.max_send_wr] = sequence;
    }
  }
  if (accepted > 0) counters_.doorbells.Add();
  posted_.store(sequence, std::memory_order_relaxed);
  ring_tail_.store(tail, std::memory_order_release);
  if (rc == 0) return absl::OkStatus();
  *bad = wr;
  const std::string message =
      absl::StrFormat("ibv_post_send on %s QP %d: %s (WR %d of the chain)", ToString(config_.type),
                      qp_->qp_num, std::strerror(rc), accepted);
  if (rc == ENOMEM) return absl::ResourceExhaustedError(message);
  if (rc == EINVAL) return absl::InvalidArgumentError(message);
  return absl::InternalError(message);
}

void VerbsQp::OnSendCompletion(bool success) {
  uint64_t head = ring_head_.load(std::memory_order_relaxed);
  const uint64_t tail = ring_tail_.load(std::memory_order_acquire);
  if (success) {
    if (head == tail) return;  // not ours to account (cannot happen for signalled WRs)
    retired_.store(signaled_ring_[head % config_.max_send_wr], std::memory_order_release);
    ring_head_.store(head + 1, std::memory_order_release);
    return;
  }
  // An error completion: the provider flushes every outstanding WR, so all slots come back.
  state_ = QpState::kError;
  ring_head_.store(tail, std::memory_order_release);
  retired_.store(posted_.load(std::memory_order_acquire), std::memory_order_release);
}

absl::Status VerbsQp::PostRecv(RecvWr* chain, RecvWr** bad) {
  if (state_.load(std::memory_order_relaxed) == QpState::kReset) {
    *bad = chain;
    return absl::FailedPreconditionError("PostRecv on a QP in RESET");
  }
  size_t count = 0;
  for (RecvWr* wr = chain; wr != nullptr; wr = wr->next, ++count) {
    if (count == config_.max_recv_wr || wr->num_sge > config_.max_recv_sge) {
      // Post nothing: a receive chain is control-path sized, so refuse it whole.
      *bad = chain;
      return absl::InvalidArgumentError(
          absl::StrFormat("receive chain longer than max_recv_wr %d or WR with more than %d SGEs",
                          config_.max_recv_wr, config_.max_recv_sge));
    }
    ibv_recv_wr* out = &recv_wrs_[count];
    ibv_sge* sges = out->sg_list;  // its own, linked at creation
    for (uint32_t i = 0; i < wr->num_sge; ++i) {
      sges[i] = ibv_sge{wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
    }
    out->wr_id = wr->wr_id;
    out->num_sge = static_cast<int>(wr->num_sge);
  }
  if (count == 0) return absl::OkStatus();
  size_t accepted = 0;
  const int rc = PostPrefix(
      recv_wrs_.get(), count,
      [this](ibv_recv_wr* wrs, ibv_recv_wr** bad) { return ibv_post_recv(qp_, wrs, bad); },
      &accepted);
  counters_.recv_wrs.Add(accepted);
  if (rc == 0) return absl::OkStatus();
  RecvWr* wr = chain;
  for (size_t i = 0; i < accepted; ++i) wr = wr->next;
  *bad = wr;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "ibv_post_recv: %s (receive queue of %d full?)", std::strerror(rc), config_.max_recv_wr));
}

}  // namespace transport::verbs
