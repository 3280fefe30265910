#include "transport/fabric.h"

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "transport/shm/shm_internal.h"
#include "transport/verbs/verbs_internal.h"

namespace transport {

absl::StatusOr<std::unique_ptr<Device>> OpenDevice(const DeviceOptions& options) {
  if (options.name == "shm") {
    absl::StatusOr<std::unique_ptr<shm::ShmDevice>> device = shm::ShmDevice::Open(options);
    if (!device.ok()) return device.status();
    return std::unique_ptr<Device>(std::move(*device));
  }
  absl::StatusOr<std::unique_ptr<verbs::VerbsDevice>> device = verbs::VerbsDevice::Open(options);
  if (!device.ok()) return device.status();
  return std::unique_ptr<Device>(std::move(*device));
}

absl::StatusOr<DeviceResources> OpenDeviceResources(const DeviceOptions& options,
                                                    uint32_t cq_depth) {
  DeviceResources opened;
  absl::StatusOr<std::unique_ptr<Device>> device = OpenDevice(options);
  if (!device.ok()) return device.status();
  opened.device = *std::move(device);
  absl::StatusOr<std::unique_ptr<ProtectionDomain>> pd = opened.device->AllocatePd();
  if (!pd.ok()) return pd.status();
  opened.pd = *std::move(pd);
  absl::StatusOr<std::unique_ptr<CompletionQueue>> cq = opened.device->CreateCq(cq_depth);
  if (!cq.ok()) return cq.status();
  opened.cq = *std::move(cq);
  return opened;
}

ChildLinks::~ChildLinks() {
  for (int i = 0; i < linked_; ++i) counts_[i]->fetch_sub(1, std::memory_order_acq_rel);
}

void ChildLinks::Link(std::atomic<uint32_t>* live_count) {
  CHECK_LT(linked_, kMaxParents);
  live_count->fetch_add(1, std::memory_order_acq_rel);
  counts_[linked_++] = live_count;
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> ProtectionDomain::RegisterMemory(void* addr,
                                                                               size_t length,
                                                                               uint32_t access) {
  absl::StatusOr<std::unique_ptr<MemoryRegion>> mr = DoRegisterMemory(addr, length, access);
  if (mr.ok()) (*mr)->parents_.Link(&live_mrs_);
  return mr;
}

absl::StatusOr<std::unique_ptr<QueuePair>> ProtectionDomain::CreateQp(const QpConfig& config) {
  absl::StatusOr<std::unique_ptr<QueuePair>> qp = DoCreateQp(config);
  if (!qp.ok()) return qp;
  QueuePair& created = **qp;
  created.parents_.Link(&live_qps_);
  created.parents_.Link(&created.config().send_cq->live_qps_);
  created.parents_.Link(&created.config().recv_cq->live_qps_);
  return qp;
}

absl::StatusOr<std::unique_ptr<AddressHandle>> ProtectionDomain::CreateAddressHandle(
    const AddressInfo& info) {
  absl::StatusOr<std::unique_ptr<AddressHandle>> ah = DoCreateAddressHandle(info);
  if (ah.ok()) (*ah)->parents_.Link(&live_ahs_);
  return ah;
}

ProtectionDomain::~ProtectionDomain() { CheckNoChildren(); }

void ProtectionDomain::CheckNoChildren() const {
  const uint32_t mrs = live_mrs_.load(std::memory_order_acquire);
  const uint32_t qps = live_qps_.load(std::memory_order_acquire);
  const uint32_t ahs = live_ahs_.load(std::memory_order_acquire);
  CHECK(mrs == 0 && qps == 0 && ahs == 0)
      << "ProtectionDomain destroyed while " << mrs << " MR(s), " << qps << " QP(s) and " << ahs
      << " AH(s) of it are still alive: destroy them first (fabric.h, ownership)";
}

absl::StatusOr<std::unique_ptr<ProtectionDomain>> Device::AllocatePd() {
  absl::StatusOr<std::unique_ptr<ProtectionDomain>> pd = DoAllocatePd();
  if (pd.ok()) (*pd)->parents_.Link(&live_pds_);
  return pd;
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> Device::CreateCq(uint32_t depth) {
  absl::StatusOr<std::unique_ptr<CompletionQueue>> cq = DoCreateCq(depth);
  if (cq.ok()) (*cq)->parents_.Link(&live_cqs_);
  return cq;
}

// name() is pure virtual: not callable once the backend's destructor has run.
Device::~Device() { CheckNoChildren("(its backend already destroyed)"); }

void Device::CheckNoChildren() const { CheckNoChildren(name()); }

void Device::CheckNoChildren(const std::string& name) const {
  const uint32_t pds = live_pds_.load(std::memory_order_acquire);
  const uint32_t cqs = live_cqs_.load(std::memory_order_acquire);
  CHECK(pds == 0 && cqs == 0) << "Device " << name << " destroyed while " << pds << " PD(s) and "
                              << cqs
                              << " CQ(s) of it are still alive: destroy them first (fabric.h, "
                                 "ownership)";
}

void CompletionQueue::CheckNoLiveQps() const {
  const uint32_t qps = live_qps();
  CHECK_EQ(qps, 0u) << "CompletionQueue destroyed while " << qps
                    << " QP(s) still use it: destroy them first (fabric.h, ownership)";
}

QueuePair::~QueuePair() { LeaveCounterRegistry(); }  // the backend's destructor did, normally

void QueuePair::LeaveCounterRegistry() {
  if (registry_ == nullptr) return;
  registry_->Retire(this);
  registry_ = nullptr;
}

CompletionQueue::~CompletionQueue() {
  CheckNoLiveQps();
  LeaveCounterRegistry();
}

void CompletionQueue::LeaveCounterRegistry() {
  if (registry_ == nullptr) return;
  registry_->Retire(this);
  registry_ = nullptr;
}

void CounterRegistry::Register(QueuePair* qp) {
  util::MutexLock lock(&mutex_);
  qp->registry_ = this;
  qps_.push_back(qp);
}

void CounterRegistry::Register(CompletionQueue* cq) {
  util::MutexLock lock(&mutex_);
  cq->registry_ = this;
  cqs_.push_back(cq);
}

void CounterRegistry::Retire(const QueuePair* qp) {
  util::MutexLock lock(&mutex_);
  retired_.Add(qp->counters());
  std::erase(qps_, qp);
}

void CounterRegistry::Retire(const CompletionQueue* cq) {
  util::MutexLock lock(&mutex_);
  retired_.Add(cq->counters());
  std::erase(cqs_, cq);
}

CounterSnapshot CounterRegistry::Snapshot() const {
  util::MutexLock lock(&mutex_);
  CounterSnapshot total = retired_;
  for (const QueuePair* qp : qps_) total.Add(qp->counters());
  for (const CompletionQueue* cq : cqs_) total.Add(cq->counters());
  return total;
}

absl::Status QueuePair::ValidateSend(const SendWr& wr) const {
  if (wr.num_sge > config_.max_send_sge) {
    return absl::InvalidArgumentError(
        absl::StrFormat("WR has %d SGEs, the QP allows %d", wr.num_sge, config_.max_send_sge));
  }
  if ((wr.flags & kInline) != 0) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < wr.num_sge; ++i) total += wr.sg_list[i].length;
    if (total > config_.max_inline_data) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "inline WR of %d bytes exceeds max_inline_data %d", total, config_.max_inline_data));
    }
  }
  if (config_.type == QpType::kUd) {
    if (wr.opcode != Opcode::kSend && wr.opcode != Opcode::kSendWithImm) {
      return absl::InvalidArgumentError(
          absl::StrFormat("UD QPs only SEND; %s is not allowed", ToString(wr.opcode)));
    }
    if (wr.ah == nullptr) return absl::InvalidArgumentError("UD send without an address handle");
  }
  return absl::OkStatus();
}

std::vector<std::string> ListDevices() {
  std::vector<std::string> names = {"shm"};
  for (std::string& name : verbs::DeviceNames()) names.push_back(std::move(name));
  return names;
}

const char* ToString(QpType type) {
  switch (type) {
    case QpType::kRc:
      return "RC";
    case QpType::kUc:
      return "UC";
    case QpType::kUd:
      return "UD";
  }
  return "?";
}

const char* ToString(QpState state) {
  switch (state) {
    case QpState::kReset:
      return "RESET";
    case QpState::kInit:
      return "INIT";
    case QpState::kRtr:
      return "RTR";
    case QpState::kRts:
      return "RTS";
    case QpState::kError:
      return "ERR";
  }
  return "?";
}

const char* ToString(Opcode opcode) {
  switch (opcode) {
    case Opcode::kSend:
      return "SEND";
    case Opcode::kSendWithImm:
      return "SEND_WITH_IMM";
    case Opcode::kWrite:
      return "RDMA_WRITE";
    case Opcode::kWriteWithImm:
      return "RDMA_WRITE_WITH_IMM";
    case Opcode::kRead:
      return "RDMA_READ";
    case Opcode::kCompareSwap:
      return "CMP_AND_SWP";
    case Opcode::kFetchAdd:
      return "FETCH_AND_ADD";
  }
  return "?";
}

const char* ToString(CompletionStatus status) {
  switch (status) {
    case CompletionStatus::kSuccess:
      return "SUCCESS";
    case CompletionStatus::kLocalLengthError:
      return "LOC_LEN_ERR";
    case CompletionStatus::kLocalProtectionError:
      return "LOC_PROT_ERR";
    case CompletionStatus::kLocalQpOperationError:
      return "LOC_QP_OP_ERR";
    case CompletionStatus::kRemoteAccessError:
      return "REM_ACCESS_ERR";
    case CompletionStatus::kRemoteInvalidRequest:
      return "REM_INV_REQ_ERR";
    case CompletionStatus::kRnrRetryExceeded:
      return "RNR_RETRY_EXC_ERR";
    case CompletionStatus::kRetryExceeded:
      return "RETRY_EXC_ERR";
    case CompletionStatus::kFlushed:
      return "WR_FLUSH_ERR";
    case CompletionStatus::kOtherError:
      return "OTHER_ERR";
  }
  return "?";
}

void CounterSnapshot::Add(const QpCounters& qp) {
  doorbells += qp.doorbells.Get();
  wrs += qp.wrs.Get();
  signaled_wrs += qp.signaled_wrs.Get();
  inline_wrs += qp.inline_wrs.Get();
  bytes += qp.bytes.Get();
  recv_wrs += qp.recv_wrs.Get();
  dropped += qp.dropped.Get();
}

void CounterSnapshot::Add(const CqCounters& cq) {
  polls += cq.polls.Get();
  empty_polls += cq.empty_polls.Get();
  completions += cq.completions.Get();
  cq_overruns += cq.overruns.Get();
}

void CounterSnapshot::Add(const CounterSnapshot& other) {
  doorbells += other.doorbells;
  wrs += other.wrs;
  signaled_wrs += other.signaled_wrs;
  inline_wrs += other.inline_wrs;
  bytes += other.bytes;
  recv_wrs += other.recv_wrs;
  dropped += other.dropped;
  polls += other.polls;
  empty_polls += other.empty_polls;
  completions += other.completions;
  cq_overruns += other.cq_overruns;
}

CounterSnapshot CounterSnapshot::Since(const CounterSnapshot& earlier) const {
  CounterSnapshot d;
  d.doorbells = doorbells - earlier.doorbells;
  d.wrs = wrs - earlier.wrs;
  d.signaled_wrs = signaled_wrs - earlier.signaled_wrs;
  d.inline_wrs = inline_wrs - earlier.inline_wrs;
  d.bytes = bytes - earlier.bytes;
  d.recv_wrs = recv_wrs - earlier.recv_wrs;
  d.dropped = dropped - earlier.dropped;
  d.polls = polls - earlier.polls;
  d.empty_polls = empty_polls - earlier.empty_polls;
  d.completions = completions - earlier.completions;
  d.cq_overruns = cq_overruns - earlier.cq_overruns;
  return d;
}

std::string CounterSnapshot::ToJson() const {
  return absl::StrFormat(
      "{\"doorbells\":%d,\"wrs\":%d,\"signaled_wrs\":%d,\"inline_wrs\":%d,\"bytes\":%d,"
      "\"recv_wrs\":%d,\"dropped\":%d,\"cq_polls\":%d,\"cq_empty_polls\":%d,"
      "\"completions\":%d,\"cq_overruns\":%d}",
      doorbells, wrs, signaled_wrs, inline_wrs, bytes, recv_wrs, dropped, polls, empty_polls,
      completions, cq_overruns);
}

}  // namespace transport
