// Memory layouts of the shared-memory fabric. Everything a PEER touches lives in the owning
// device's segment, a memfd that peers map through /proc/<pid>/fd/<fd>: no named segments exist,
// so a crashed or kill -9'd run leaves nothing behind (the kernel frees a memfd with its last
// mapping). A device's address (its GID) is {fabric id, pid, segment fd}.
//
// All cross-process synchronisation is lock-free atomics on shared memory (address-free on
// x86-64): receive rings are single-producer (the owner posts) multi-consumer (senders claim);
// completion rings are multi-producer (local sends, remote senders) single-consumer (the poller).
#ifndef HERD_TRANSPORT_SHM_SEGMENT_H_
#define HERD_TRANSPORT_SHM_SEGMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/shared_memory.h"
#include "transport/types.h"

namespace transport::shm {

inline constexpr uint64_t kSegmentMagic = 0x6865726473686d31ULL;  // "herdshm1"
// The layout below; a peer with another version is refused (bump on any layout change).
inline constexpr uint32_t kSegmentVersion = 8;
// Virtual size of a segment; memfd pages are allocated only when touched.
inline constexpr uint64_t kSegmentBytes = uint64_t{256} << 20;
inline constexpr uint32_t kMaxMrs = 4096;  // registered regions per device
inline constexpr uint32_t kMaxQps = 4096;  // QPs per device (qp_num = generation << 12 | index)
inline constexpr uint32_t kQpIndexBits = 12;
inline constexpr uint32_t kMrIndexShift = 8;  // key = index << 8 | generation (never 0)

// One piece of a registered region: `length` bytes of the owner's file from `file_offset`. A
// region's extents follow each other in its virtual range (see FindBackings).
struct MrExtent {
  int32_t fd;  // the owner's descriptor of the backing file
  uint32_t reserved;
  uint64_t file_offset;
  uint64_t length;
};

struct MrEntry {
  std::atomic<uint32_t> key;  // 0: free
  uint32_t access;
  // Which registration of the device this is (1, 2, ...): unlike a key, whose 8-bit generation
  // comes round again, never the same twice, so a peer's mapping of an earlier region that had
  // this key is never taken for this one. Written before the fields, with a release fence
  // between (ShmDevice::AddRegion): a reader that finds it unchanged after reading them read
  // one registration's fields.
  std::atomic<uint64_t> registration;
  uint64_t addr;  // in the owner's address space
  uint64_t length;
  uint32_t pd;            // the protection domain it was registered in (an id unique in its device)
  uint32_t extent_count;  // 1..kMaxMrExtents; their lengths sum to `length`
  MrExtent extents[kMaxMrExtents];
};

// Whether `entry` is live under `key` and grants `access` to all of [addr, addr + length).
inline bool Grants(const MrEntry& entry, uint32_t key, uint64_t addr, uint64_t length,
                   uint32_t access) {
  return key != 0 && entry.key.load(std::memory_order_acquire) == key &&
         (entry.access & access) == access && addr >= entry.addr && length <= entry.length &&
         addr - entry.addr <= entry.length - length;
}

struct RecvEntry {
  uint64_t wr_id;
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

// A cache line: what two cores write must not share one, or every write by one core takes the
// line from the other (false sharing).
inline constexpr size_t kCacheLineBytes = 64;

// Owner posts at tail; senders claim at head with a CAS. Head and tail on separate cache lines:
// a sender's claim does not take the owner's tail line away from it, nor a post the senders'.
// Senders read the tail line only when the receives they know of run out: `tail_seen`, on their
// own line, is a tail some sender read (never more than the tail, maybe less: a sender whose
// head reached it reads the tail again). With the owner reposting after every poll, reading its
// tail line on every message cost a cache miss per message per sender.
//
// A destroyed QP's ring is reused by a later QP of the same depth (ShmDevice::Carve, after a
// quarantine). A sender may have found the old QP just before: the ring names its QP (`owner`,
// written before the counters), and a new life's counters go on past the old one's, so a claim
// begun on the old ring fails its CAS and the retry sees another owner (PopReceive: kGone). An
// old life's tail_seen is below the new life's head: it only makes a sender read the tail.
struct RecvRing {
  alignas(kCacheLineBytes) std::atomic<uint64_t> head;  // written by senders
  std::atomic<uint64_t> tail_seen;                      // ... and refreshed by them from tail
  uint32_t depth;               // written once at creation, next to what the senders read anyway
  std::atomic<uint32_t> owner;  // the QP number it belongs to
  alignas(kCacheLineBytes) std::atomic<uint64_t> tail;  // written by the owner
  alignas(kCacheLineBytes) RecvEntry entries[];         // depth entries follow
};

// One cache line per entry: two producers completing adjacent tickets (two workers answering one
// client) write different lines, and a consumer's poll of one entry does not take a producer's.
struct alignas(kCacheLineBytes) CqEntry {
  // Ticket t's completion is here when sequence == t + 1 (no earlier value of the slot can be:
  // the slot's earlier tickets are t - depth, t - 2 depth, ...). Only producers write an entry;
  // the consumer only reads it, so the line stays shared and a producer's next write to it an
  // invalidation, not a fetch of the line from the consumer's core.
  std::atomic<uint64_t> sequence;
  uint64_t wr_id;
  uint64_t sq_sequence;  // send completions: the WR's send-queue position
  uint32_t byte_len;
  uint32_t imm_data;
  uint32_t qp_num;
  uint32_t src_qp;
  uint8_t status;
  uint8_t opcode;
  uint8_t has_imm;
  uint8_t reserved[5];
};

// Where a peer's rings may lie: in the arena, after the header, aligned for their atomics.
inline constexpr uint64_t kRingAlignment = 64;

// Head (the consumer's, published once per Poll) and tail (the producers') on separate cache
// lines. overflows sits with head: producers write it only when the ring is full, and the
// consumer reads it on every poll without touching the producers' line. Producers read the
// head line only when the ring looks full by `head_seen`, on their own line: a head some producer
// read (never more than the head), so the consumer's once-per-poll store is not a miss per
// completion for every producer.
// Reused like a RecvRing: `id` names the CQ (its QPs' entries name it too, QpEntry::recv_cq_id),
// and a new life's tickets go on past the old one's (an old life's head_seen is below them).
struct CqRing {
  alignas(kCacheLineBytes) std::atomic<uint64_t> head;  // consumer
  std::atomic<uint64_t> overflows;
  alignas(kCacheLineBytes) std::atomic<uint64_t> tail;  // producers reserve tickets
  std::atomic<uint64_t> head_seen;                      // ... and refresh it from head
  uint32_t depth;            // written once at creation; read by producers with tail
  std::atomic<uint32_t> id;  // unique in its device, never 0
  alignas(kCacheLineBytes) CqEntry entries[];
};

// The layouts above, as peers rely on them (kSegmentVersion names this one).
static_assert(offsetof(RecvRing, tail) - offsetof(RecvRing, head) >= kCacheLineBytes);
static_assert(offsetof(RecvRing, owner) < kCacheLineBytes &&
              offsetof(RecvRing, depth) < kCacheLineBytes);
static_assert(sizeof(CqEntry) == kCacheLineBytes);
static_assert(offsetof(RecvRing, entries) - offsetof(RecvRing, tail) >= kCacheLineBytes);
static_assert(offsetof(CqRing, tail) - offsetof(CqRing, head) >= kCacheLineBytes);
static_assert(offsetof(CqRing, tail) - offsetof(CqRing, overflows) >= kCacheLineBytes / 2);
static_assert(offsetof(CqRing, entries) - offsetof(CqRing, tail) >= kCacheLineBytes);
static_assert(alignof(RecvRing) == kCacheLineBytes && alignof(CqRing) == kCacheLineBytes);
static_assert(kRingAlignment % kCacheLineBytes == 0);
// An MR entry is its 40-byte head and the extents, without padding a peer must guess.
static_assert(sizeof(MrExtent) == 24 && offsetof(MrEntry, extents) == 40 &&
              sizeof(MrEntry) == 40 + kMaxMrExtents * sizeof(MrExtent));

struct QpEntry {
  std::atomic<uint32_t> qp_num;  // 0: free
  std::atomic<uint8_t> state;    // QpState
  uint8_t type;                  // QpType
  uint16_t reserved;
  uint32_t qkey;
  uint32_t pd;  // its protection domain: remote accesses through it reach only that PD's regions
  uint64_t recv_ring_offset;  // in the segment
  uint64_t recv_cq_offset;
  std::atomic<uint64_t> dropped;  // inbound messages dropped (written by senders)
  // Send WRs whose queue slots are free again: [QP generation : 12][count : 52], advanced by
  // whichever thread polls the send CQ. It lives in the segment, not in the QP object, so a
  // poller racing the QP's destruction writes into a table entry (and its generation check makes
  // a reused entry ignore it), never into freed memory.
  std::atomic<uint64_t> retired;
  // RC and UC: the one QP this one is connected to (its number, and its device's pid and segment
  // descriptor), written at Connect. A sender whose QP and device are not these is refused, as a
  // NIC refuses packets of another connection: knowing a QP number and an rkey is not enough.
  uint32_t remote_qpn;
  int32_t remote_pid;
  int32_t remote_fd;
  std::atomic<uint32_t> recv_cq_id;  // the CqRing::id at recv_cq_offset
};
inline constexpr int kRetiredCountBits = 52;
inline constexpr uint64_t kRetiredCountMask = (uint64_t{1} << kRetiredCountBits) - 1;

// Written by the owner at creation; a peer reads every field as hostile input (validated when it
// attaches, and every ring offset and depth again at each use, since the owner can change them).
// All zero bytes must be its initial state (every table entry free, every counter 0): a fresh
// segment is never constructed (SegmentMapping::Create), so no member may have a default member
// initializer or a constructor that sets anything else.
struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t fabric_id;
  int32_t pid;
  int32_t fd;
  std::atomic<uint32_t> alive;  // cleared on close: peers fail fast instead of writing on
  uint32_t mtu;
  std::atomic<uint64_t> arena_used;  // the arena's high water (ShmDevice::Carve reuses below it)
  MrEntry mrs[kMaxMrs];
  QpEntry qps[kMaxQps];
};

// The GID of a shm device.
struct ShmAddress {
  uint64_t fabric_id;
  int32_t pid;
  int32_t fd;
};
static_assert(sizeof(ShmAddress) == sizeof(Gid));

}  // namespace transport::shm

#endif  // HERD_TRANSPORT_SHM_SEGMENT_H_
