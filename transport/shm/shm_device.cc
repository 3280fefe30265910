// The shared-memory fabric's control path: segments, peers, devices, PDs, regions, CQs, AHs.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "transport/shared_memory.h"
#include "transport/shm/shm_internal.h"
#include "transport/shm/shm_qp.h"
#include "util/errno_status.h"
#include "util/round_up.h"

namespace transport::shm {
namespace {

absl::Status Errno(std::string_view what) {
  return util::ErrnoStatus(absl::StatusCode::kUnavailable, what);
}

using util::RoundUp;

uint64_t FabricId(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a: stable across processes and builds
  for (const char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  return h;
}

}  // namespace

// ---------------------------------------------------------------------------- segments
absl::StatusOr<std::unique_ptr<SegmentMapping>> SegmentMapping::Create(uint64_t fabric_id,
                                                                       uint32_t mtu) {
  const int fd = memfd_create("herd-shm-fabric", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, kSegmentBytes) != 0) {
    close(fd);
    return Errno("ftruncate");
  }
  // Sealed at its size: a peer that maps it can rely on every page existing (a shrunk file would
  // SIGBUS the peer); peers refuse an unsealed segment.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    close(fd);
    return Errno("seal segment");
  }
  void* base = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    close(fd);
    return Errno("mmap segment");
  }
  // A fresh memfd reads as zeros, and zeros are the value-initialised header (every table entry
  // free, every counter 0): constructing it would write all of its ~770 KB, faulting in and
  // allocating pages that most devices never use (it was most of a client's join).
  static_assert(std::is_trivially_destructible_v<SegmentHeader>);
  auto* header = static_cast<SegmentHeader*>(base);
  header->magic = kSegmentMagic;
  header->version = kSegmentVersion;
  header->fabric_id = fabric_id;
  header->pid = getpid();
  header->fd = fd;
  header->mtu = mtu;
  header->arena_used.store(RoundUp(sizeof(SegmentHeader), kRingAlignment));
  header->alive.store(1, std::memory_order_release);
  return std::unique_ptr<SegmentMapping>(new SegmentMapping(header, fd));
}

namespace {

// Whether the file under `fd` is sealed against shrinking (only a memfd can be): a mapping of
// it cannot SIGBUS its holder by losing pages off the file's end.
bool SealedAgainstShrinking(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
}

absl::Status NotADevice(const ShmAddress& address, std::string_view why) {
  return absl::FailedPreconditionError(
      absl::StrFormat("pid %d fd %d is not a shm device of this fabric (%s; stale address?)",
                      address.pid, address.fd, why));
}

}  // namespace

absl::StatusOr<int> SegmentMapping::Open(const ShmAddress& address, const MemfdDevices& memfds,
                                         struct stat* st) {
  // Whatever the GID names is the peer's input: a memfd (ours are), opened without running any
  // other file system's open (peer_file.h).
  absl::StatusOr<int> opened = OpenPeerFile(address.pid, address.fd, memfds, false);
  if (!opened.ok()) {
    if (opened.status().code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(absl::StrFormat("shm peer (pid %d) is unreachable: %s",
                                                    address.pid, opened.status().message()));
    }
    return NotADevice(address, std::string(opened.status().message()));
  }
  const int fd = *opened;
  // Sealed against shrinking first, then sized: once sealed, its size can no longer drop under
  // a mapping (a file of the wrong size, or one that could shrink, would SIGBUS us on first
  // touch).
  if (!SealedAgainstShrinking(fd)) {
    close(fd);
    return NotADevice(address, "not sealed against shrinking");
  }
  if (fstat(fd, st) != 0 || static_cast<uint64_t>(st->st_size) != kSegmentBytes) {
    close(fd);
    return NotADevice(address, "not a segment-sized file");
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<SegmentMapping>> SegmentMapping::Attach(const ShmAddress& address,
                                                                       int fd) {
  void* base = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the file alive
  if (base == MAP_FAILED) return Errno("mmap peer segment");
  std::unique_ptr<SegmentMapping> segment(
      new SegmentMapping(static_cast<SegmentHeader*>(base), -1));
  if (!segment->Names(address)) return NotADevice(address, "wrong magic, version or identity");
  return segment;
}

bool SegmentMapping::Names(const ShmAddress& address) const {
  return header_->magic == kSegmentMagic && header_->version == kSegmentVersion &&
         header_->fabric_id == address.fabric_id && header_->pid == address.pid &&
         header_->fd == address.fd;
}

SegmentMapping::~SegmentMapping() {
  if (owned_fd_ >= 0) {
    header_->alive.store(0, std::memory_order_release);
    close(owned_fd_);
  }
  munmap(header_, kSegmentBytes);
}

// --------------------------------------------------------------------------------- peers
Peer::Peer(std::unique_ptr<SegmentMapping> segment, const MemfdDevices& memfds,
           bool map_unsealed_regions)
    : segment_(std::move(segment)),
      memfds_(memfds),
      map_unsealed_regions_(map_unsealed_regions),
      regions_(new std::atomic<const MappedRegion*>[kMaxMrs]) {
  for (uint32_t i = 0; i < kMaxMrs; ++i) regions_[i].store(nullptr, std::memory_order_relaxed);
}

Peer::~Peer() {
  util::MutexLock lock(&map_mutex_);
  for (const std::unique_ptr<MappedRegion>& region : mappings_) {
    if (region->mapping != nullptr) munmap(region->mapping, region->mapping_bytes);
  }
}

uint8_t* Peer::Resolve(uint32_t key, uint64_t addr, uint64_t length, uint32_t access, uint32_t pd) {
  const uint32_t index = key >> kMrIndexShift;
  if (index >= kMaxMrs) return nullptr;
  MrEntry& entry = header()->mrs[index];
  if (key == 0 || entry.key.load(std::memory_order_acquire) != key) return nullptr;
  const MappedRegion* region = Current(entry, index, key);
  if (region == nullptr) region = MapRegion(index, key);
  if (region == nullptr) return nullptr;
  // The range is checked against what was mapped (the entry as it was then): the peer may
  // rewrite its entry at any time, but never widens what we touch.
  const uint32_t granted = std::atomic_ref<uint32_t>(entry.access).load(std::memory_order_relaxed);
  // Checked at every access, as a NIC checks the MR's PD against the QP's.
  if (std::atomic_ref<uint32_t>(entry.pd).load(std::memory_order_relaxed) != pd) return nullptr;
  if ((granted & access) != access || addr < region->addr || length > region->length ||
      addr - region->addr > region->length - length) {
    return nullptr;
  }
  return region->local + (addr - region->addr);
}

const Peer::MappedRegion* Peer::MapRegion(uint32_t index, uint32_t key) {
  util::MutexLock lock(&map_mutex_);
  // Another thread may have mapped it while we waited.
  if (const MappedRegion* current = Current(header()->mrs[index], index, key)) return current;
  const bool replaces = regions_[index].load(std::memory_order_relaxed) != nullptr;
  if (replaces && replaced_ >= kMaxReplacedMappings) {
    if (replaced_++ == kMaxReplacedMappings) {
      LOG(ERROR) << "shm: peer pid " << header()->pid << " replaced its regions "
                 << kMaxReplacedMappings
                 << " times under this device's mappings; no more are mapped (its receives "
                    "and regions that need one fail)";
    }
    return nullptr;
  }
  if (failed_ >= kMaxFailedMappings) return nullptr;
  auto region = std::make_unique<MappedRegion>();
  if (!Map(header()->mrs[index], key, region.get())) {
    if (++failed_ == kMaxFailedMappings) {
      LOG(ERROR) << "shm: " << kMaxFailedMappings << " of peer pid " << header()->pid
                 << "'s regions could not be mapped; no more are tried (its receives and "
                    "regions that need a mapping fail)";
    }
    return nullptr;
  }
  if (replaces) ++replaced_;
  const MappedRegion* published = region.get();
  mappings_.push_back(std::move(region));
  regions_[index].store(published, std::memory_order_release);
  return published;
}

namespace {

// The largest page a backing file may have: x86-64's 1 GiB hugepage. A file that claims a larger
// one is no memory a region could be laid out in; the cap also bounds the reservation's slack.
constexpr uint64_t kMaxFilePageBytes = uint64_t{1} << 30;

// One of the owner's files, opened through /proc/<pid>/fd (peer_file.h), and its page size;
// closed when this goes.
class OwnerFile {
 public:
  OwnerFile() = default;
  OwnerFile(const OwnerFile&) = delete;
  OwnerFile& operator=(const OwnerFile&) = delete;
  ~OwnerFile() {
    if (fd_ >= 0) close(fd_);
  }

  // False unless the file is a memfd sealed against shrinking (or, with `unsealed_too`, any
  // regular file) at least `end` bytes long. Its owner could truncate any other under our
  // mapping, and our next touch past the new end would SIGBUS us; a mapping past its end would
  // too. The seal is checked before the size: a file sealed after we read its size could have
  // shrunk in between.
  bool Open(int32_t pid, int32_t owner_fd, uint64_t end, const MemfdDevices& memfds,
            bool unsealed_too) {
    absl::StatusOr<int> opened = OpenPeerFile(pid, owner_fd, memfds, unsealed_too);
    if (!opened.ok()) return false;
    fd_ = *opened;
    if (!unsealed_too && !SealedAgainstShrinking(fd_)) return false;
    struct stat st;
    if (fstat(fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) < end) return false;
    // Mappings start and end on the file's page boundaries: 2 MiB ones for hugetlb memory
    // (st_blksize is the file's page size there, and the base page size elsewhere).
    page_ = st.st_blksize > 0 ? static_cast<uint64_t>(st.st_blksize)
                              : static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    return true;
  }
  int fd() const { return fd_; }
  uint64_t page() const { return page_; }

 private:
  int fd_ = -1;
  uint64_t page_ = 0;
};

// Reads extent `in` of an entry once (the peer may be rewriting it) into `out`; false when it is
// empty or ends past the largest file offset.
bool ReadExtent(MrExtent& in, MrExtent* out) {
  out->fd = std::atomic_ref<int32_t>(in.fd).load(std::memory_order_relaxed);
  out->file_offset = std::atomic_ref<uint64_t>(in.file_offset).load(std::memory_order_relaxed);
  out->length = std::atomic_ref<uint64_t>(in.length).load(std::memory_order_relaxed);
  return out->length != 0 && out->file_offset + out->length >= out->file_offset;
}

// Whether `extent`, at `offset` in a region the owner has at `addr`, can take its place in a
// contiguous mapping: it begins and ends on page boundaries of its file, both in the file and in
// the region's virtual range, except where the region itself begins (at the same place in a page
// of the file as of memory) or ends. Every region the owner really mapped passes.
bool FitsPages(uint64_t addr, uint64_t offset, const MrExtent& extent, uint64_t page, bool first,
               bool last) {
  const uint64_t at = addr + offset;  // addr + the region's length does not overflow
  if (first ? at % page != extent.file_offset % page
            : at % page != 0 || extent.file_offset % page != 0) {
    return false;
  }
  return last || (at + extent.length) % page == 0;
}

}  // namespace

bool Peer::Map(MrEntry& entry, uint32_t key, MappedRegion* region) {
  const uint64_t registration = entry.registration.load(std::memory_order_acquire);
  // One read of each field: the peer may be rewriting them.
  const uint64_t addr = std::atomic_ref<uint64_t>(entry.addr).load(std::memory_order_relaxed);
  const uint64_t length = std::atomic_ref<uint64_t>(entry.length).load(std::memory_order_relaxed);
  const uint32_t count =
      std::atomic_ref<uint32_t>(entry.extent_count).load(std::memory_order_relaxed);
  if (length == 0 || addr + length < addr || count == 0 || count > kMaxMrExtents) return false;
  MrExtent extents[kMaxMrExtents];
  uint64_t sum = 0;  // <= length, so it cannot overflow
  for (uint32_t i = 0; i < count; ++i) {
    if (!ReadExtent(entry.extents[i], &extents[i]) || extents[i].length > length - sum) {
      return false;
    }
    sum += extents[i].length;
  }
  if (sum != length) return false;
  // The fields read are one registration's, the one `key` names, only if the entry still holds
  // both (the owner stores the registration, then the fields, then the key; AddRegion).
  std::atomic_thread_fence(std::memory_order_acquire);
  if (entry.registration.load(std::memory_order_relaxed) != registration ||
      entry.key.load(std::memory_order_relaxed) != key) {
    return false;
  }
  // Our own mapping of the owner's files, in the same process too: the owner may unmap its
  // memory (deregister and free) while a WR we already resolved still writes, as a NIC's DMA may
  // outlive the application's view; a file lives as long as any mapping of it does.
  const bool mapped = count == 1 ? MapOneExtent(extents[0], region)
                                 : MapExtents(addr, length, absl::MakeSpan(extents, count), region);
  if (!mapped) return false;
  region->key = key;
  region->registration = registration;
  region->addr = addr;
  region->length = length;
  return true;
}

bool Peer::MapOneExtent(const MrExtent& extent, MappedRegion* region) {
  OwnerFile file;
  if (!file.Open(header()->pid, extent.fd, extent.file_offset + extent.length, memfds_,
                 map_unsealed_regions_)) {
    return false;
  }
  const uint64_t page = file.page();
  const uint64_t start = extent.file_offset / page * page;
  const uint64_t bytes = RoundUp(extent.file_offset + extent.length - start, page);
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd(),
                       static_cast<off_t>(start));
  if (mapping == MAP_FAILED) return false;
  region->mapping = mapping;
  region->mapping_bytes = bytes;
  region->local = static_cast<uint8_t*>(mapping) + (extent.file_offset - start);
  return true;
}

bool Peer::MapExtents(uint64_t addr, uint64_t length, absl::Span<const MrExtent> extents,
                      MappedRegion* region) {
  // Keeps the reservation's size below (the length plus under three largest pages) in 64 bits;
  // mmap would refuse anything near it anyway.
  if (length > UINT64_MAX - 3 * kMaxFilePageBytes) return false;
  OwnerFile files[kMaxMrExtents];
  uint64_t largest_page = 0;
  uint64_t offset = 0;  // of extent i in the region
  for (size_t i = 0; i < extents.size(); ++i) {
    const MrExtent& extent = extents[i];
    if (!files[i].Open(header()->pid, extent.fd, extent.file_offset + extent.length, memfds_,
                       map_unsealed_regions_)) {
      return false;
    }
    const uint64_t page = files[i].page();
    if ((page & (page - 1)) != 0 || page > kMaxFilePageBytes ||
        !FitsPages(addr, offset, extent, page, i == 0, i + 1 == extents.size())) {
      return false;
    }
    largest_page = std::max(largest_page, page);
    offset += extent.length;
  }
  // Reserve the whole range, then map each extent over its place. The region starts at the same
  // place within a largest page as the owner's, so every extent lands on a page boundary of its
  // file as it does there; one more largest page of slack lets the reservation be aligned.
  const uint64_t lead = addr % largest_page;
  const uint64_t reserved = RoundUp(lead + length, largest_page) + largest_page;
  void* reservation =
      mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reservation == MAP_FAILED) return false;
  uint8_t* local =
      reinterpret_cast<uint8_t*>(RoundUp(reinterpret_cast<uintptr_t>(reservation), largest_page)) +
      lead;
  offset = 0;
  for (size_t i = 0; i < extents.size(); ++i) {
    const MrExtent& extent = extents[i];
    const uint64_t page = files[i].page();
    const uint64_t skip = extent.file_offset % page;  // only the first extent's may be non-zero
    if (mmap(local + offset - skip, RoundUp(skip + extent.length, page), PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_FIXED, files[i].fd(),
             static_cast<off_t>(extent.file_offset - skip)) == MAP_FAILED) {
      munmap(reservation, reserved);
      return false;
    }
    offset += extent.length;
  }
  region->mapping = reservation;
  region->mapping_bytes = reserved;
  region->local = local;
  return true;
}

// ----------------------------------------------------------------------------- rings
bool PushCompletion(CqRing* ring, uint32_t depth, uint32_t id, const Completion& c,
                    uint64_t sq_sequence) {
  uint64_t ticket = 0;
  if (!ReserveCompletion(ring, depth, id, &ticket)) return false;
  PublishCompletion(ring, depth, ticket, c, sq_sequence);
  return true;
}

bool ReserveCompletion(CqRing* ring, uint32_t depth, uint32_t id, uint64_t* reserved) {
  return ReserveCompletions(ring, depth, id, 1, reserved) == 1;
}

uint32_t ReserveCompletions(CqRing* ring, uint32_t depth, uint32_t id, uint32_t n,
                            uint64_t* first) {
  uint64_t ticket = ring->tail.load(std::memory_order_acquire);
  // A head no greater than the consumer's (acquired from head by whoever stored it): enough to
  // know a slot is free whenever the ring is not near full. Only a ring that looks full by it
  // costs a read of the consumer's line.
  uint64_t head = ring->head_seen.load(std::memory_order_acquire);
  bool head_fresh = false;
  while (true) {
    // After the tail it read (a reused ring's id is written before its tickets move on): a
    // ticket of the new life is never taken for the CQ that was destroyed.
    if (ring->id.load(std::memory_order_acquire) != id) return 0;
    if (ticket < head) {
      // The tail we hold is stale: other producers pushed past it and the consumer caught up
      // meanwhile. A tail read after this head is at least this head (head <= tail always).
      ticket = ring->tail.load(std::memory_order_acquire);
      if (ticket < head) {  // only a corrupt ring (a hostile peer) does this: refuse, counted
        ring->overflows.fetch_add(n, std::memory_order_relaxed);
        return 0;
      }
    }
    const uint64_t used = ticket - head;
    if (used + n > depth && !head_fresh) {  // short of room by the head seen: look at the real one
      head = ring->head.load(std::memory_order_acquire);
      ring->head_seen.store(head, std::memory_order_release);
      head_fresh = true;
      continue;
    }
    const uint32_t room =
        used >= depth ? 0 : static_cast<uint32_t>(std::min<uint64_t>(n, depth - used));
    if (room == 0) {
      ring->overflows.fetch_add(n, std::memory_order_relaxed);  // really full at that head
      return 0;
    }
    if (ring->tail.compare_exchange_weak(ticket, ticket + room, std::memory_order_acq_rel)) {
      if (room < n) ring->overflows.fetch_add(n - room, std::memory_order_relaxed);
      *first = ticket;
      return room;
    }
    head_fresh = false;  // another producer moved on: a full-looking ring is looked at again
  }
}

void PublishCompletion(CqRing* ring, uint32_t depth, uint64_t ticket, const Completion& c,
                       uint64_t sq_sequence) {
  CqEntry& e = ring->entries[ticket % depth];
  e.wr_id = c.wr_id;
  e.sq_sequence = sq_sequence;
  e.byte_len = c.byte_len;
  e.imm_data = c.imm_data;
  e.qp_num = c.qp_num;
  e.src_qp = c.src_qp;
  e.status = static_cast<uint8_t>(c.status);
  e.opcode = static_cast<uint8_t>(c.opcode);
  e.has_imm = c.has_imm;
  e.sequence.store(ticket + 1, std::memory_order_release);
}

Pop PopReceive(RecvRing* ring, uint32_t depth, uint32_t owner, RecvEntry* out,
               uint64_t min_length) {
  Pop stop = Pop::kEmpty;
  PopReceives(ring, depth, owner, &min_length, 1, out, &stop);
  return stop;
}

uint32_t PopReceives(RecvRing* ring, uint32_t depth, uint32_t owner, const uint64_t* min_lengths,
                     uint32_t n, RecvEntry* out, Pop* stop) {
  uint64_t head = ring->head.load(std::memory_order_acquire);
  while (true) {
    // After the head it read: a reused ring's owner is written before its counters move on, so
    // a head of the new life comes with the new owner here, and a claim on an old head fails.
    if (ring->owner.load(std::memory_order_acquire) != owner) {
      *stop = Pop::kGone;
      return 0;
    }
    // ">=", not "==": a slow sender may store an older tail over a newer one (tail_seen only
    // ever errs low), and an old life's is below every head of this one.
    uint64_t tail = ring->tail_seen.load(std::memory_order_acquire);
    if (head + n > tail) {  // fewer known than wanted: look at the owner's tail
      tail = ring->tail.load(std::memory_order_acquire);
      ring->tail_seen.store(tail, std::memory_order_release);
    }
    if (head >= tail) {
      *stop = Pop::kEmpty;
      return 0;
    }
    uint32_t taken = static_cast<uint32_t>(std::min<uint64_t>(n, tail - head));
    *stop = taken < n ? Pop::kEmpty : Pop::kTaken;
    for (uint32_t i = 0; i < taken; ++i) {
      out[i] = ring->entries[(head + i) % depth];
      if (out[i].length < min_lengths[i]) {
        taken = i;
        *stop = Pop::kTooSmall;
        break;
      }
    }
    if (taken == 0) return 0;
    if (ring->head.compare_exchange_weak(head, head + taken, std::memory_order_acq_rel)) {
      return taken;
    }
  }
}

namespace {

// A signalled send completion up to `sq_sequence` was polled: the queue slots of QP `qp_num` up
// to it are free. Ignored when the table entry now belongs to another QP (another generation).
void RetireSends(QpEntry* qps, uint32_t qp_num, uint64_t sq_sequence) {
  QpEntry& entry = qps[qp_num & ((1u << kQpIndexBits) - 1)];
  const uint64_t generation = qp_num >> kQpIndexBits;
  uint64_t word = entry.retired.load(std::memory_order_acquire);
  while ((word >> kRetiredCountBits) == generation && (word & kRetiredCountMask) < sq_sequence) {
    if (entry.retired.compare_exchange_weak(word, (generation << kRetiredCountBits) | sq_sequence,
                                            std::memory_order_acq_rel)) {
      return;
    }
  }
}

}  // namespace

void ShmCq::SyncCounters() const {
  counters_.overruns.RaiseTo(ring_->overflows.load(std::memory_order_relaxed));
}

void ShmCq::ReportOverruns(uint64_t overflows) {
  // At most one line per CQ per this interval: an overrunning CQ overruns at line rate.
  constexpr int64_t kOverrunLogIntervalNs = 1'000'000'000;
  const uint64_t lost = overflows - reported_overflows_;
  reported_overflows_ = overflows;
  counters_.overruns.RaiseTo(overflows);
  const int64_t now = SteadyNanos();
  if (last_overrun_log_ns_ != 0 && now - last_overrun_log_ns_ < kOverrunLogIntervalNs) return;
  last_overrun_log_ns_ = now;
  LOG(ERROR) << "shm CQ overrun: " << lost << " completion(s) lost since the last report ("
             << overflows << " in all; depth " << depth_
             << "): poll it more often or make it deeper";
}

size_t ShmCq::Poll(absl::Span<Completion> out) {
  counters_.polls.Add();
  // On the same cache line as head (see CqRing): free to watch on every poll.
  if (const uint64_t overflows = ring_->overflows.load(std::memory_order_relaxed);
      overflows != reported_overflows_) {
    ReportOverruns(overflows);
  }
  size_t n = 0;
  uint64_t head = ring_->head.load(std::memory_order_relaxed);
  for (; n < out.size(); ++n, ++head) {
    CqEntry& e = ring_->entries[head % depth_];
    if (e.sequence.load(std::memory_order_acquire) != head + 1) break;
    Completion& c = out[n];
    c.wr_id = e.wr_id;
    c.byte_len = e.byte_len;
    c.imm_data = e.imm_data;
    c.qp_num = e.qp_num;
    c.src_qp = e.src_qp;
    c.status = static_cast<CompletionStatus>(e.status);
    c.opcode = static_cast<CompletionOpcode>(e.opcode);
    c.has_imm = e.has_imm != 0;
    const uint64_t sq_sequence = e.sq_sequence;
    // Nothing is written back to the entry (see CqEntry::sequence): room is the head's business.
    if (sq_sequence != 0) {
      RetireSends(device_->segment().header()->qps, c.qp_num, sq_sequence);
    }
  }
  // Once per Poll, not per completion: every store takes the line from the producers, who read
  // head to see room. Publishing late only makes the room visible a little later.
  if (n > 0) ring_->head.store(head, std::memory_order_release);
  if (n == 0) counters_.empty_polls.Add();
  counters_.completions.Add(n);
  return n;
}

// ------------------------------------------------------------------------- PD, MR, AH
namespace {

// The registration's own descriptors of its files, duplicated from those FindBackings found and
// checked to be of the mapped files: the entry's extents name these, so a peer can open them for
// as long as the region is registered, whatever the application (or another thread opening the
// file for a moment: a same-process peer mapping it) does with its own descriptors. Each try
// that finds a descriptor closed or reused before it was duplicated looks again; after this many
// the registration fails.
constexpr int kMaxHoldTries = 8;

absl::StatusOr<std::vector<Backing>> HoldBackings(void* addr, size_t length) {
  for (int attempt = 0; attempt < kMaxHoldTries; ++attempt) {
    absl::StatusOr<std::vector<Backing>> found = FindBackings(addr, length);
    if (!found.ok()) return found.status();
    size_t held = 0;
    for (; held < found->size(); ++held) {
      Backing& backing = (*found)[held];
      // The raw system call, as FindBackings' own probes: the descriptor may be another thread's
      // of the moment, closing right now, and ThreadSanitizer would take fcntl(3) on it for a
      // use racing with that close (a dup of a closed or reused one is caught just below).
      const auto dup = static_cast<int>(syscall(SYS_fcntl, backing.fd, F_DUPFD_CLOEXEC, 0));
      struct stat st;
      if (dup >= 0 && fstat(dup, &st) == 0 && st.st_dev == backing.device &&
          st.st_ino == backing.inode) {
        backing.fd = dup;
        continue;
      }
      if (dup >= 0) close(dup);
      break;
    }
    if (held == found->size()) return found;
    for (size_t i = 0; i < held; ++i) close((*found)[i].fd);
  }
  return absl::UnavailableError(absl::StrFormat(
      "memory at %p (+%d bytes): its file's descriptors kept closing before one could be held",
      addr, length));
}

class ShmMr : public MemoryRegion {
 public:
  ShmMr(ShmDevice* device, void* addr, size_t length, uint32_t key, uint32_t access,
        std::vector<int> fds)
      : MemoryRegion(addr, length, key, key, access), device_(device), fds_(std::move(fds)) {}
  ~ShmMr() override {
    device_->RemoveRegion(lkey());
    for (const int fd : fds_) close(fd);
  }

 private:
  ShmDevice* device_;
  const std::vector<int> fds_;  // HoldBackings' descriptors, which the entry's extents name
};

class ShmPd : public ProtectionDomain {
 public:
  explicit ShmPd(ShmDevice* device) : device_(device), id_(device->NewPdId()) {}
  ~ShmPd() override { CheckNoChildren(); }

 protected:
  absl::StatusOr<std::unique_ptr<MemoryRegion>> DoRegisterMemory(void* addr, size_t length,
                                                                 uint32_t access) override {
    if (length == 0) return absl::InvalidArgumentError("cannot register 0 bytes");
    absl::StatusOr<std::vector<Backing>> extents = HoldBackings(addr, length);
    if (!extents.ok()) return extents.status();
    std::vector<int> fds;
    for (const Backing& backing : *extents) fds.push_back(backing.fd);
    absl::StatusOr<uint32_t> key =
        device_->AddRegion(id_, reinterpret_cast<uint64_t>(addr), length, access, *extents);
    if (!key.ok()) {
      for (const int fd : fds) close(fd);
      return key.status();
    }
    return std::unique_ptr<MemoryRegion>(
        new ShmMr(device_, addr, length, *key, access, std::move(fds)));
  }

  absl::StatusOr<std::unique_ptr<QueuePair>> DoCreateQp(const QpConfig& config) override {
    absl::StatusOr<std::unique_ptr<ShmQp>> qp = ShmQp::Create(device_, config, id_);
    if (!qp.ok()) return qp.status();
    device_->counter_registry().Register(qp->get());
    return std::unique_ptr<QueuePair>(std::move(*qp));
  }

  absl::StatusOr<std::unique_ptr<AddressHandle>> DoCreateAddressHandle(
      const AddressInfo& info) override {
    ShmAddress address;
    std::memcpy(&address, info.gid.data(), sizeof(address));
    if (address.fabric_id != device_->segment().header()->fabric_id) {
      return absl::InvalidArgumentError(
          "address handle: GID is not a shm device of this fabric (wrong fabric name?)");
    }
    // Resolved now, not at the first SEND: the data path never opens, maps or allocates.
    absl::StatusOr<std::shared_ptr<Peer>> peer = device_->PeerAt(address);
    if (!peer.ok()) return peer.status();
    return std::unique_ptr<AddressHandle>(new ShmAh(*std::move(peer)));
  }

 private:
  ShmDevice* device_;
  const uint32_t id_;  // this PD's identity in the segment's MR and QP entries
};

}  // namespace

ShmAh::~ShmAh() {
  const uint64_t pending = pending_.load(std::memory_order_acquire);
  CHECK_EQ(pending, 0u) << "AddressHandle destroyed while " << pending
                        << " posted WR(s) that name it have not executed yet (asynchronous shm "
                           "fabric; a NIC would read freed memory): poll their completions first";
}

// ------------------------------------------------------------------------------ device
absl::StatusOr<std::unique_ptr<ShmDevice>> ShmDevice::Open(const DeviceOptions& options) {
  if (options.mtu < 256 || options.mtu > 65536) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shm fabric MTU must be in 256..65536 bytes, got %d", options.mtu));
  }
  const FaultOptions& faults = options.faults;
  if (faults.ud_loss < 0 || faults.ud_loss > 1 || faults.uc_loss < 0 || faults.uc_loss > 1 ||
      faults.write_disorder < 0 || faults.write_disorder > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fault probabilities must be in [0, 1], got ud_loss=%g uc_loss=%g write_disorder=%g",
        faults.ud_loss, faults.uc_loss, faults.write_disorder));
  }
  absl::StatusOr<std::unique_ptr<SegmentMapping>> segment =
      SegmentMapping::Create(FabricId(options.fabric), options.mtu);
  if (!segment.ok()) return segment.status();
  const bool async = options.shm_async || faults.delay_us > 0 || faults.delay_jitter_us > 0 ||
                     faults.write_disorder > 0 || faults.slow_read_us > 0;
  std::unique_ptr<ShmDevice> device(
      new ShmDevice(*std::move(segment), faults, async, options.shm_map_unsealed_regions));
  if (!faults.partition_file.empty()) {
    absl::StatusOr<PartitionTable> partitions = PartitionTable::Open(faults.partition_file);
    if (!partitions.ok()) return partitions.status();
    device->partitions_ = std::make_unique<PartitionTable>(*std::move(partitions));
  }
  // Started here in both modes (the synchronous mode's waits until a QP queues a WR), so that
  // PostSend never creates a thread, and a failure to start one is an error here.
  try {
    util::MutexLock lock(&device->progress_mutex_);
    device->progress_thread_ = std::thread([d = device.get()] { d->RunProgress(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("shm device: cannot start its progress thread: ", e.what()));
  }
  return device;
}

ShmDevice::~ShmDevice() {
  CheckNoChildren();  // before the progress thread stops and the segment goes
  std::thread progress;
  {
    util::MutexLock lock(&progress_mutex_);
    stop_progress_.store(true, std::memory_order_relaxed);
    progress = std::move(progress_thread_);
    progress_wake_.SignalAll();
  }
  if (progress.joinable()) progress.join();
}

void ShmDevice::WakeProgress() {
  util::MutexLock lock(&progress_mutex_);
  progress_wanted_ = true;
  progress_wake_.SignalAll();
}

void ShmDevice::RunProgress() {
  // A thread starts with its creator's CPU affinity: a device opened by a thread pinned to one
  // core (herd_client --client_cores) would put this thread on that busy core. It runs where the
  // process's main thread may.
  cpu_set_t allowed;
  if (sched_getaffinity(getpid(), sizeof(allowed), &allowed) == 0) {
    sched_setaffinity(0, sizeof(allowed), &allowed);
  }
  // When a pass finds nothing due, the thread sleeps this long: a NIC-like delay of tens of
  // microseconds without burning a core of these small machines.
  constexpr auto kIdleSleep = std::chrono::microseconds(20);
  while (!stop_progress_.load(std::memory_order_relaxed)) {
    uint32_t executed = 0;
    bool waiting = false;  // some QP still has WRs queued
    const int64_t now = SteadyNanos();
    const uint32_t end = qp_high_water_.load(std::memory_order_acquire);
    for (uint32_t index = 0; index < end; ++index) {
      ShmQp* qp = qps_[index].load(std::memory_order_seq_cst);
      if (qp == nullptr) continue;
      progressing_.store(qp, std::memory_order_seq_cst);
      // Re-checked after publishing the hazard: RemoveQp clears the slot before it waits.
      if (qps_[index].load(std::memory_order_seq_cst) == qp) {
        executed += qp->Progress(now, &waiting);
      }
      progressing_.store(nullptr, std::memory_order_release);
    }
    if (executed > 0) continue;
    if (async_ || waiting) {
      std::this_thread::sleep_for(kIdleSleep);
      continue;
    }
    // Synchronous mode with nothing queued: wait for the next WakeProgress. A QP queues its WR
    // before it wakes us, and the wake is seen under the mutex: either it came after the flag
    // was cleared below (the wait returns at once) or before the pass above began, which then
    // saw the WR. So a pass follows every wake, and no queued WR is left behind.
    util::MutexLock lock(&progress_mutex_);
    while (!progress_wanted_ && !stop_progress_.load(std::memory_order_relaxed)) {
      progress_wake_.Wait(&progress_mutex_);
    }
    progress_wanted_ = false;
  }
}

PortInfo ShmDevice::port() const {
  PortInfo info;
  const ShmAddress address = segment_->address();
  std::memcpy(info.gid.data(), &address, sizeof(address));
  info.active_mtu = segment_->header()->mtu;
  info.ethernet = false;
  return info;
}

absl::StatusOr<std::unique_ptr<ProtectionDomain>> ShmDevice::DoAllocatePd() {
  return std::unique_ptr<ProtectionDomain>(new ShmPd(this));
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> ShmDevice::DoCreateCq(uint32_t depth) {
  if (depth == 0) return absl::InvalidArgumentError("CQ depth must be positive");
  absl::StatusOr<Extent> extent = Carve(ShmCq::RingBytes(depth));
  if (!extent.ok()) return extent.status();
  const uint32_t id = NewCqId();
  CqRing* ring = extent->fresh ? new (segment_->base() + extent->offset) CqRing()
                               : segment_->At<CqRing>(extent->offset);
  // A reused ring (segment.h): its new id first, then tickets past every old one.
  const uint64_t start = extent->fresh
                             ? 0
                             : NextLifeStart(ring->head.load(std::memory_order_acquire),
                                             ring->tail.load(std::memory_order_acquire), depth);
  ring->id.store(id, std::memory_order_release);
  ring->depth = depth;
  ring->overflows.store(0, std::memory_order_relaxed);
  for (uint32_t i = 0; i < depth; ++i) {
    CqEntry& e = ring->entries[(start + i) % depth];
    if (extent->fresh) new (&e) CqEntry{};
    e.sequence.store(start + i, std::memory_order_release);  // ticket start + i: not yet there
  }
  ring->head_seen.store(start, std::memory_order_release);
  ring->head.store(start, std::memory_order_release);
  ring->tail.store(start, std::memory_order_release);
  auto cq = std::make_unique<ShmCq>(this, extent->offset, depth, id);
  counter_registry().Register(cq.get());
  return std::unique_ptr<CompletionQueue>(std::move(cq));
}

absl::StatusOr<ShmDevice::Extent> ShmDevice::Carve(uint64_t bytes) {
  const uint64_t rounded = RoundUp(bytes, kRingAlignment);
  util::MutexLock lock(&control_mutex_);
  const int64_t now = SteadyNanos();
  while (!quarantined_.empty() && now - quarantined_.front().release_ns >= ring_quarantine_ns_) {
    reusable_[quarantined_.front().bytes].push_back(quarantined_.front().offset);
    quarantined_.pop_front();
  }
  if (auto it = reusable_.find(rounded); it != reusable_.end() && !it->second.empty()) {
    const uint64_t offset = it->second.back();
    it->second.pop_back();
    return Extent{offset, /*fresh=*/false};
  }
  const uint64_t offset = segment_->header()->arena_used.load();
  const uint64_t end = offset + rounded;
  if (end > kSegmentBytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "shm device segment full (%d bytes): too many or too deep queues live at once",
        kSegmentBytes));
  }
  segment_->header()->arena_used.store(end);
  return Extent{offset, /*fresh=*/true};
}

void ShmDevice::Release(uint64_t offset, uint64_t bytes) {
  util::MutexLock lock(&control_mutex_);
  quarantined_.push_back(Released{offset, RoundUp(bytes, kRingAlignment), SteadyNanos()});
}

absl::StatusOr<std::shared_ptr<Peer>> ShmDevice::PeerAt(const ShmAddress& address) {
  struct stat st;
  absl::StatusOr<int> fd = SegmentMapping::Open(address, memfds_, &st);
  if (!fd.ok()) return fd.status();
  const std::pair<uint64_t, uint64_t> file{st.st_dev, st.st_ino};
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer cannot see a peer process's synchronization: two threads of this process that
  // write one receive buffer in turn (the peer's receive ring handed it from one to the next)
  // look like a race when they write through one mapping. A mapping per QP and AH, as before
  // the cache, keeps their addresses apart (on a NIC it cannot see the DMA at all).
  absl::StatusOr<std::unique_ptr<SegmentMapping>> own = SegmentMapping::Attach(address, *fd);
  if (!own.ok()) return own.status();
  return std::make_shared<Peer>(*std::move(own), memfds_, map_unsealed_regions_);
#endif
  util::MutexLock lock(&peers_mutex_);
  if (auto it = peers_.find(file); it != peers_.end()) {
    // The file is the one we mapped (our mapping keeps its inode from being reused).
    if (std::shared_ptr<Peer> peer = it->second.lock()) {
      close(*fd);
      if (!peer->segment().Names(address)) {
        return NotADevice(address, "wrong magic, version or identity");
      }
      return peer;
    }
  }
  absl::StatusOr<std::unique_ptr<SegmentMapping>> segment = SegmentMapping::Attach(address, *fd);
  if (!segment.ok()) return segment.status();
  auto peer = std::make_shared<Peer>(*std::move(segment), memfds_, map_unsealed_regions_);
  absl::erase_if(peers_, [](const auto& entry) { return entry.second.expired(); });
  peers_[file] = peer;
  return peer;
}

absl::StatusOr<uint32_t> ShmDevice::AddRegion(uint32_t pd, uint64_t addr, uint64_t length,
                                              uint32_t access, absl::Span<const Backing> extents) {
  CHECK(!extents.empty() && extents.size() <= kMaxMrExtents) << extents.size() << " extents";
  util::MutexLock lock(&control_mutex_);
  for (uint32_t index = 0; index < kMaxMrs; ++index) {
    MrEntry& entry = segment_->header()->mrs[index];
    if (entry.key.load(std::memory_order_relaxed) != 0) continue;
    const uint32_t generation = next_generation_++ & ((1u << kMrIndexShift) - 1);
    const uint32_t key = (index << kMrIndexShift) | (generation == 0 ? 1 : generation);
    entry.registration.store(next_registration_++, std::memory_order_relaxed);
    // A peer that reads these fields and then finds `registration` unchanged read this
    // registration's, not a mix with the last one's (Peer::Map).
    std::atomic_thread_fence(std::memory_order_release);
    entry.access = access;
    entry.pd = pd;
    entry.addr = addr;
    entry.length = length;
    entry.extent_count = static_cast<uint32_t>(extents.size());
    for (size_t i = 0; i < kMaxMrExtents; ++i) {  // the unused ones cleared, not left stale
      entry.extents[i] = i < extents.size()
                             ? MrExtent{extents[i].fd, 0, extents[i].file_offset, extents[i].length}
                             : MrExtent{-1, 0, 0, 0};
    }
    entry.key.store(key, std::memory_order_release);
    return key;
  }
  return absl::ResourceExhaustedError(
      absl::StrFormat("shm device: all %d memory regions in use", kMaxMrs));
}

void ShmDevice::RemoveRegion(uint32_t key) {
  util::MutexLock lock(&control_mutex_);
  segment_->header()->mrs[key >> kMrIndexShift].key.store(0, std::memory_order_release);
}

absl::StatusOr<QpEntry*> ShmDevice::AddQp(ShmQp* qp, QpType type, uint32_t pd) {
  util::MutexLock lock(&control_mutex_);
  for (uint32_t index = 0; index < kMaxQps; ++index) {
    QpEntry& entry = segment_->header()->qps[index];
    if (entry.qp_num.load(std::memory_order_relaxed) != 0) continue;
    const uint32_t generation = (next_generation_++ % 4095) + 1;  // 12 bits, never 0
    entry.type = static_cast<uint8_t>(type);
    entry.pd = pd;
    entry.state.store(static_cast<uint8_t>(QpState::kReset));
    entry.dropped.store(0);
    entry.retired.store(uint64_t{generation} << kRetiredCountBits);
    entry.qp_num.store((generation << kQpIndexBits) | index, std::memory_order_release);
    qps_[index].store(qp, std::memory_order_release);
    if (index >= qp_high_water_.load(std::memory_order_relaxed)) {
      qp_high_water_.store(index + 1, std::memory_order_release);
    }
    return &entry;
  }
  return absl::ResourceExhaustedError(absl::StrFormat("shm device: all %d QPs in use", kMaxQps));
}

void ShmDevice::RemoveQp(QpEntry* entry) {
  util::MutexLock lock(&control_mutex_);
  const uint32_t index = entry->qp_num.load() & ((1u << kQpIndexBits) - 1);
  ShmQp* qp = qps_[index].exchange(nullptr, std::memory_order_seq_cst);
  while (qp != nullptr && progressing_.load(std::memory_order_seq_cst) == qp) {
    std::this_thread::yield();  // the progress thread is inside this QP: let it leave
  }
  entry->state.store(static_cast<uint8_t>(QpState::kError));
  entry->qp_num.store(0, std::memory_order_release);
}

}  // namespace transport::shm
