// The libibverbs backend's control path: opening a device (with errors that list what exists),
// PDs, memory regions, CQs and address handles, and the completion poller.
#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "transport/verbs/verbs_internal.h"
#include "transport/verbs/verbs_qp.h"

namespace transport::verbs {
namespace {

// Hop limit of the GRH on RoCE v2: enough for any datacentre's routed fabric.
constexpr uint8_t kGrhHopLimit = 64;
// Work completions read per ibv_poll_cq call (on the stack: the poller allocates nothing).
constexpr int kPollBatch = 64;
// QP-table key values: 0 is never a user QP number (QP0 is the subnet manager's), and QP
// numbers are 24 bits, so all-ones marks a removed entry.
constexpr uint32_t kEmptyKey = 0;
constexpr uint32_t kRemovedKey = 0xffffffffu;

std::string GidString(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
  return text;
}

const char* GidTypeName(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB:
      return "IB";
    case IBV_GID_TYPE_ROCE_V1:
      return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2:
      return "RoCE v2";
  }
  return "?";
}

bool IsIpv4Mapped(const ibv_gid& gid) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, kPrefix, sizeof(kPrefix)) == 0;
}

// The type of one GID entry, from sysfs: ibv_query_gid_ex crashes inside libibverbs 44 on the
// Debian 12 kernel (seen under rxe), and sysfs is what the kernel itself publishes.
uint32_t GidType(ibv_context* context, uint8_t port, int index, bool ethernet) {
  if (!ethernet) return IBV_GID_TYPE_IB;
  const std::string path =
      absl::StrFormat("%s/ports/%d/gid_attrs/types/%d", context->device->ibdev_path, port, index);
  std::ifstream file(path);
  std::string type;
  std::getline(file, type);
  return type == "RoCE v2" ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
}

// The populated GID entries of a port (empty slots are skipped).
std::vector<ibv_gid_entry> PortGids(ibv_context* context, uint8_t port, int table_length,
                                    bool ethernet) {
  std::vector<ibv_gid_entry> gids;
  for (int i = 0; i < table_length; ++i) {
    ibv_gid_entry entry{};
    if (ibv_query_gid(context, port, i, &entry.gid) != 0) continue;
    ibv_gid zero{};
    if (std::memcmp(entry.gid.raw, zero.raw, sizeof(zero.raw)) == 0) continue;
    entry.gid_index = static_cast<uint32_t>(i);
    entry.port_num = port;
    entry.gid_type = GidType(context, port, i, ethernet);
    gids.push_back(entry);
  }
  return gids;
}

std::string DescribeGids(const std::vector<ibv_gid_entry>& gids) {
  std::vector<std::string> lines;
  for (const ibv_gid_entry& g : gids) {
    lines.push_back(
        absl::StrFormat("%d: %s (%s)", g.gid_index, GidString(g.gid), GidTypeName(g.gid_type)));
  }
  return lines.empty() ? "none" : absl::StrJoin(lines, "; ");
}

// Picks a GID when none is named: on RoCE the first RoCE v2 GID that carries an IPv4 address
// (what routed RoCE v2 fabrics address by), then any RoCE v2 GID, then the first entry.
int PickGid(const std::vector<ibv_gid_entry>& gids) {
  for (const ibv_gid_entry& g : gids) {
    if (g.gid_type == IBV_GID_TYPE_ROCE_V2 && IsIpv4Mapped(g.gid)) return g.gid_index;
  }
  for (const ibv_gid_entry& g : gids) {
    if (g.gid_type == IBV_GID_TYPE_ROCE_V2) return g.gid_index;
  }
  return gids.empty() ? -1 : static_cast<int>(gids.front().gid_index);
}

absl::StatusOr<ibv_mtu> MtuFromBytes(uint32_t bytes) {
  switch (bytes) {
    case 256:
      return IBV_MTU_256;
    case 512:
      return IBV_MTU_512;
    case 1024:
      return IBV_MTU_1024;
    case 2048:
      return IBV_MTU_2048;
    case 4096:
      return IBV_MTU_4096;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("MTU %d: verbs path MTUs are 256, 512, 1024, 2048 or 4096", bytes));
}

CompletionOpcode FromIbvOpcode(const ibv_wc& wc) {
  switch (wc.opcode) {
    case IBV_WC_SEND:
      return CompletionOpcode::kSend;
    case IBV_WC_RDMA_WRITE:
      return CompletionOpcode::kWrite;
    case IBV_WC_RDMA_READ:
      return CompletionOpcode::kRead;
    case IBV_WC_COMP_SWAP:
      return CompletionOpcode::kCompareSwap;
    case IBV_WC_FETCH_ADD:
      return CompletionOpcode::kFetchAdd;
    case IBV_WC_RECV:
      return (wc.wc_flags & IBV_WC_WITH_IMM) ? CompletionOpcode::kRecvWithImm
                                             : CompletionOpcode::kRecv;
    case IBV_WC_RECV_RDMA_WITH_IMM:
      return CompletionOpcode::kRecvWithImm;
    default:
      return CompletionOpcode::kSend;
  }
}

class VerbsMr : public MemoryRegion {
 public:
  VerbsMr(ibv_mr* mr, uint32_t access)
      : MemoryRegion(mr->addr, mr->length, mr->lkey, mr->rkey, access), mr_(mr) {}
  ~VerbsMr() override {
    if (const int rc = ibv_dereg_mr(mr_); rc != 0) LOG(ERROR) << "ibv_dereg_mr: " << rc;
  }

 private:
  ibv_mr* mr_;
};

}  // namespace

unsigned int ToIbvAccess(uint32_t access) {
  unsigned int flags = 0;
  if (access & kLocalWrite) flags |= IBV_ACCESS_LOCAL_WRITE;
  if (access & kRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access & kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  if (access & kRemoteAtomic) flags |= IBV_ACCESS_REMOTE_ATOMIC;
  // Verbs requires local write wherever remote write or atomics are granted.
  if (flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) {
    flags |= IBV_ACCESS_LOCAL_WRITE;
  }
  return flags;
}

CompletionStatus FromIbvStatus(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return CompletionStatus::kSuccess;
    case IBV_WC_LOC_LEN_ERR:
      return CompletionStatus::kLocalLengthError;
    case IBV_WC_LOC_PROT_ERR:
      return CompletionStatus::kLocalProtectionError;
    case IBV_WC_LOC_QP_OP_ERR:
      return CompletionStatus::kLocalQpOperationError;
    case IBV_WC_REM_ACCESS_ERR:
      return CompletionStatus::kRemoteAccessError;
    case IBV_WC_REM_INV_REQ_ERR:
      return CompletionStatus::kRemoteInvalidRequest;
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return CompletionStatus::kRnrRetryExceeded;
    case IBV_WC_RETRY_EXC_ERR:
      return CompletionStatus::kRetryExceeded;
    case IBV_WC_WR_FLUSH_ERR:
      return CompletionStatus::kFlushed;
    default:
      return CompletionStatus::kOtherError;
  }
}

uint32_t MtuBytes(ibv_mtu mtu) { return 128u << static_cast<int>(mtu); }

ibv_ah_attr AddressVector(const VerbsDevice& device, uint16_t lid, const Gid& gid) {
  ibv_ah_attr attr{};
  attr.dlid = lid;
  attr.port_num = device.port_num();
  if (device.port().ethernet) {
    attr.is_global = 1;
    std::memcpy(attr.grh.dgid.raw, gid.data(), gid.size());
    attr.grh.sgid_index = static_cast<uint8_t>(device.gid_index());
    attr.grh.hop_limit = kGrhHopLimit;
  }
  return attr;
}

// ---------------------------------------------------------------------------- device
absl::StatusOr<std::unique_ptr<VerbsDevice>> VerbsDevice::Open(const DeviceOptions& options) {
  if (options.faults.any()) {
    return absl::InvalidArgumentError("fault injection is a shm fabric feature, not for verbs");
  }
  absl::StatusOr<ibv_mtu> requested_mtu = MtuFromBytes(options.mtu);
  if (!requested_mtu.ok()) return requested_mtu.status();
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr || count == 0) {
    if (list != nullptr) ibv_free_device_list(list);
    return absl::NotFoundError(absl::StrFormat(
        "no RDMA device '%s': libibverbs finds none on this machine (is a provider such as mlx5 "
        "or rdma_rxe loaded? ibv_devices lists them); use --fabric=shm to run without one",
        options.name));
  }
  std::vector<std::string> names;
  ibv_context* context = nullptr;
  for (int i = 0; i < count; ++i) {
    names.push_back(ibv_get_device_name(list[i]));
    if (names.back() == options.name) context = ibv_open_device(list[i]);
  }
  const int open_errno = errno;
  ibv_free_device_list(list);
  if (context == nullptr) {
    if (std::find(names.begin(), names.end(), options.name) == names.end()) {
      return absl::NotFoundError(absl::StrFormat("no RDMA device '%s'; devices here: %s",
                                                 options.name, absl::StrJoin(names, ", ")));
    }
    return absl::UnavailableError(
        absl::StrFormat("ibv_open_device(%s): %s", options.name, std::strerror(open_errno)));
  }
  std::unique_ptr<VerbsDevice> device(new VerbsDevice());
  device->name_ = options.name;
  device->context_ = context;
  device->port_num_ = options.port;
  device->qps_.reset(new std::atomic<VerbsQp*>[kQpTableSlots]());
  device->qp_keys_.reset(new std::atomic<uint32_t>[kQpTableSlots]());

  ibv_device_attr device_attr{};
  if (const int rc = ibv_query_device(context, &device_attr); rc != 0) {
    return absl::UnavailableError(
        absl::StrFormat("ibv_query_device(%s): %s", options.name, std::strerror(rc)));
  }
  std::vector<std::string> ports;
  for (int p = 1; p <= device_attr.phys_port_cnt; ++p) {
    ibv_port_attr attr{};
    if (ibv_query_port(context, p, &attr) != 0) continue;
    ports.push_back(absl::StrFormat(
        "%d (%s, %s)", p, ibv_port_state_str(attr.state),
        attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet/RoCE" : "InfiniBand"));
  }
  const std::string port_list = absl::StrJoin(ports, ", ");
  if (options.port < 1 || options.port > device_attr.phys_port_cnt) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s has no port %d; its ports: %s", options.name, options.port, port_list));
  }
  ibv_port_attr port_attr{};
  if (const int rc = ibv_query_port(context, options.port, &port_attr); rc != 0) {
    return absl::UnavailableError(absl::StrFormat("ibv_query_port(%s, %d): %s", options.name,
                                                  options.port, std::strerror(rc)));
  }
  if (port_attr.state != IBV_PORT_ACTIVE) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s port %d is %s, not ACTIVE (link down or no subnet manager?); its ports: %s",
        options.name, options.port, ibv_port_state_str(port_attr.state), port_list));
  }
  const bool ethernet = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  const std::vector<ibv_gid_entry> gids =
      PortGids(context, options.port, port_attr.gid_tbl_len, ethernet);
  int gid_index = options.gid_index;
  if (gid_index < 0) {
    gid_index = ethernet ? PickGid(gids) : 0;
    if (gid_index < 0) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s port %d is RoCE but has no GID (does its netdev have an IP address?)",
                          options.name, options.port));
    }
  }
  const auto chosen = std::find_if(gids.begin(), gids.end(), [&](const ibv_gid_entry& g) {
    return static_cast<int>(g.gid_index) == gid_index;
  });
  if (chosen == gids.end() && (ethernet || options.gid_index >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s port %d has no GID at index %d; its GIDs: %s", options.name,
                        options.port, gid_index, DescribeGids(gids)));
  }
  device->gid_index_ = gid_index;
  device->path_mtu_ = std::min(*requested_mtu, port_attr.active_mtu);
  device->port_info_.lid = port_attr.lid;
  device->port_info_.ethernet = ethernet;
  device->port_info_.active_mtu = MtuBytes(port_attr.active_mtu);
  if (chosen != gids.end()) {
    std::memcpy(device->port_info_.gid.data(), chosen->gid.raw, 16);
    device->port_info_.grh_is_ipv4 =
        ethernet && chosen->gid_type == IBV_GID_TYPE_ROCE_V2 && IsIpv4Mapped(chosen->gid);
  }
  VLOG(1) << "opened " << options.name << " port " << int{options.port} << " "
          << (ethernet ? "RoCE" : "IB") << " lid " << port_attr.lid << " gid index " << gid_index
          << " path MTU " << MtuBytes(device->path_mtu_);
  return device;
}

VerbsDevice::~VerbsDevice() {
  CheckNoChildren();  // before the context goes: its PDs and CQs would be left dangling
  if (context_ != nullptr && ibv_close_device(context_) != 0) {
    LOG(ERROR) << "ibv_close_device(" << name_ << ") failed";
  }
}

absl::StatusOr<std::unique_ptr<ProtectionDomain>> VerbsDevice::DoAllocatePd() {
  ibv_pd* pd = ibv_alloc_pd(context_);
  if (pd == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("ibv_alloc_pd(%s): %s", name_, std::strerror(errno)));
  }
  return std::unique_ptr<ProtectionDomain>(new VerbsPd(this, pd));
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> VerbsDevice::DoCreateCq(uint32_t depth) {
  ibv_cq* cq = ibv_create_cq(context_, static_cast<int>(depth), nullptr, nullptr, 0);
  if (cq == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("ibv_create_cq(%s, %d): %s", name_, depth, std::strerror(errno)));
  }
  auto wrapped = std::make_unique<VerbsCq>(this, cq);
  counter_registry().Register(wrapped.get());
  return std::unique_ptr<CompletionQueue>(std::move(wrapped));
}

namespace {
uint32_t TableSlot(uint32_t qp_num) {
  return static_cast<uint32_t>((uint64_t{qp_num} * 0x9e3779b97f4a7c15ull) >> 48) &
         (kQpTableSlots - 1);
}
}  // namespace

absl::Status VerbsDevice::AddQp(VerbsQp* qp) {
  const uint32_t qp_num = qp->qp_num();
  util::MutexLock lock(&table_mutex_);
  for (uint32_t probe = 0, slot = TableSlot(qp_num); probe < kQpTableSlots;
       ++probe, slot = (slot + 1) & (kQpTableSlots - 1)) {
    const uint32_t key = qp_keys_[slot].load(std::memory_order_relaxed);
    if (key != kEmptyKey && key != kRemovedKey) continue;
    qps_[slot].store(qp, std::memory_order_relaxed);
    qp_keys_[slot].store(qp_num, std::memory_order_release);
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrFormat("more than %d QPs on device %s", kQpTableSlots, name_));
}

void VerbsDevice::RemoveQp(uint32_t qp_num) {
  util::MutexLock lock(&table_mutex_);
  for (uint32_t probe = 0, slot = TableSlot(qp_num); probe < kQpTableSlots;
       ++probe, slot = (slot + 1) & (kQpTableSlots - 1)) {
    const uint32_t key = qp_keys_[slot].load(std::memory_order_relaxed);
    if (key == kEmptyKey) return;
    if (key != qp_num) continue;
    qps_[slot].store(nullptr, std::memory_order_relaxed);
    // seq_cst, paired with PollGrace: a poll that enters after this store cannot find the QP.
    qp_keys_[slot].store(kRemovedKey, std::memory_order_seq_cst);
    return;
  }
}

VerbsQp* VerbsDevice::FindQp(uint32_t qp_num) const {
  for (uint32_t probe = 0, slot = TableSlot(qp_num); probe < kQpTableSlots;
       ++probe, slot = (slot + 1) & (kQpTableSlots - 1)) {
    const uint32_t key = qp_keys_[slot].load(std::memory_order_seq_cst);  // see RemoveQp
    if (key == kEmptyKey) return nullptr;
    if (key == qp_num) return qps_[slot].load(std::memory_order_relaxed);
  }
  return nullptr;
}

// ---------------------------------------------------------------------------- CQ
void PollGrace::Synchronize() {
  util::MutexLock lock(&synchronize_mutex_);
  for (int round = 0; round < 2; ++round) {
    const uint32_t draining = epoch_.fetch_add(1, std::memory_order_seq_cst) & 1;
    // New polls count on the other side now; the ones still counted here are a few WCs long.
    while (readers_[draining].load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  }
}

VerbsCq::~VerbsCq() {
  CheckNoLiveQps();  // ibv_destroy_cq would only fail with EBUSY and leak
  LeaveCounterRegistry();
  if (const int rc = ibv_destroy_cq(cq_); rc != 0) {
    LOG(ERROR) << "ibv_destroy_cq: " << std::strerror(rc) << " (QPs still use it?)";
  }
}

size_t VerbsCq::Poll(absl::Span<Completion> out) {
  counters_.polls.Add();
  ibv_wc wcs[kPollBatch];
  const int want = static_cast<int>(std::min<size_t>(out.size(), kPollBatch));
  const int n = ibv_poll_cq(cq_, want, wcs);
  if (n <= 0) {
    if (n < 0) {
      LOG_EVERY_N(ERROR, 1000) << "ibv_poll_cq(" << device_->name() << ") failed";
    }
    counters_.empty_polls.Add();
    return 0;
  }
  // Send completions free send-queue slots of their QP, found in the device's table: inside the
  // grace period, so the QP cannot be destroyed meanwhile (entered lazily: receives need none).
  constexpr uint32_t kNotEntered = ~0u;
  uint32_t grace = kNotEntered;
  auto send_completed = [&](uint32_t qp_num, bool success) {
    if (grace == kNotEntered) grace = grace_.Enter();
    if (VerbsQp* qp = device_->FindQp(qp_num)) qp->OnSendCompletion(success);
  };
  for (int i = 0; i < n; ++i) {
    const ibv_wc& wc = wcs[i];
    Completion& c = out[i];
    c.wr_id = wc.wr_id;
    c.status = FromIbvStatus(wc.status);
    c.qp_num = wc.qp_num;
    if (wc.status != IBV_WC_SUCCESS) {
      // Only wr_id, status and qp_num are defined for an error completion.
      c.opcode = CompletionOpcode::kSend;
      c.has_imm = false;
      c.byte_len = c.imm_data = c.src_qp = 0;
      if (c.status == CompletionStatus::kOtherError) {
        LOG_EVERY_N(WARNING, 1000)
            << device_->name() << " QP " << wc.qp_num << ": " << ibv_wc_status_str(wc.status)
            << " (vendor error " << wc.vendor_err << ")";
      }
      send_completed(wc.qp_num, false);
      continue;
    }
    c.opcode = FromIbvOpcode(wc);
    c.has_imm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0;
    c.imm_data = c.has_imm ? ntohl(wc.imm_data) : 0;
    c.byte_len = wc.byte_len;
    c.src_qp = wc.src_qp;
    if ((wc.opcode & IBV_WC_RECV) == 0) send_completed(wc.qp_num, true);
  }
  if (grace != kNotEntered) grace_.Exit(grace);
  counters_.completions.Add(static_cast<uint64_t>(n));
  return static_cast<size_t>(n);
}

// ---------------------------------------------------------------------------- PD, MR, AH
VerbsPd::~VerbsPd() {
  CheckNoChildren();  // ibv_dealloc_pd would only fail with EBUSY and leak
  if (const int rc = ibv_dealloc_pd(pd_); rc != 0) {
    LOG(ERROR) << "ibv_dealloc_pd: " << std::strerror(rc) << " (MRs, QPs or AHs still use it?)";
  }
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> VerbsPd::DoRegisterMemory(void* addr, size_t length,
                                                                        uint32_t access) {
  ibv_mr* mr = ibv_reg_mr(pd_, addr, length, static_cast<int>(ToIbvAccess(access)));
  if (mr == nullptr) {
    const int e = errno;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "ibv_reg_mr(%d bytes) on %s: %s%s", length, device_->name(), std::strerror(e),
        e == ENOMEM || e == EPERM ? " (locked-memory limit too low? see ulimit -l)" : ""));
  }
  return std::unique_ptr<MemoryRegion>(new VerbsMr(mr, access));
}

absl::StatusOr<std::unique_ptr<QueuePair>> VerbsPd::DoCreateQp(const QpConfig& config) {
  absl::StatusOr<std::unique_ptr<VerbsQp>> qp = VerbsQp::Create(device_, pd_, config);
  if (!qp.ok()) return qp.status();
  device_->counter_registry().Register(qp->get());
  return std::unique_ptr<QueuePair>(std::move(*qp));
}

absl::StatusOr<std::unique_ptr<AddressHandle>> VerbsPd::DoCreateAddressHandle(
    const AddressInfo& info) {
  ibv_ah_attr attr = AddressVector(*device_, info.lid, info.gid);
  ibv_ah* ah = ibv_create_ah(pd_, &attr);
  if (ah == nullptr) {
    ibv_gid gid;
    std::memcpy(gid.raw, info.gid.data(), sizeof(gid.raw));
    return absl::InvalidArgumentError(absl::StrFormat(
        "ibv_create_ah(lid %d, gid %s) on %s: %s (unreachable GID, or a wrong --gid_index?)",
        info.lid, GidString(gid), device_->name(), std::strerror(errno)));
  }
  return std::unique_ptr<AddressHandle>(new VerbsAh(ah));
}

VerbsAh::~VerbsAh() {
  if (const int rc = ibv_destroy_ah(ah_); rc != 0) LOG(ERROR) << "ibv_destroy_ah: " << rc;
}

std::vector<std::string> DeviceNames() {
  std::vector<std::string> names;
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) return names;
  for (int i = 0; i < count; ++i) names.push_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  return names;
}

}  // namespace transport::verbs
