// The fabric interface: verbs-shaped RAII objects, implemented by two backends.
//   "shm"   the shared-memory fabric: RC/UC/UD semantics between threads and processes of one
//           machine (transport/shm/). The default, and what every test runs on.
//   other   a libibverbs device by name (mlx5_0, rxe0, ...): InfiniBand and RoCE.
//
// Ownership follows verbs: a Device outlives its PDs and CQs, a PD outlives its MRs, QPs and
// AHs, a CQ outlives the QPs that use it. Destroying out of order CHECK-fails on both backends,
// naming what is still alive (ChildLinks), never silent corruption. On the asynchronous shm
// fabric an AH destroyed while a posted WR naming it has not executed also CHECK-fails.
//
// Data-path calls (PostSend, PostRecv, Poll) are virtual once per CALL, not per work request: a
// chain of WRs is one call and one doorbell, as ibv_post_send itself dispatches once per call.
// What they may cost beyond that, exactly:
//   - Never: a heap allocation, a system call or a lock of this project's code, except as listed
//     here.
//   - verbs: one ibv_post_send / ibv_post_recv / ibv_poll_cq. The provider may take its own
//     per-queue spinlock (mlx5 and rxe do), and rxe rings its doorbell with a system call.
//   - shm, synchronous mode (the default): PostSend EXECUTES each WR in the poster's thread: it
//     copies the payload into the peer's memory, so it takes as long as the copy. An RC SEND or
//     WRITE_WITH_IMM whose receiver has no RECV posted (RNR) never waits there: it and every
//     later WR of its QP go to the device's progress thread (idle on a condition variable
//     otherwise), which retries after min_rnr_timer_us as a NIC does (rnr_retry = 7:
//     for as long as it takes); once they have completed, the QP executes inline again. Queuing
//     takes the device's progress mutex (RNR only, never the common path).
//   - shm, both modes: the first access to each remote memory region through a peer (an AH's or
//     a connected QP's) maps it once: a file open and mmap under that peer's mutex when the
//     peer is another process. Every later access to it is lock-free.
//   - shm, asynchronous mode: PostSend only copies the WR (and inline data) into the QP's
//     pending ring; the progress thread executes it later (and sleeps there, never in PostSend).
//   - Poll never blocks on either backend.
// Control-path calls (open, create, connect, destroy, counters()) may allocate, lock and block.
//
// What a READ returns while the responder's CPU writes the memory it reads (one-sided readers
// depend on it: hopscotch/neighbourhood.h):
//   - shm: each 64-byte line of the responder's addresses as of one instant (a line that falls
//     across two of the requester's SGEs: each part as of its own instant), lines in ascending
//     order, each at its own instant. Exact for lines whose words never return to an earlier
//     value while the READ copies them (a line with a version word); a line written without
//     such a word may, in principle, show an A-B-A mix (transport/shm/ordered_copy.h).
//   - verbs: what the NIC's DMA reads. Hardware NICs read whole cache lines coherently in
//     practice (FaRM relies on it; no specification promises it, nor the ascending order); rxe
//     copies with the kernel's memcpy and promises neither.
#ifndef HERD_TRANSPORT_FABRIC_H_
#define HERD_TRANSPORT_FABRIC_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "transport/types.h"
#include "util/mutex.h"

namespace transport {

class CompletionQueue;
class QueuePair;
class ProtectionDomain;
class Device;

// The ownership rule's bookkeeping. A parent (device, PD, CQ) counts its live children; each
// child links to its parents' counts when the parent's public create call hands it out, and
// drops the links in its base destructor, after its backend released it. A parent destroyed
// with a child alive CHECK-fails, naming what is still alive, before its backend releases
// anything (on verbs ibv_dealloc_pd would only fail with EBUSY and leak; on shm a QP would
// write into an unmapped segment later).
class ChildLinks {
 public:
  ChildLinks() = default;
  ChildLinks(const ChildLinks&) = delete;
  ChildLinks& operator=(const ChildLinks&) = delete;
  ~ChildLinks();
  void Link(std::atomic<uint32_t>* live_count);

 private:
  static constexpr int kMaxParents = 3;  // a QP has the most: its PD, send CQ and receive CQ
  std::atomic<uint32_t>* counts_[kMaxParents] = {};
  int linked_ = 0;
};

// A device's counters: the sum over every QP and CQ it created, destroyed ones included (their
// counters are folded in when they go). Backends register each QP and CQ they create; reading is
// control path (a mutex), the data path never touches it.
class CounterRegistry {
 public:
  void Register(QueuePair* qp);
  void Register(CompletionQueue* cq);
  CounterSnapshot Snapshot() const;

 private:
  friend class QueuePair;
  friend class CompletionQueue;
  void Retire(const QueuePair* qp);
  void Retire(const CompletionQueue* cq);
  mutable util::Mutex mutex_;
  std::vector<const QueuePair*> qps_ ABSL_GUARDED_BY(mutex_);
  std::vector<const CompletionQueue*> cqs_ ABSL_GUARDED_BY(mutex_);
  CounterSnapshot retired_ ABSL_GUARDED_BY(mutex_);
};

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  void* addr() const { return addr_; }
  size_t length() const { return length_; }
  uint32_t lkey() const { return lkey_; }
  uint32_t rkey() const { return rkey_; }
  uint32_t access() const { return access_; }

 protected:
  MemoryRegion(void* addr, size_t length, uint32_t lkey, uint32_t rkey, uint32_t access)
      : addr_(addr), length_(length), lkey_(lkey), rkey_(rkey), access_(access) {}

 private:
  void* addr_;
  size_t length_;
  uint32_t lkey_;
  uint32_t rkey_;
  uint32_t access_;
  friend class ProtectionDomain;
  ChildLinks parents_;
};

// Where UD sends go. Like a verbs AH it may be shared: several QPs on several threads may post
// with one AH at once. Destroy it only after every WR that names it has executed (asynchronous
// shm: CHECK-fails otherwise; a NIC would read freed memory).
class AddressHandle {
 public:
  virtual ~AddressHandle() = default;

 private:
  friend class ProtectionDomain;
  ChildLinks parents_;
};

class CompletionQueue {
 public:
  virtual ~CompletionQueue();
  // How many QPs use this CQ (as send or receive CQ, or both): it must outlive them.
  uint32_t live_qps() const { return live_qps_.load(std::memory_order_acquire); }
  // Moves up to out.size() completions into out; returns how many. Never blocks.
  virtual size_t Poll(absl::Span<Completion> out) = 0;
  const CqCounters& counters() const {
    SyncCounters();
    return counters_;
  }

 protected:
  // Folds in counts that others recorded outside this object (shm: overruns counted by the
  // producers in the ring). Any thread may call it: it may only raise counters to a new total.
  virtual void SyncCounters() const {}
  mutable CqCounters counters_;  // mutable: see SyncCounters
  // CHECK-fails when a QP still uses this CQ. Backends call it first in their destructors
  // (before releasing anything); the base destructor checks again.
  void CheckNoLiveQps() const;
  // Takes this CQ's last counts into the device's registry and leaves it. Backends call it
  // first in their destructors: once a destructor runs, a Snapshot on another thread must no
  // longer reach the object (its virtual SyncCounters would be a half-destroyed object's).
  void LeaveCounterRegistry();

 private:
  friend class CounterRegistry;
  friend class Device;
  friend class ProtectionDomain;
  CounterRegistry* registry_ = nullptr;
  std::atomic<uint32_t> live_qps_{0};
  ChildLinks parents_;
};

struct QpConfig {
  QpType type = QpType::kRc;
  CompletionQueue* send_cq = nullptr;
  CompletionQueue* recv_cq = nullptr;
  uint32_t max_send_wr = 128;  // send queue depth: posting past it fails, as on a NIC
  uint32_t max_recv_wr = 128;
  uint32_t max_send_sge = 1;
  uint32_t max_recv_sge = 1;
  uint32_t max_inline_data = 60;
};

// Connection parameters for INIT -> RTR -> RTS.
struct ConnectConfig {
  QpEndpoint remote;               // RC/UC: the peer QP; UD: ignored
  uint32_t qkey = 0x11111111;      // UD: accepted qkey
  uint8_t rnr_retry = 7;           // RC: RNR retries (7 = retry forever, as in verbs)
  uint8_t retry_count = 7;         // RC: transport retries
  uint32_t min_rnr_timer_us = 10;  // RC: wait between RNR retries
};

class QueuePair {
 public:
  virtual ~QueuePair();

  // Posts a chain of send WRs with one doorbell. On failure nothing after *bad was posted and
  // the status says why (queue full, bad SGE count, inline too long, wrong opcode for the QP).
  virtual absl::Status PostSend(SendWr* chain, SendWr** bad) = 0;
  virtual absl::Status PostRecv(RecvWr* chain, RecvWr** bad) = 0;

  // RESET -> INIT -> RTR -> RTS in one call.
  virtual absl::Status Connect(const ConnectConfig& config) = 0;
  // Forces the error state (fault injection, or tearing down): pending WRs flush.
  virtual void SetError() = 0;

  virtual QpState state() const = 0;
  virtual QpEndpoint endpoint() const = 0;
  uint32_t qp_num() const { return endpoint().qp_num; }
  const QpConfig& config() const { return config_; }
  const QpCounters& counters() const {
    SyncCounters();
    return counters_;
  }

 protected:
  // Folds in counts that others recorded outside this object (shm: the inbound drops senders
  // record in this QP's table entry). Any thread may call it: it may only raise counters to a new
  // total. A backend calls it once more before it gives its table entry up.
  virtual void SyncCounters() const {}
  explicit QueuePair(const QpConfig& config) : config_(config) {}
  // Takes this QP's last counts into the device's registry and leaves it: backends call it
  // first in their destructors (as CompletionQueue::LeaveCounterRegistry).
  void LeaveCounterRegistry();
  // The post-time checks every backend makes, as a NIC's driver does: SGE count, inline length
  // against max_inline_data, and UD's SEND-only rule with an address handle.
  absl::Status ValidateSend(const SendWr& wr) const;
  QpConfig config_;
  mutable QpCounters counters_;  // mutable: see SyncCounters

 private:
  friend class CounterRegistry;
  friend class ProtectionDomain;
  CounterRegistry* registry_ = nullptr;
  ChildLinks parents_;
};

// Creates MRs, QPs and AHs, and must outlive them. The public calls are the backends' Do*
// calls plus the ownership bookkeeping (ChildLinks), so no backend can forget it.
class ProtectionDomain {
 public:
  virtual ~ProtectionDomain();
  // Registers [addr, addr + length). The shm fabric needs shared file mappings (see
  // SharedMemory::Allocate), up to kMaxMrExtents of them in a row (FindBackings); the verbs
  // backend takes any memory.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t length,
                                                               uint32_t access);
  // The QP must also die before its send and receive CQs.
  absl::StatusOr<std::unique_ptr<QueuePair>> CreateQp(const QpConfig& config);
  // shm: maps the peer's segment now (an unreachable peer is an error here, not at the first
  // SEND); verbs: ibv_create_ah.
  absl::StatusOr<std::unique_ptr<AddressHandle>> CreateAddressHandle(const AddressInfo& info);

 protected:
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> DoRegisterMemory(void* addr, size_t length,
                                                                         uint32_t access) = 0;
  virtual absl::StatusOr<std::unique_ptr<QueuePair>> DoCreateQp(const QpConfig& config) = 0;
  virtual absl::StatusOr<std::unique_ptr<AddressHandle>> DoCreateAddressHandle(
      const AddressInfo& info) = 0;
  // CHECK-fails, naming them, when MRs, QPs or AHs of this PD are alive. Backends call it first
  // in their destructors; the base destructor checks again.
  void CheckNoChildren() const;

 private:
  friend class Device;
  std::atomic<uint32_t> live_mrs_{0}, live_qps_{0}, live_ahs_{0};
  ChildLinks parents_;
};

struct PortInfo {
  uint16_t lid = 0;
  Gid gid{};
  uint32_t active_mtu = 0;  // bytes
  bool ethernet = false;    // RoCE: addresses by GID, GRH required
  // RoCE v2 over IPv4: a UD receive's GRH area holds the sender's IPv4 header in its last 20
  // bytes instead of a GRH (see SourceGidOfGrh).
  bool grh_is_ipv4 = false;
};

// Creates PDs and CQs, and must outlive them (see ChildLinks).
class Device {
 public:
  virtual ~Device();
  virtual std::string name() const = 0;
  virtual PortInfo port() const = 0;
  absl::StatusOr<std::unique_ptr<ProtectionDomain>> AllocatePd();
  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq(uint32_t depth);
  // Every counter of this device's QPs and CQs, past and present: its verb economy as a whole.
  CounterSnapshot counters() const { return registry_.Snapshot(); }
  // Backends register what they create here.
  CounterRegistry& counter_registry() { return registry_; }

 protected:
  virtual absl::StatusOr<std::unique_ptr<ProtectionDomain>> DoAllocatePd() = 0;
  virtual absl::StatusOr<std::unique_ptr<CompletionQueue>> DoCreateCq(uint32_t depth) = 0;
  // CHECK-fails, naming them, when PDs or CQs of this device are alive. Backends call it first
  // in their destructors; the base destructor checks again.
  void CheckNoChildren() const;

 private:
  void CheckNoChildren(const std::string& name) const;
  CounterRegistry registry_;
  std::atomic<uint32_t> live_pds_{0}, live_cqs_{0};
};

// Fault injection on the shm fabric (the verbs backend rejects non-zero values): loss that an
// unreliable transport may show on a real fabric, and a delay before every work request takes
// effect, so tests can prove a protocol survives both. Each QP draws from its own generator
// seeded from `seed` and its QP number: reproducible.
// How long a disordered WRITE waits before it writes some of its words again (see
// FaultOptions::write_disorder): long enough for a poller to consume the first copy.
inline constexpr uint32_t kDefaultDisorderPauseUs = 20;

// FaultOptions::slow_read_us: the pieces a slow READ is copied in (whole 64-byte lines each).
inline constexpr uint32_t kSlowReadChunks = 16;

struct FaultOptions {
  double ud_loss = 0;     // probability that a UD SEND is silently lost (counted as dropped)
  double uc_loss = 0;     // probability that a UC WRITE or SEND is silently lost
  uint32_t delay_us = 0;  // every send WR executes no earlier than this long after its post
                          // (implies the asynchronous mode, see DeviceOptions::shm_async)
  // Each post_send's WRs wait a further uniform 0..delay_jitter_us, drawn per post (each QP its
  // own draws, in order: a WR never overtakes an earlier one of its QP), so two QPs posted to at
  // the same moment land at different times: one replica ahead of another. Implies the
  // asynchronous mode.
  uint32_t delay_jitter_us = 0;
  // Probability that a WRITE (or WRITE_WITH_IMM) lands as Soft-RoCE's memcpy may place it: its
  // 8-byte words (counted from the WRITE's first byte) in a random order, the last one not
  // necessarily last; then, after disorder_pause_us, a random subset of them AGAIN, always
  // including the last word (a poller that consumed and zeroed it sees it reappear). All of it
  // happens before the next WR of the same QP executes and before the WRITE's completion.
  // Implies the asynchronous mode: the pause runs on the progress thread, not in PostSend.
  double write_disorder = 0;
  uint32_t disorder_pause_us = kDefaultDisorderPauseUs;
  // A READ copies its bytes in kSlowReadChunks pieces with this pause between them, so the
  // responder's memory can change under it as it can under a NIC's DMA of a large READ (a
  // one-sided reader must detect that). Implies the asynchronous mode.
  uint32_t slow_read_us = 0;
  uint64_t seed = 1;
  // A partition table (transport/shm/partition_table.h) this device obeys: a WR between two
  // processes cut apart there is lost (UD/UC silently, RC with RETRY_EXCEEDED), in either
  // direction, from the moment of the cut until it heals. Created if missing. Empty: none.
  std::string partition_file = {};  // (initialised: designated initialisers may omit it)
  bool any() const {
    return ud_loss > 0 || uc_loss > 0 || delay_us > 0 || delay_jitter_us > 0 ||
           write_disorder > 0 || slow_read_us > 0 || !partition_file.empty();
  }
};

// Options for opening a device; the verbs fields are ignored by the shm fabric and vice versa.
struct DeviceOptions {
  std::string name = "shm";        // "shm" or a verbs device name
  std::string fabric = "default";  // shm: runs with different names never see each other
  uint32_t mtu = 4096;             // shm: UD payload limit; verbs: requested path MTU
  uint8_t port = 1;                // verbs
  int gid_index = -1;              // verbs: -1 picks the first RoCE v2 / IB GID
  FaultOptions faults;             // shm only
  // shm: the asynchronous mode. Send WRs are queued by PostSend and executed later, in order, by
  // the device's progress thread, as a NIC does: a non-inline buffer is read when the WR
  // executes, not when it is posted, so reusing it before its completion shows up in tests.
  // Inline data is captured at post time. (Synchronous mode executes inside PostSend.)
  bool shm_async = false;
  // shm: map a peer's registered region even when its file is not sealed against shrinking (a
  // file on disk or in /dev/shm: rmem's and hopscotch's --path pools). Its owner could then
  // truncate it under our mapping and SIGBUS this process at its next access, so it is for a
  // peer this process trusts with its life: a client reaching its server's pool. Off, only
  // regions in sealed memfds (what util::CreateMemfd makes) are mapped; any other fails as a bad
  // key would (a protection error at the side that named it).
  bool shm_map_unsealed_regions = false;
};

absl::StatusOr<std::unique_ptr<Device>> OpenDevice(const DeviceOptions& options);

// What a one-queue service or client opens first (hopscotch's and rmem's): the device, one
// protection domain on it and one completion queue. Members are declared so that they destroy
// in the order the verbs need: the CQ, then the PD, then the device.
struct DeviceResources {
  std::unique_ptr<Device> device;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
};
// Opens options' device, a PD and a CQ of `cq_depth` entries; the first failure's status.
absl::StatusOr<DeviceResources> OpenDeviceResources(const DeviceOptions& options,
                                                    uint32_t cq_depth);

// Names OpenDevice accepts here: "shm" and every verbs device present.
std::vector<std::string> ListDevices();

}  // namespace transport

#endif  // HERD_TRANSPORT_FABRIC_H_
