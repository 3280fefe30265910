// Verbs-shaped value types shared by every fabric backend: work requests, completions, flags,
// addresses and counters. They mirror libibverbs closely so the verbs backend maps them 1:1, and
// they carry no backend state.
#ifndef HERD_TRANSPORT_TYPES_H_
#define HERD_TRANSPORT_TYPES_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "util/counter.h"

namespace transport {

enum class QpType : uint8_t { kRc, kUc, kUd };
enum class QpState : uint8_t { kReset, kInit, kRtr, kRts, kError };
// How a client and a server set up a session: over the TCP control plane (transport/control), or
// over RDMA-CM with no TCP at all (transport/cm_channel.h, verbs devices only).
enum class ConnectMode : uint8_t { kTcp, kCm };

enum class Opcode : uint8_t {
  kSend,
  kSendWithImm,
  kWrite,
  kWriteWithImm,
  kRead,
  kCompareSwap,
  kFetchAdd,
};

// What a completion reports (a receive is kRecv, or kRecvWithImm for SEND/WRITE_WITH_IMM).
enum class CompletionOpcode : uint8_t {
  kSend,
  kWrite,
  kRead,
  kCompareSwap,
  kFetchAdd,
  kRecv,
  kRecvWithImm,
};

enum class CompletionStatus : uint8_t {
  kSuccess,
  kLocalLengthError,       // receive buffer too small, or a WR longer than allowed
  kLocalProtectionError,   // lkey invalid or the buffer lies outside its region
  kLocalQpOperationError,  // the QP type cannot do this opcode (e.g. READ on UC)
  kRemoteAccessError,      // rkey invalid, range outside the region, or access not granted
  kRemoteInvalidRequest,   // e.g. a misaligned atomic
  kRnrRetryExceeded,       // RC SEND found no posted RECV through every retry
  kRetryExceeded,          // the peer is unreachable (dead process, closed QP)
  kFlushed,                // the QP was in the error state
  kOtherError,             // any other verbs error (the backend logs the provider's name)
};

const char* ToString(QpType type);
const char* ToString(QpState state);
const char* ToString(Opcode opcode);
const char* ToString(CompletionStatus status);

// Memory region access (IBV_ACCESS_* equivalents). Local read is always granted.
enum Access : uint32_t {
  kLocalWrite = 1u << 0,
  kRemoteWrite = 1u << 1,
  kRemoteRead = 1u << 2,
  kRemoteAtomic = 1u << 3,
};

// Send flags (IBV_SEND_* equivalents).
enum SendFlag : uint32_t {
  kSignaled = 1u << 0,
  kInline = 1u << 1,
};

struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

class AddressHandle;

struct SendWr {
  uint64_t wr_id = 0;
  SendWr* next = nullptr;  // a chain of WRs is posted with ONE call (one doorbell)
  Sge* sg_list = nullptr;
  uint32_t num_sge = 0;
  Opcode opcode = Opcode::kSend;
  uint32_t flags = 0;     // SendFlag bits
  uint32_t imm_data = 0;  // *_WITH_IMM
  // RDMA WRITE/READ and atomics.
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  // Atomics: CMP_AND_SWP compares with compare_add and writes swap; FETCH_AND_ADD adds
  // compare_add. The 8-byte original value lands in sg_list[0].
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  // UD only.
  const AddressHandle* ah = nullptr;
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
};

// Resets every field of `wr` to its default, for a WR array reused post after post. Not `wr =
// SendWr{}`: GCC compiles that 88-byte reset to `rep stosq`, whose start-up (~30 cycles) every
// posted WR paid (perf of herd's worker and client); field by field it is a few stores.
inline void ResetSendWr(SendWr& wr) {
  static_assert(sizeof(SendWr) == 88, "a field was added to SendWr: reset it here too");
  wr.wr_id = 0;
  wr.next = nullptr;
  wr.sg_list = nullptr;
  wr.num_sge = 0;
  wr.opcode = Opcode::kSend;
  wr.flags = 0;
  wr.imm_data = 0;
  wr.remote_addr = 0;
  wr.rkey = 0;
  wr.compare_add = 0;
  wr.swap = 0;
  wr.ah = nullptr;
  wr.remote_qpn = 0;
  wr.remote_qkey = 0;
}

struct RecvWr {
  uint64_t wr_id = 0;
  RecvWr* next = nullptr;
  Sge* sg_list = nullptr;
  uint32_t num_sge = 0;
};

struct Completion {
  uint64_t wr_id = 0;
  CompletionStatus status = CompletionStatus::kSuccess;
  CompletionOpcode opcode = CompletionOpcode::kSend;
  bool has_imm = false;
  uint32_t byte_len = 0;  // receives: payload bytes (UD: plus the 40-byte GRH area)
  uint32_t imm_data = 0;
  uint32_t qp_num = 0;  // the local QP this completion belongs to
  uint32_t src_qp = 0;  // UD receives: the sender's QP number
};

// UD receive buffers start with this many bytes of GRH area, as on hardware.
inline constexpr uint32_t kGrhBytes = 40;

using Gid = std::array<uint8_t, 16>;

// Where a UD receive's GRH area names the sender. An InfiniBand GRH (and RoCE v1's, and RoCE
// v2's over IPv6, whose IPv6 header has the same layout) carries the source GID at bytes 8..23;
// RoCE v2 over IPv4 puts the IPv4 header in bytes 20..39, its source address at 32..35, which
// the GID ::ffff:a.b.c.d names. The shm fabric writes an InfiniBand-layout GRH. Queue pair
// numbers are unique per device only: (source GID, source QP) is a UD sender's identity.
inline constexpr uint32_t kGrhSourceGidOffset = 8;
inline constexpr uint32_t kGrhIpv4SourceOffset = 32;
inline Gid SourceGidOfGrh(const uint8_t* grh, bool grh_is_ipv4) {
  Gid gid{};
  if (grh_is_ipv4) {
    gid[10] = gid[11] = 0xff;  // IPv4-mapped
    for (int i = 0; i < 4; ++i) gid[12 + i] = grh[kGrhIpv4SourceOffset + i];
  } else {
    for (int i = 0; i < 16; ++i) gid[i] = grh[kGrhSourceGidOffset + i];
  }
  return gid;
}

// What a peer needs to reach one QP: exchanged over the control plane.
struct QpEndpoint {
  uint32_t qp_num = 0;
  uint16_t lid = 0;  // InfiniBand; 0 on RoCE and on the shm fabric
  Gid gid{};         // RoCE (and the shm fabric's process address)
  uint32_t psn = 0;  // initial packet sequence number
};

// Where a UD address handle points.
struct AddressInfo {
  uint16_t lid = 0;
  Gid gid{};
};

// Counters that show a program's verb economy. Kept identically by every backend: one writer (the
// thread that owns the QP or CQ), relaxed atomics so a progress thread may read them.
using Counter = util::Counter;

struct QpCounters {
  Counter doorbells;     // PostSend calls that posted at least one WR
  Counter wrs;           // send WRs posted
  Counter signaled_wrs;  // ... of which signalled
  Counter inline_wrs;    // ... of which inline
  Counter bytes;         // payload bytes of posted send WRs
  Counter recv_wrs;      // receive WRs posted
  // Messages lost silently (UD/UC only: RC reports a loss as an error completion). It sums two
  // views, and only the shm fabric has both:
  //   inbound, at this QP as receiver: no RECV posted, over the MTU or the receive buffer at the
  //     head, bad qkey or rkey, and a receive completion lost to a full receive CQ (that one is
  //     ALSO counted in the CQ's overruns). shm: senders record these in this QP's segment entry,
  //     folded in when the counters are read. verbs: a NIC cannot report them; always 0.
  //   outbound, at this QP as sender (shm only): its own messages lost: injected loss, an
  //     unreachable or closed peer QP, and every inbound drop above that it caused (so one
  //     message dropped at a receiver counts once at each end), except a completion lost to a
  //     full CQ (the message itself landed).
  // Device totals (Device::counters(), JSON "dropped") add these over the device's QPs: a message
  // between two QPs of ONE device that is dropped at the receiver counts twice there (once per
  // end), and a completion lost to a full CQ counts in both "dropped" and "cq_overruns".
  Counter dropped;
};

struct CqCounters {
  Counter polls;        // Poll calls
  Counter empty_polls;  // ... that returned nothing
  Counter completions;  // completions returned
  // Completions lost because this CQ was full when they arrived (never silent: the shm backend
  // also logs an error). shm: counted by the producer in the ring, folded in by Poll and by
  // counters(). A lost receive completion also counts in its QP's dropped (see there). verbs: 0
  // (an overrun is a fatal CQ error there, not a count).
  Counter overruns;
};

// Plain copy of the counters, for printing and JSON. JSON names are the field names, except
// polls -> "cq_polls", empty_polls -> "cq_empty_polls" (CqCounters::polls, empty_polls) and
// cq_overruns (CqCounters::overruns).
struct CounterSnapshot {
  uint64_t doorbells = 0, wrs = 0, signaled_wrs = 0, inline_wrs = 0, bytes = 0, recv_wrs = 0,
           dropped = 0, polls = 0, empty_polls = 0, completions = 0, cq_overruns = 0;
  void Add(const QpCounters& qp);
  void Add(const CqCounters& cq);
  void Add(const CounterSnapshot& other);
  // What was counted after `earlier` (a snapshot of the same counters taken before).
  CounterSnapshot Since(const CounterSnapshot& earlier) const;
  std::string ToJson() const;
};

}  // namespace transport

#endif  // HERD_TRANSPORT_TYPES_H_
