// The fabric interface: verbs-shaped RAII objects, implemented by two backends.
//   "shm"   the shared-memory fabric: RC/UC/UD semantics between threads and processes of one
//           machine (transport/shm/). The default, and what every test runs on.
//   other   a libibverbs device by name (mlx5_0, rxe0, ...): InfiniBand and RoCE.
//
// Ownership follows verbs: a Device outlives its PDs and CQs, a PD outlives its MRs, QPs and
// AHs; destroying out of order is a programming error (CHECK-fails), never silent corruption.
// Data-path calls (PostSend, PostRecv, Poll) are virtual once per CALL, not per work request: a
// chain of WRs is one call and one doorbell, as ibv_post_send itself dispatches once per call.
// They never allocate, block or take a lock.
#ifndef HERD_TRANSPORT_FABRIC_H_
#define HERD_TRANSPORT_FABRIC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "transport/types.h"

namespace transport {

class CompletionQueue;
class QueuePair;

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
  mutable absl::Mutex mutex_;
  std::vector<const QueuePair*> qps_ ABSL_GUARDED_BY(mutex_);
  std::vector<const CompletionQueue*> cqs_ ABSL_GUARDED_BY(mutex_);
  CounterSnapshot retired_ ABSL_GUARDED_BY(mutex_);
};

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
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
};

class AddressHandle {
 public:
  virtual ~AddressHandle() = default;
};

class CompletionQueue {
 public:
  virtual ~CompletionQueue();
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

 private:
  friend class CounterRegistry;
  CounterRegistry* registry_ = nullptr;
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
  // The post-time checks every backend makes, as a NIC's driver does: SGE count, inline length
  // against max_inline_data, and UD's SEND-only rule with an address handle.
  absl::Status ValidateSend(const SendWr& wr) const;
  QpConfig config_;
  mutable QpCounters counters_;  // mutable: see SyncCounters

 private:
  friend class CounterRegistry;
  CounterRegistry* registry_ = nullptr;
};

class ProtectionDomain {
 public:
  virtual ~ProtectionDomain() = default;
  // Registers [addr, addr + length). The shm fabric needs shared memory (see
  // AllocateSharedMemory); the verbs backend takes any memory.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t length,
                                                                       uint32_t access) = 0;
  virtual absl::StatusOr<std::unique_ptr<QueuePair>> CreateQp(const QpConfig& config) = 0;
  virtual absl::StatusOr<std::unique_ptr<AddressHandle>> CreateAddressHandle(
      const AddressInfo& info) = 0;
};

struct PortInfo {
  uint16_t lid = 0;
  Gid gid{};
  uint32_t active_mtu = 0;  // bytes
  bool ethernet = false;    // RoCE: addresses by GID, GRH required
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  virtual PortInfo port() const = 0;
  virtual absl::StatusOr<std::unique_ptr<ProtectionDomain>> AllocatePd() = 0;
  virtual absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq(uint32_t depth) = 0;
  // Every counter of this device's QPs and CQs, past and present: its verb economy as a whole.
  CounterSnapshot counters() const { return registry_.Snapshot(); }
  // Backends register what they create here.
  CounterRegistry& counter_registry() { return registry_; }

 private:
  CounterRegistry registry_;
};

// Fault injection on the shm fabric (the verbs backend rejects non-zero values): loss that an
// unreliable transport may show on a real fabric, and a delay before every work request takes
// effect, so tests can prove a protocol survives both. Each QP draws from its own generator
// seeded from `seed` and its QP number: reproducible.
// How long a disordered WRITE waits before it writes some of its words again (see
// FaultOptions::write_disorder): long enough for a poller to consume the first copy.
inline constexpr uint32_t kDefaultDisorderPauseUs = 20;

struct FaultOptions {
  double ud_loss = 0;     // probability that a UD SEND is silently lost (counted as dropped)
  double uc_loss = 0;     // probability that a UC WRITE or SEND is silently lost
  uint32_t delay_us = 0;  // every send WR executes no earlier than this long after its post
                          // (implies the asynchronous mode, see DeviceOptions::shm_async)
  // Probability that a WRITE (or WRITE_WITH_IMM) lands as Soft-RoCE's memcpy may place it: its
  // 8-byte words (counted from the WRITE's first byte) in a random order, the last one not
  // necessarily last; then, after disorder_pause_us, a random subset of them AGAIN, always
  // including the last word (a poller that consumed and zeroed it sees it reappear). All of it
  // happens before the next WR of the same QP executes and before the WRITE's completion.
  // Implies the asynchronous mode: the pause runs on the progress thread, not in PostSend.
  double write_disorder = 0;
  uint32_t disorder_pause_us = kDefaultDisorderPauseUs;
  uint64_t seed = 1;
  bool any() const { return ud_loss > 0 || uc_loss > 0 || delay_us > 0 || write_disorder > 0; }
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
};

absl::StatusOr<std::unique_ptr<Device>> OpenDevice(const DeviceOptions& options);

// Names OpenDevice accepts here: "shm" and every verbs device present.
std::vector<std::string> ListDevices();

}  // namespace transport

#endif  // HERD_TRANSPORT_FABRIC_H_
