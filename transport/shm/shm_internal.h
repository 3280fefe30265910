// Internal classes of the shared-memory fabric (not part of the transport interface).
#ifndef HERD_TRANSPORT_SHM_SHM_INTERNAL_H_
#define HERD_TRANSPORT_SHM_SHM_INTERNAL_H_

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"
#include "transport/shm/partition_table.h"
#include "transport/shm/peer_file.h"
#include "transport/shm/segment.h"
#include "util/mutex.h"

namespace transport::shm {

// How long a destroyed QP's or CQ's ring waits before its extent is reused (ShmDevice::Release):
// far longer than a peer takes between finding a ring and writing a completion into it.
inline constexpr std::chrono::nanoseconds kRingQuarantine = std::chrono::seconds(1);

inline int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A mapping of some device's segment: our own, or a peer's through /proc/<pid>/fd/<fd>.
class SegmentMapping {
 public:
  static absl::StatusOr<std::unique_ptr<SegmentMapping>> Create(uint64_t fabric_id, uint32_t mtu);
  // A peer's segment: Open checks the file /proc/<pid>/fd/<fd> names (a memfd, one of
  // `memfds`, sealed and segment-sized) and returns its descriptor, with its stat; Attach maps it
  // (and closes the descriptor) and checks the header names `address`.
  static absl::StatusOr<int> Open(const ShmAddress& address, const MemfdDevices& memfds,
                                  struct stat* st);
  static absl::StatusOr<std::unique_ptr<SegmentMapping>> Attach(const ShmAddress& address, int fd);
  // Whether this (peer) segment's header names `address`.
  bool Names(const ShmAddress& address) const;
  ~SegmentMapping();

  SegmentHeader* header() const { return header_; }
  uint8_t* base() const { return reinterpret_cast<uint8_t*>(header_); }
  template <typename T>
  T* At(uint64_t offset) const {
    return reinterpret_cast<T*>(base() + offset);
  }
  ShmAddress address() const { return {header_->fabric_id, header_->pid, header_->fd}; }

 private:
  SegmentMapping(SegmentHeader* header, int owned_fd) : header_(header), owned_fd_(owned_fd) {}
  SegmentHeader* header_;
  int owned_fd_;  // -1 for a peer's segment
};

// A peer device as one sender sees it: its segment and the regions of it we have mapped. Safe to
// share between threads (an address handle is: several QPs on several threads post with one).
class Peer {
 public:
  // `memfds` and `map_unsealed_regions`: those of the device that maps it (the latter is its
  // DeviceOptions::shm_map_unsealed_regions).
  Peer(std::unique_ptr<SegmentMapping> segment, const MemfdDevices& memfds,
       bool map_unsealed_regions);
  ~Peer();
  SegmentHeader* header() const { return segment_->header(); }
  const SegmentMapping& segment() const { return *segment_; }
  // Our address for [addr, addr + length) of the peer's region `key` if the key is live, the
  // range lies inside it and `access` is granted; nullptr otherwise. The region must belong to
  // protection domain `pd` (the PD of the QP the access arrives on). The first access to a
  // region (and the first after the peer re-registered its index under a new key) maps it: a
  // file open and mmap under map_mutex_ when the peer is another process, once per region; every
  // later access is lock-free.
  uint8_t* Resolve(uint32_t key, uint64_t addr, uint64_t length, uint32_t access, uint32_t pd);
  // A mapping made in place of an earlier one at the same index (the peer re-registered there, or
  // rewrote its entry) is kept with the old one, so a peer that did it without end would make us
  // open and map a file per access and hold a mapping per time (vm.max_map_count is the whole
  // process's): past this many, no more are made for the peer (a Resolve that needs one fails;
  // its first mappings of other indexes, at most kMaxMrs, still are). Far above what herd's own
  // peers do (they re-register once per session or re-attachment).
  static constexpr uint64_t kMaxReplacedMappings = 1024;
  // A region that cannot be mapped (a file that is no sealed memfd, lengths past it, an entry
  // rewritten under the read) is tried again at its next access, each try a few syscalls under
  // map_mutex_: a peer whose regions keep failing would make every access to it cost them. Past
  // this many failed tries nothing more of it is mapped. An honest peer fails one only when it
  // re-registers an index while we map it.
  static constexpr uint64_t kMaxFailedMappings = 1024;
  // Whether region `key` is mapped here now, so that Resolve of it opens and maps nothing (it may
  // still fault on the owner's file). Lock-free; inline: the data path asks it per run.
  bool Mapped(uint32_t key) const {
    const uint32_t index = key >> kMrIndexShift;
    if (index >= kMaxMrs) return false;
    const MrEntry& entry = header()->mrs[index];
    return entry.key.load(std::memory_order_acquire) == key &&
           Current(entry, index, key) != nullptr;
  }

 private:
  friend class PeerTestAccess;  // holds map_mutex_ to stand for a mapping that takes its time
  struct MappedRegion {
    uint32_t key = 0;
    uint64_t registration = 0;  // MrEntry::registration: which of the key's lives this maps
    uint64_t addr = 0;          // the region as its entry said when we mapped it
    uint64_t length = 0;
    uint8_t* local = nullptr;  // where the region's first byte is mapped here
    void* mapping = nullptr;   // for munmap: the mapping, or a multi-extent region's reservation
    size_t mapping_bytes = 0;
  };
  // Our mapping of region `key` (at `index`, whose entry is `entry`) if it maps the registration
  // the entry holds now; nullptr when there is none yet, or it is of an earlier region that had
  // the same key (the key's generation came round) or index.
  const MappedRegion* Current(const MrEntry& entry, uint32_t index, uint32_t key) const {
    const MappedRegion* region = regions_[index].load(std::memory_order_acquire);
    return region != nullptr && region->key == key &&
                   region->registration == entry.registration.load(std::memory_order_relaxed)
               ? region
               : nullptr;
  }
  // The slow path of Resolve: maps region `key` (at `index`) as its entry describes it now, and
  // publishes it; nullptr if it cannot be mapped.
  const MappedRegion* MapRegion(uint32_t index, uint32_t key);
  // Maps region `key` as `entry` describes it now (every field validated); false if it cannot.
  bool Map(MrEntry& entry, uint32_t key, MappedRegion* region);
  // Map's two ways: a region in one extent of a file, or in several laid out contiguously as
  // the owner sees them. `extents` are as read from the entry, their lengths summing to `length`.
  bool MapOneExtent(const MrExtent& extent, MappedRegion* region);
  bool MapExtents(uint64_t addr, uint64_t length, absl::Span<const MrExtent> extents,
                  MappedRegion* region);
  std::unique_ptr<SegmentMapping> segment_;
  const MemfdDevices memfds_;  // where a region's file must live (unless unsealed ones are mapped)
  // Whether a region in a file its owner could shrink is mapped (else refused, as a bad key).
  const bool map_unsealed_regions_;
  // The current mapping of each region index (nullptr: none yet), read without a lock.
  std::unique_ptr<std::atomic<const MappedRegion*>[]> regions_;
  util::Mutex map_mutex_;  // serialises MapRegion: control-path cost, once per region
  // Every mapping ever made, unmapped only when the peer goes: a replaced one may still be in use
  // by another thread's Resolve.
  std::vector<std::unique_ptr<MappedRegion>> mappings_ ABSL_GUARDED_BY(map_mutex_);
  // Mappings made in place of an earlier one at the same index (see kMaxReplacedMappings).
  uint64_t replaced_ ABSL_GUARDED_BY(map_mutex_) = 0;
  // Tries to map that failed (see kMaxFailedMappings).
  uint64_t failed_ ABSL_GUARDED_BY(map_mutex_) = 0;
};

// A UD address handle: its peer is resolved (the segment mapped, or the device's mapping of it
// shared: ShmDevice::PeerAt) when it is created, so an unreachable peer is an error then and the
// data path never opens or maps the segment. The last AH or QP holding a peer unmaps it, so a
// server that drops the AHs and QPs of departed clients keeps no mapping of them.
class ShmAh : public AddressHandle {
 public:
  explicit ShmAh(std::shared_ptr<Peer> peer) : peer_(std::move(peer)) {}
  ~ShmAh() override;
  Peer* peer() const { return peer_.get(); }
  // Asynchronous mode: a posted WR names this AH (PostSend) / has executed or been discarded (the
  // progress thread, or its QP's destruction). Destroying the AH in between CHECK-fails.
  void AddPending() const { pending_.fetch_add(1, std::memory_order_relaxed); }
  void RemovePending() const { pending_.fetch_sub(1, std::memory_order_release); }

 private:
  const std::shared_ptr<Peer> peer_;
  mutable std::atomic<uint64_t> pending_{0};
};

class ShmQp;

class ShmDevice : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<ShmDevice>> Open(const DeviceOptions& options);
  ~ShmDevice() override;
  std::string name() const override { return "shm"; }
  PortInfo port() const override;

  SegmentMapping& segment() { return *segment_; }
  // Carves `bytes` from the segment's arena and returns its offset, and whether it is fresh
  // (zero) memory or an extent of that size given back (Release) at least ring_quarantine ago,
  // which still holds its last ring. Control path.
  struct Extent {
    uint64_t offset = 0;
    bool fresh = true;
  };
  absl::StatusOr<Extent> Carve(uint64_t bytes);
  // Gives back an extent Carve returned, once its ring's owner destroyed it. It is reused only
  // after the quarantine: a peer that found the ring just before may still be pushing into it
  // (a completion's entry is written after its ticket is taken), and a ring knows its owner and
  // moves its counters on (segment.h) but cannot fence a write already past those checks.
  void Release(uint64_t offset, uint64_t bytes);
  // How long a released extent waits (default kRingQuarantine); tests shorten or lengthen it.
  void set_ring_quarantine(std::chrono::nanoseconds quarantine) {
    util::MutexLock lock(&control_mutex_);
    ring_quarantine_ns_ = quarantine.count();
  }
  // A new CQ's id (never 0).
  uint32_t NewCqId() {
    uint32_t id = next_cq_id_.fetch_add(1, std::memory_order_relaxed);
    while (id == 0) id = next_cq_id_.fetch_add(1, std::memory_order_relaxed);
    return id;
  }
  // A new protection domain's id (unique in this device, never 0).
  uint32_t NewPdId() { return next_pd_.fetch_add(1, std::memory_order_relaxed); }
  // Publishes a region made of `extents` (1..kMaxMrExtents, lengths summing to `length`).
  absl::StatusOr<uint32_t> AddRegion(uint32_t pd, uint64_t addr, uint64_t length, uint32_t access,
                                     absl::Span<const Backing> extents);
  void RemoveRegion(uint32_t key);
  absl::StatusOr<QpEntry*> AddQp(ShmQp* qp, QpType type, uint32_t pd);
  void RemoveQp(QpEntry* entry);
  const FaultOptions& faults() const { return faults_; }
  // Whether FaultOptions::partition_file cuts this device's process off from `peer`'s.
  bool CutFrom(const Peer& peer) const {
    return partitions_ != nullptr &&
           partitions_->IsCut(segment_->header()->pid, peer.header()->pid);
  }
  // Asynchronous mode (DeviceOptions::shm_async, or an injected delay): a progress thread runs
  // the QPs' pending send WRs.
  bool async() const { return async_; }
  // Synchronous mode: a QP queued WRs for the progress thread (an RC WR met a receiver not
  // ready); wakes the thread if it waits for work. Not the data path: a QP calls it only while
  // it has WRs waiting out an RNR timer.
  void WakeProgress();
  // The peer device at `address` (of this fabric), mapped once for all of this device's QPs and
  // address handles that talk to it: each used to map the peer's segment (and every region of it
  // it reached) on its own, several times per session, and unmapping them was most of a
  // departure's cost. A peer is known by its segment file (device and inode), not by the pid and
  // descriptor number in its address, which a later process can reuse; it is unmapped when the
  // last QP or address handle holding it goes. Control path.
  absl::StatusOr<std::shared_ptr<Peer>> PeerAt(const ShmAddress& address);

 protected:
  absl::StatusOr<std::unique_ptr<ProtectionDomain>> DoAllocatePd() override;
  absl::StatusOr<std::unique_ptr<CompletionQueue>> DoCreateCq(uint32_t depth) override;

 private:
  ShmDevice(std::unique_ptr<SegmentMapping> segment, const FaultOptions& faults, bool async,
            bool map_unsealed_regions)
      : segment_(std::move(segment)),
        faults_(faults),
        async_(async),
        memfds_(MemfdDevices::Probe()),
        map_unsealed_regions_(map_unsealed_regions) {}
  // The progress thread's loop: every QP's due WRs, then a short sleep when none ran.
  void RunProgress();
  std::unique_ptr<SegmentMapping> segment_;
  const FaultOptions faults_;
  std::unique_ptr<PartitionTable> partitions_;  // FaultOptions::partition_file, or null
  const bool async_;
  const MemfdDevices memfds_;        // the devices memfds live on here (peer_file.h)
  const bool map_unsealed_regions_;  // DeviceOptions::shm_map_unsealed_regions
  // Started with the device in both modes. Synchronous mode: while no QP has WRs queued it
  // waits (without a timeout) for the next WakeProgress.
  std::thread progress_thread_ ABSL_GUARDED_BY(progress_mutex_);
  std::atomic<bool> stop_progress_{false};
  util::Mutex progress_mutex_;
  bool progress_wanted_ ABSL_GUARDED_BY(progress_mutex_) = false;
  util::CondVar progress_wake_;  // WakeProgress and the destructor signal it
  // The QP the progress thread is working on (a hazard pointer): RemoveQp waits until it is not
  // the QP being removed, so a QP is never destroyed under the progress thread.
  std::atomic<ShmQp*> progressing_{nullptr};
  // One past the highest QP table index ever used: the progress thread scans no further.
  std::atomic<uint32_t> qp_high_water_{0};
  std::atomic<uint32_t> next_pd_{1};
  util::Mutex control_mutex_;  // control path only: table slots and the arena
  uint32_t next_generation_ ABSL_GUARDED_BY(control_mutex_) = 1;
  uint64_t next_registration_ ABSL_GUARDED_BY(control_mutex_) = 1;  // MrEntry::registration
  std::atomic<uint32_t> next_cq_id_{1};
  // Released extents: waiting out the quarantine (oldest first), and reusable, by size.
  struct Released {
    uint64_t offset;
    uint64_t bytes;
    int64_t release_ns;
  };
  std::deque<Released> quarantined_ ABSL_GUARDED_BY(control_mutex_);
  // PeerAt's peers by segment file (st_dev, st_ino); expired entries are swept as peers come.
  util::Mutex peers_mutex_;
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::weak_ptr<Peer>> peers_
      ABSL_GUARDED_BY(peers_mutex_);
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> reusable_ ABSL_GUARDED_BY(control_mutex_);
  int64_t ring_quarantine_ns_ ABSL_GUARDED_BY(control_mutex_) = kRingQuarantine.count();
  std::atomic<ShmQp*> qps_[kMaxQps] = {};
};

class ShmCq : public CompletionQueue {
 public:
  ShmCq(ShmDevice* device, uint64_t offset, uint32_t depth, uint32_t id)
      : device_(device),
        offset_(offset),
        ring_(device->segment().At<CqRing>(offset)),
        depth_(depth),
        id_(id) {}
  ~ShmCq() override {
    CheckNoLiveQps();
    LeaveCounterRegistry();
    device_->Release(offset_, RingBytes(depth_));
  }
  // The bytes of a ring of `depth` entries.
  static uint64_t RingBytes(uint32_t depth) {
    return sizeof(CqRing) + uint64_t{depth} * sizeof(CqEntry);
  }
  size_t Poll(absl::Span<Completion> out) override;
  uint64_t offset() const { return offset_; }
  uint32_t depth() const { return depth_; }
  uint32_t id() const { return id_; }
  ShmDevice* device() const { return device_; }

 private:
  void SyncCounters() const override;
  // Poll found that producers counted new overruns: count them and log (rate-limited).
  void ReportOverruns(uint64_t overflows);
  ShmDevice* device_;
  uint64_t offset_;
  CqRing* ring_;
  uint32_t depth_;  // ours, not the ring's copy (which peers can write)
  uint32_t id_;
  uint64_t reported_overflows_ = 0;  // Poll's view of ring_->overflows
  int64_t last_overrun_log_ns_ = 0;
};

// Pushes one completion into a ring of `depth` entries that must be CQ `id` (any process); false
// when the ring is full (an overrun, counted in the ring) or is another CQ's now (reused: the
// completion is lost with the CQ it was meant for). `depth` is the one the caller validated
// (ValidRing), never re-read from the ring: its owner may change it.
bool PushCompletion(CqRing* ring, uint32_t depth, uint32_t id, const Completion& completion,
                    uint64_t sq_sequence);
// PushCompletion in two steps: reserve the ticket (false as PushCompletion), then publish it.
// Every reserved ticket must be published, soon: the consumer takes completions in ticket
// order and waits at an unpublished one. A sender reserves before it copies a message's bytes
// (ShmQp::Deliver): the reservation's locked CAS waits for every earlier store to drain, so
// placed after the copy it stalled on the payload's cache misses in the receiver's memory.
bool ReserveCompletion(CqRing* ring, uint32_t depth, uint32_t id, uint64_t* ticket);
// Up to `n` consecutive tickets with one CAS (a run of messages to one receiver: one locked
// instruction per run, not per message); returns how many (0..n), the first in *first. Fewer
// than n when the ring has no room for all (the rest are overruns, counted in the ring) or is
// another CQ's now (0).
uint32_t ReserveCompletions(CqRing* ring, uint32_t depth, uint32_t id, uint32_t n, uint64_t* first);
void PublishCompletion(CqRing* ring, uint32_t depth, uint64_t ticket, const Completion& completion,
                       uint64_t sq_sequence);
enum class Pop { kTaken, kEmpty, kTooSmall, kGone };
// Takes one posted receive from a ring of `depth` (validated) entries that must belong to QP
// `owner`: kEmpty when none is posted, kTooSmall when the one at the head is shorter than
// `min_length` (left posted), kGone when the ring belongs to another QP now (reused).
Pop PopReceive(RecvRing* ring, uint32_t depth, uint32_t owner, RecvEntry* out,
               uint64_t min_length = 0);
// Up to `n` consecutive receives with one CAS, out[i] at least min_lengths[i] long; returns how
// many were taken (0..n) and in *stop why not n (kTaken when all were): kEmpty (no more posted),
// kTooSmall (the next is shorter than its message: left posted), kGone (as PopReceive).
uint32_t PopReceives(RecvRing* ring, uint32_t depth, uint32_t owner, const uint64_t* min_lengths,
                     uint32_t n, RecvEntry* out, Pop* stop);
// How far a reused ring's counters start past its last life's (any gap > 0 fences a stale CAS;
// a full lap keeps the entry indices' old contents out of reach of a stale reader too).
inline uint64_t NextLifeStart(uint64_t head, uint64_t tail, uint32_t depth) {
  return std::max(head, tail) + depth + 1;
}

// The ring of type Ring (RecvRing, CqRing) at `offset` of a mapped segment, with its depth read
// once into *depth, or nullptr when its header or its entries would not lie inside the segment's
// arena, it is misaligned, or its depth is 0: what a hostile or corrupt peer segment says.
template <typename Ring, typename Entry>
Ring* ValidRing(const SegmentMapping& segment, uint64_t offset, uint32_t* depth) {
  constexpr uint64_t kArenaStart = sizeof(SegmentHeader);
  if (offset < kArenaStart || offset % kRingAlignment != 0 ||
      offset > kSegmentBytes - sizeof(Ring)) {
    return nullptr;
  }
  Ring* ring = segment.At<Ring>(offset);
  const uint32_t d = std::atomic_ref<uint32_t>(ring->depth).load(std::memory_order_relaxed);
  if (d == 0 || uint64_t{d} * sizeof(Entry) > kSegmentBytes - sizeof(Ring) - offset) return nullptr;
  *depth = d;
  return ring;
}

}  // namespace transport::shm

#endif  // HERD_TRANSPORT_SHM_SHM_INTERNAL_H_
