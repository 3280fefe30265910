// Internal classes of the libibverbs backend (not part of the transport interface). One code path
// serves InfiniBand (LID addressing) and RoCE v1/v2 (GID addressing, GRH on every packet): the
// port's link layer decides whether address vectors are global, never a build option.
#ifndef HERD_TRANSPORT_VERBS_VERBS_INTERNAL_H_
#define HERD_TRANSPORT_VERBS_VERBS_INTERNAL_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "transport/fabric.h"
#include "util/mutex.h"

namespace transport::verbs {

class VerbsQp;

// Send QPs are found by number when their completions are polled (to free send queue slots).
// Open addressing over a fixed power-of-two table: lookups are lock-free, inserts and removals
// happen on the control path under the device's mutex.
inline constexpr uint32_t kQpTableSlots = 1u << 16;  // more than any herd process creates

class VerbsDevice : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<VerbsDevice>> Open(const DeviceOptions& options);
  ~VerbsDevice() override;
  std::string name() const override { return name_; }
  PortInfo port() const override { return port_info_; }

  ibv_context* context() const { return context_; }
  uint8_t port_num() const { return port_num_; }
  int gid_index() const { return gid_index_; }
  // The path MTU RC/UC QPs use: the requested MTU, capped by the port's active MTU.
  ibv_mtu path_mtu() const { return path_mtu_; }

  absl::Status AddQp(VerbsQp* qp);
  // After RemoveQp returns, FindQp no longer finds the QP; a poll already holding it may still
  // use it until its CQ's WaitForPollers returns.
  void RemoveQp(uint32_t qp_num);
  VerbsQp* FindQp(uint32_t qp_num) const;  // nullptr when not (or no longer) registered

 protected:
  absl::StatusOr<std::unique_ptr<ProtectionDomain>> DoAllocatePd() override;
  absl::StatusOr<std::unique_ptr<CompletionQueue>> DoCreateCq(uint32_t depth) override;

 private:
  VerbsDevice() = default;
  std::string name_;
  ibv_context* context_ = nullptr;
  uint8_t port_num_ = 1;
  int gid_index_ = 0;
  ibv_mtu path_mtu_ = IBV_MTU_1024;
  PortInfo port_info_;
  util::Mutex table_mutex_;                           // writers of the QP table only
  std::unique_ptr<std::atomic<uint32_t>[]> qp_keys_;  // QP number per slot (see FindQp)
  std::unique_ptr<std::atomic<VerbsQp*>[]> qps_;
};

// A grace period for the QP table, one per CQ. Poll finds the QPs of its send completions in
// the device's table and updates them; a QP being destroyed on another thread must not be freed
// under it. Poll brackets its lookups with Enter/Exit; the QP's destructor removes the QP from
// the table and then calls Synchronize, which returns once every poll that could have found it
// has left. Two reader counts and a flipping epoch (the sleepable-RCU scheme) keep a steady
// stream of polls from starving the destructor. Empty polls never enter.
class PollGrace {
 public:
  // Returns the reader count to hand to Exit.
  uint32_t Enter() {
    const uint32_t index = epoch_.load(std::memory_order_seq_cst) & 1;
    readers_[index].fetch_add(1, std::memory_order_seq_cst);
    return index;
  }
  void Exit(uint32_t index) { readers_[index].fetch_sub(1, std::memory_order_release); }
  // Control path. Both counts drain to zero, each after the epoch moved away from it, so every
  // poll that began before the call (and so might hold a removed QP) has exited.
  void Synchronize();

 private:
  util::Mutex synchronize_mutex_;  // one Synchronize at a time: each must see both flips
  std::atomic<uint32_t> epoch_{0};
  std::atomic<uint32_t> readers_[2] = {};
};

class VerbsCq : public CompletionQueue {
 public:
  VerbsCq(VerbsDevice* device, ibv_cq* cq) : device_(device), cq_(cq) {}
  ~VerbsCq() override;
  size_t Poll(absl::Span<Completion> out) override;
  ibv_cq* cq() const { return cq_; }
  VerbsDevice* device() const { return device_; }
  // Called by a QP that sends to this CQ after it left the device's QP table.
  void WaitForPollers() { grace_.Synchronize(); }

 private:
  VerbsDevice* device_;
  ibv_cq* cq_;
  PollGrace grace_;
};

class VerbsPd : public ProtectionDomain {
 public:
  VerbsPd(VerbsDevice* device, ibv_pd* pd) : device_(device), pd_(pd) {}
  ~VerbsPd() override;

 protected:
  absl::StatusOr<std::unique_ptr<MemoryRegion>> DoRegisterMemory(void* addr, size_t length,
                                                                 uint32_t access) override;
  absl::StatusOr<std::unique_ptr<QueuePair>> DoCreateQp(const QpConfig& config) override;
  absl::StatusOr<std::unique_ptr<AddressHandle>> DoCreateAddressHandle(
      const AddressInfo& info) override;

 private:
  VerbsDevice* device_;
  ibv_pd* pd_;
};

class VerbsAh : public AddressHandle {
 public:
  explicit VerbsAh(ibv_ah* ah) : ah_(ah) {}
  ~VerbsAh() override;
  ibv_ah* ah() const { return ah_; }

 private:
  ibv_ah* ah_;
};

// The address vector that reaches (lid, gid) from this device's port: global (GRH, the GID and
// our GID index) on RoCE, or whenever a GID is given; LID-routed otherwise.
ibv_ah_attr AddressVector(const VerbsDevice& device, uint16_t lid, const Gid& gid);

// Verbs' names for our enums.
unsigned int ToIbvAccess(uint32_t access);
CompletionStatus FromIbvStatus(ibv_wc_status status);
uint32_t MtuBytes(ibv_mtu mtu);

// The names of the verbs devices present (empty when none, or no libibverbs provider).
std::vector<std::string> DeviceNames();

}  // namespace transport::verbs

#endif  // HERD_TRANSPORT_VERBS_VERBS_INTERNAL_H_
