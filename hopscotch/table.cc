// Table: creating, validating, mapping, repairing and closing table files. Insert and Lookup are
// in insert.cc.
#include "hopscotch/table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "hopscotch/hash.h"
#include "hopscotch/line.h"
#include "hopscotch/table_file.h"
#include "hopscotch/table_lock.h"
#include "util/errno_status.h"
#include "util/round_up.h"
#include "util/word_checksum.h"

namespace hopscotch {
namespace {

absl::Status WithPath(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrFormat("%s: %s", path, status.message()));
}

bool ValidHomeBuckets(uint64_t n) {
  return n >= 1 && n <= kMaxHomeBuckets && std::has_single_bit(n);
}

Header NewHeader(uint64_t home_buckets, uint64_t seed, const Sharding& sharding) {
  Header h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.format_version = kFormatVersion;
  h.header_bytes = kHeaderBytes;
  h.home_buckets = home_buckets;
  h.neighbourhood = kNeighbourhood;
  h.bucket_bytes = kBucketBytes;
  h.key_bytes = kKeyBytes;
  h.value_bytes = kValueBytes;
  h.hash_seed = seed;
  h.total_buckets = home_buckets + kNeighbourhood - 1;
  h.shard = sharding.shard;
  h.shards = sharding.shards;
  h.checksum = HeaderChecksum(h);  // over both: the geometry and the sharding
  h.state = kStateDirty;
  h.item_count = 0;
  return h;
}

absl::Status ValidateSharding(uint32_t shard, uint32_t shards) {
  if (shards < 1 || shards > kMaxShards || shard >= shards) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shard %u of %u: want 1..%u shards and shard < shards", shard, shards, kMaxShards));
  }
  return absl::OkStatus();
}

// A path that exists but is neither a regular file nor a character device (a directory, a
// FIFO...) is refused before open(2) says something vaguer; a missing one is open's to report.
absl::Status CheckExistingPath(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (absl::Status s = CheckTableFileType(st.st_mode); !s.ok()) return WithPath(path, s);
  return absl::OkStatus();
}

}  // namespace

bool Sharding::Holds(std::string_view key) const { return ServerOf(key, shards) == shard; }

uint64_t HeaderChecksum(const Header& header) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(&header);
  util::WordChecksum sum(kHeaderChecksumSeed, kChecksummedHeaderBytes + kChecksummedShardingBytes);
  sum.AbsorbWords(bytes, kChecksummedHeaderBytes / sizeof(uint64_t));
  sum.AbsorbWords(bytes + kChecksummedShardingOffset, kChecksummedShardingBytes / sizeof(uint64_t));
  return sum.Finish();
}

absl::Status ValidateHeader(const Header& h, uint64_t file_bytes, bool device) {
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not a hopscotch table (magic %s, want HERDHOP)",
                        absl::CHexEscape(absl::string_view(h.magic, sizeof(h.magic)))));
  }
  if (h.format_version == kUnshardedChecksumVersion) {
    // Its checksum cannot vouch for its shard fields (format.h): reading it as this version
    // would call a good file damaged, trusting it would let a flipped shard hide keys.
    return absl::FailedPreconditionError(absl::StrFormat(
        "table format version %u (its shard fields are outside the header checksum), this build "
        "reads version %u: rebuild the table with this build's hop_build",
        h.format_version, kFormatVersion));
  }
  if (h.format_version != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "table format version %u, this build reads version %u", h.format_version, kFormatVersion));
  }
  const uint64_t sum = HeaderChecksum(h);
  if (sum != h.checksum) {
    return absl::DataLossError(
        absl::StrFormat("header checksum mismatch (stored %016x, computed %016x): damaged header",
                        h.checksum, sum));
  }
  if (h.header_bytes != kHeaderBytes || h.neighbourhood != kNeighbourhood ||
      h.bucket_bytes != kBucketBytes || h.key_bytes != kKeyBytes || h.value_bytes != kValueBytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "geometry header=%u H=%u bucket=%u key=%u value=%u, this build uses %u/%u/%u/%u/%u",
        h.header_bytes, h.neighbourhood, h.bucket_bytes, h.key_bytes, h.value_bytes, kHeaderBytes,
        kNeighbourhood, kBucketBytes, kKeyBytes, kValueBytes));
  }
  if (!ValidHomeBuckets(h.home_buckets)) {
    return absl::DataLossError(
        absl::StrFormat("bucket count %u is not a power of two in 1..2^32", h.home_buckets));
  }
  if (h.total_buckets != h.home_buckets + kNeighbourhood - 1) {
    return absl::DataLossError(absl::StrFormat("total buckets %u, want %u home + %u tail",
                                               h.total_buckets, h.home_buckets,
                                               kNeighbourhood - 1));
  }
  if (device && FileBytes(h.home_buckets) > file_bytes) {
    return absl::DataLossError(
        absl::StrFormat("a table of %u home buckets is %u bytes, the device only %u",
                        h.home_buckets, FileBytes(h.home_buckets), file_bytes));
  }
  if (!device && file_bytes != FileBytes(h.home_buckets)) {
    return absl::DataLossError(absl::StrFormat(
        "file is %u bytes, a table of %u home buckets is %u bytes (truncated or extended?)",
        file_bytes, h.home_buckets, FileBytes(h.home_buckets)));
  }
  if (h.state != kStateClean && h.state != kStateDirty) {
    return absl::DataLossError(
        absl::StrFormat("state %u is neither clean (0) nor dirty (1)", h.state));
  }
  if (absl::Status s = ValidateSharding(h.shard, h.shards); !s.ok()) {
    return absl::DataLossError(s.message());
  }
  if (h.state == kStateClean && h.item_count > h.total_buckets) {
    return absl::DataLossError(
        absl::StrFormat("item count %u exceeds the %u buckets", h.item_count, h.total_buckets));
  }
  return absl::OkStatus();
}

absl::StatusOr<Table> Table::Map(const std::string& path, int fd, uint64_t bytes, bool writable,
                                 bool device, const TableOptions& options) {
  Table t;
  t.path_ = path;
  t.fd_ = fd;
  t.writable_ = writable;
  t.device_ = device;
  void* p = MAP_FAILED;
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
#ifdef MAP_SYNC
  // MAP_SYNC (stores reach the DAX media without msync) exists only on DAX file systems and
  // device-DAX; any other file answers EOPNOTSUPP (EINVAL on kernels without
  // MAP_SHARED_VALIDATE).
  if (writable && fd >= 0) {
    p = mmap(nullptr, bytes, prot, MAP_SHARED_VALIDATE | MAP_SYNC, fd, 0);
    t.map_sync_ = p != MAP_FAILED;
  }
#endif
  if (p == MAP_FAILED) {
    // TableOptions::private_when_read_only (for old kernels' ibv_reg_mr, table.h). Device-DAX
    // maps shared only.
    const int share =
        !writable && !device && options.private_when_read_only ? MAP_PRIVATE : MAP_SHARED;
    p = fd >= 0 ? mmap(nullptr, bytes, prot, share, fd, 0)
                : mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (p == MAP_FAILED) {
    t.fd_ = -1;  // the caller closes it
    return util::ErrnoStatus(absl::StatusCode::kInternal,
                             absl::StrFormat("%s: mmap of %u bytes%s", path, bytes,
                                             device ? " (a multiple of the device's align?)"
                                                    : " (a file system without shared mappings, "
                                                      "such as 9p?)"));
  }
  t.base_ = static_cast<uint8_t*>(p);
  t.mapped_bytes_ = bytes;
  // A device-DAX mapping, like a MAP_SYNC one, is the persistent memory itself (no page cache,
  // and device-DAX has no fsync: msync fails on it): its lines are flushed from the CPU caches.
  FlushMethod method = fd < 0 ? FlushMethod::kNone : FlushMethod::kSyncPages;
  if (fd >= 0 && (device || t.map_sync_)) {
    if (CacheFlushSupported()) {
      method = FlushMethod::kCacheLines;
    } else if (device) {
      return absl::UnimplementedError(
          path + ": device-DAX tables need cache-line flushes, implemented on x86-64 only");
    }
  }
  t.persister_ = Persister(method, options.persistence == Persistence::kPowerFailure, t.base_,
                           options.observer);
  return t;
}

absl::StatusOr<Table> Table::Create(const std::string& path, uint64_t home_buckets, uint64_t seed,
                                    Sharding sharding, const TableOptions& options) {
  if (!ValidHomeBuckets(home_buckets)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %u home buckets: want a power of two in 1..2^32", path, home_buckets));
  }
  if (absl::Status s = ValidateSharding(sharding.shard, sharding.shards); !s.ok()) {
    return WithPath(path, s);
  }
  if (absl::Status s = CheckExistingPath(path); !s.ok()) return s;
  // No O_TRUNC (a regular file is truncated below, once it is known to be one); O_NONBLOCK so
  // that a FIFO is refused instead of blocking the open.
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) return util::ErrnoStatus(absl::StatusCode::kInternal, path + ": create");
  auto fail = [&](absl::Status s) {
    close(fd);
    return WithPath(path, s);
  };
  struct stat st;
  if (fstat(fd, &st) != 0) return fail(util::ErrnoStatus(absl::StatusCode::kInternal, "fstat"));
  if (absl::Status s = CheckTableFileType(st.st_mode); !s.ok()) return fail(s);
  if (options.lock) {  // before the truncation below: never under a process using the file
    if (absl::Status s = LockTableFile(fd, path, LockMode::kExclusive); !s.ok()) {
      close(fd);
      return s;
    }
  }
  const bool device = S_ISCHR(st.st_mode);
  const uint64_t bytes = FileBytes(home_buckets);
  uint64_t map_bytes = bytes;
  if (device) {  // a fixed size: the table must fit in it, mapped in whole alignment units
    absl::StatusOr<DeviceGeometry> geometry = ReadDeviceGeometry(st, options.sysfs_root);
    if (!geometry.ok()) return fail(geometry.status());
    map_bytes = util::RoundUp(bytes, geometry->align);
    if (map_bytes > geometry->bytes) {
      return fail(absl::InvalidArgumentError(absl::StrFormat(
          "the device is %u bytes, a table of %u home buckets needs %u (%u bytes rounded up to "
          "the device's %u-byte alignment): use fewer buckets or a bigger device",
          geometry->bytes, home_buckets, map_bytes, bytes, geometry->align)));
    }
  } else if (ftruncate(fd, 0) != 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return fail(
        util::ErrnoStatus(absl::StatusCode::kInternal, absl::StrFormat("size to %u bytes", bytes)));
  }
  absl::StatusOr<Table> t = Map(path, fd, map_bytes, /*writable=*/true, device, options);
  if (!t.ok()) {
    close(fd);
    return t.status();
  }
  if (device) {  // a device keeps what it held: unmake the old table first, then zero it
    std::memset(t->base_, 0, kHeaderBytes);
    if (absl::Status s = t->persister_.PersistRange(t->base_, kHeaderBytes); !s.ok()) {
      return WithPath(path, s);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::memset(t->base_ + kHeaderBytes, 0, bytes - kHeaderBytes);
  }
  t->home_buckets_ = home_buckets;
  t->seed_ = seed;
  t->sharding_ = sharding;
  if (options.defer_header) {
    // The header stays as ftruncate or the device zeroing left it, zero: not a table (Publish).
    t->header_made_ = false;
  } else {
    const Header h = NewHeader(home_buckets, seed, sharding);
    std::memcpy(t->base_, &h, sizeof(h));
  }
  if (t->persister_.active()) {  // dirty from the start: any bucket state repairs
    if (absl::Status s = t->persister_.PersistRange(t->base_, bytes); !s.ok()) {
      return WithPath(path, s);
    }
    if (!device) {
      if (absl::Status s = SyncParentDirectory(path); !s.ok()) return s;
    }
  }
  return t;
}

absl::StatusOr<Table> Table::CreateInMemory(uint64_t home_buckets, uint64_t seed,
                                            const TableOptions& options) {
  if (!ValidHomeBuckets(home_buckets)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%u home buckets: want a power of two in 1..2^32", home_buckets));
  }
  absl::StatusOr<Table> t =
      Map("(memory)", -1, FileBytes(home_buckets), /*writable=*/true, /*device=*/false, options);
  if (!t.ok()) return t.status();
  const Header h = NewHeader(home_buckets, seed, Sharding{});
  std::memcpy(t->base_, &h, sizeof(h));
  t->home_buckets_ = home_buckets;
  t->seed_ = seed;
  return t;
}

absl::StatusOr<Table> Table::Open(const std::string& path, bool writable,
                                  const TableOptions& options) {
  // A path replaced between the open and the lock is opened again (LockTableFile); a rename
  // takes a moment, so a few attempts always meet a settled path unless builds race each other.
  constexpr int kOpenAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<Table> table = OpenOnce(path, writable, options);
    if (!absl::IsAborted(table.status()) || attempt == kOpenAttempts) return table;
  }
}

absl::StatusOr<Table> Table::OpenOnce(const std::string& path, bool writable,
                                      const TableOptions& options) {
  if (absl::Status s = CheckExistingPath(path); !s.ok()) return s;
  // O_NONBLOCK: a FIFO is refused below instead of blocking the open.
  const int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return util::ErrnoStatus(absl::StatusCode::kNotFound, path + ": open");
  auto fail = [&](absl::Status s) {
    close(fd);
    return WithPath(path, s);
  };
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return fail(util::ErrnoStatus(absl::StatusCode::kInternal, "fstat"));
  }
  if (absl::Status s = CheckTableFileType(st.st_mode); !s.ok()) return fail(s);
  if (options.lock) {  // before the header is read: a writer beside it could be rewriting it
    const LockMode mode = writable ? LockMode::kExclusive : LockMode::kShared;
    if (absl::Status s = LockTableFile(fd, path, mode); !s.ok()) {
      close(fd);
      return s;
    }
  }
  const bool device = S_ISCHR(st.st_mode);
  DeviceGeometry geometry;
  if (device) {
    absl::StatusOr<DeviceGeometry> g = ReadDeviceGeometry(st, options.sysfs_root);
    if (!g.ok()) return fail(g.status());
    geometry = *g;
  }
  const uint64_t size = device ? geometry.bytes : static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBytes) {
    return fail(absl::DataLossError(absl::StrFormat(
        "%u bytes, shorter than the %u-byte header: empty or truncated, not a table", size,
        kHeaderBytes)));
  }
  Header h;
  if (device) {
    absl::StatusOr<Header> header = ReadDeviceHeader(fd, geometry);
    if (!header.ok()) return fail(header.status());
    h = *header;
  } else if (pread(fd, &h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h))) {
    return fail(util::ErrnoStatus(absl::StatusCode::kInternal, "read header"));
  }
  if (absl::Status s = ValidateHeader(h, size, device); !s.ok()) return fail(s);
  const uint64_t map_bytes =
      device ? util::RoundUp(FileBytes(h.home_buckets), geometry.align) : size;
  if (map_bytes > size) {
    return fail(absl::DataLossError(absl::StrFormat(
        "a table of %u home buckets is mapped as %u bytes (the device's %u-byte alignment), the "
        "device is only %u",
        h.home_buckets, map_bytes, geometry.align, size)));
  }
  absl::StatusOr<Table> t = Map(path, fd, map_bytes, writable, device, options);
  if (!t.ok()) {
    close(fd);
    return t.status();
  }
  t->home_buckets_ = h.home_buckets;
  t->seed_ = h.hash_seed;
  t->sharding_ = Sharding{h.shard, h.shards};
  bool repaired = false;
  // A clean file with a busy line (a damaged or hand-edited file: a clean writer leaves none)
  // would make every lookup reaching that line reread it to the limit and end torn: repaired
  // like a dirty file's when writable; read-only, refused (nothing here may store into it).
  uint64_t first_busy = 0;
  const uint64_t busy = h.state == kStateClean ? t->BusyLines(&first_busy) : 0;
  if (busy != 0 && !writable) {
    return WithPath(path, absl::DataLossError(absl::StrFormat(
                              "marked clean but %u buckets are busy (mid-rewrite), the first "
                              "bucket %u: open it writable once (hop_server without "
                              "--read_only) to repair it",
                              busy, first_busy)));
  }
  if (h.state == kStateClean && busy == 0) {
    t->items_ = h.item_count;
  } else if (writable) {
    if (busy != 0) {
      LOG(WARNING) << path << ": marked clean but " << busy
                   << " buckets are busy (mid-rewrite): repairing it as after an unclean shutdown";
      // Dirty before the first repair store (durable first under kPowerFailure), as a dirty
      // file is: a repair cut short is redone by the next open instead of left looking clean.
      reinterpret_cast<Header*>(t->base_)->state = kStateDirty;
      if (t->persister_.active()) {
        absl::Status s = t->persister_.PersistRange(t->base_, kHeaderBytes);
        if (!s.ok()) return WithPath(path, s);
      }
    }
    t->Recover();  // its writer died: repair what a cut-short store sequence leaves
    repaired = true;
  } else {
    for (uint64_t j = 0; j < t->total_buckets(); ++j) {
      const uint8_t info = InfoOf(t->Bucket(j));
      if (IsOccupied(info) && !IsBusy(info)) ++t->items_;
    }
  }
  if (writable) {
    reinterpret_cast<Header*>(t->base_)->state = kStateDirty;  // until Close
    if (t->persister_.active()) {  // durable before the first bucket store (and the repair)
      absl::Status s =
          t->persister_.PersistRange(t->base_, repaired ? t->file_bytes() : kHeaderBytes);
      if (!s.ok()) return WithPath(path, s);
    }
  }
  return t;
}

void Table::Recover() {
  const uint64_t total = total_buckets();
  for (uint64_t j = 0; j < total; ++j) {  // 1. lines whose rewrite was cut short
    uint8_t* b = Bucket(j);
    const uint64_t w0 = LoadWord(b, 0);
    const uint8_t info = WordInfo(w0);
    if (!IsBusy(info)) continue;
    // An occupied busy line was an in-place update: its key is intact, keep it. An empty one
    // was a fill that never became visible.
    const uint8_t version = static_cast<uint8_t>((info + 1) & kVersionMask);
    StoreWord(b, 0, WithInfo(w0, static_cast<uint8_t>((info & kOccupied) | version)));
    ++stats_.recovered_busy;
  }
  for (uint64_t j = 0; j < total; ++j) {  // 2. occupied lines no hop bit names
    uint8_t* b = Bucket(j);
    const uint64_t w0 = LoadWord(b, 0);
    if (!IsOccupied(WordInfo(w0))) continue;
    const char* key = reinterpret_cast<const char*>(b + kKeyOffset);
    const std::string_view k(key, strnlen(key, kKeyBytes));
    bool named = false;
    if (ValidateKey(k).ok() && std::memcmp(PadKey(k).data(), key, kKeyBytes) == 0) {
      const uint64_t home = HomeOf(k);
      named =
          home <= j && j - home < kNeighbourhood && ((HopOf(Bucket(home)) >> (j - home)) & 1u) != 0;
    }
    if (named) {
      ++items_;
    } else {
      StoreWord(b, 0, WithInfo(w0, static_cast<uint8_t>((WordInfo(w0) + 2) & kVersionMask)));
      ++stats_.recovered_orphans;
    }
  }
  for (uint64_t home = 0; home < home_buckets_; ++home) {  // 3. hop bits naming no key of theirs
    uint8_t* b = Bucket(home);
    uint32_t hop = HopOf(b);
    for (uint32_t bits = hop; bits != 0; bits &= bits - 1) {
      const int i = std::countr_zero(bits);
      const uint8_t* t = Bucket(home + i);
      const char* key = reinterpret_cast<const char*>(t + kKeyOffset);
      const std::string_view k(key, strnlen(key, kKeyBytes));
      if (!IsOccupied(InfoOf(t)) || HomeOf(k) != home) {
        hop &= ~(1u << i);
        ++stats_.recovered_dangling;
      }
    }
    if (hop != HopOf(b)) StoreWord(b, 0, WithHop(LoadWord(b, 0), hop));
  }
  for (uint64_t j = home_buckets_; j < total; ++j) {  // tail buckets are nobody's home
    uint8_t* b = Bucket(j);
    if (HopOf(b) == 0) continue;
    stats_.recovered_dangling += std::popcount(HopOf(b));
    StoreWord(b, 0, WithHop(LoadWord(b, 0), 0));
  }
  LOG_IF(WARNING, stats_.recovered_busy + stats_.recovered_orphans + stats_.recovered_dangling)
      << path_ << ": repaired after an unclean shutdown: " << stats_.recovered_busy
      << " busy lines, " << stats_.recovered_orphans << " unnamed copies, "
      << stats_.recovered_dangling << " dangling hop bits";
}

uint64_t Table::BusyLines(uint64_t* first) const {
  uint64_t busy = 0;
  for (uint64_t j = total_buckets(); j-- > 0;) {  // downwards: *first ends as the lowest
    if (!IsBusy(InfoOf(Bucket(j)))) continue;
    ++busy;
    *first = j;
  }
  return busy;
}

absl::Status Table::MakeHeader() {
  // In two steps, each durable before the next: first everything from the state on (dirty, the
  // count, the sharding), then the first bytes (magic, geometry, checksum). Until the second is
  // whole on the media the header lacks its magic or its checksum and Open refuses the file;
  // after it, the header says dirty (Open recounts) until Finish marks it clean. A power failure
  // in between never leaves a header that says clean over a wrong count (state 0 is clean).
  const Header made = NewHeader(home_buckets_, seed_, sharding_);  // dirty
  constexpr size_t kTail = offsetof(Header, state);
  std::memcpy(base_ + kTail, reinterpret_cast<const uint8_t*>(&made) + kTail, kHeaderBytes - kTail);
  if (absl::Status s = persister_.PersistRange(base_, kHeaderBytes); !s.ok()) return s;
  std::memcpy(base_, &made, kTail);
  if (absl::Status s = persister_.PersistRange(base_, kHeaderBytes); !s.ok()) return s;
  header_made_ = true;
  return absl::OkStatus();
}

absl::Status Table::Close() { return Finish(/*publish=*/false); }

absl::Status Table::Publish() { return Finish(/*publish=*/true); }

absl::Status Table::Finish(bool publish) {
  if (base_ == nullptr) return absl::OkStatus();
  absl::Status status;
  // An unpublished table closed: its header stays zero (TableOptions::defer_header), nothing
  // to make durable for anyone.
  if (writable_ && fd_ >= 0 && (header_made_ || publish)) {
    // The buckets first, then the clean mark (or the whole header): a clean header never
    // describes buckets that are not on the media yet.
    status = persister_.PersistRange(base_, file_bytes());
    if (status.ok() && !header_made_) status = MakeHeader();
    if (status.ok()) {
      auto* h = reinterpret_cast<Header*>(base_);
      h->item_count = items_;
      h->state = kStateClean;
      status = persister_.PersistRange(base_, kHeaderBytes);
    }
    if (!status.ok()) status = WithPath(path_, status);
  }
  Release();
  return status;
}

void Table::Release() {
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
  if (fd_ >= 0) close(fd_);
  base_ = nullptr;
  fd_ = -1;
}

Table::Table(Table&& o) noexcept { *this = std::move(o); }

Table& Table::operator=(Table&& o) noexcept {
  if (this != &o) {
    if (absl::Status s = Close(); !s.ok()) LOG(ERROR) << s;
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    base_ = std::exchange(o.base_, nullptr);
    mapped_bytes_ = o.mapped_bytes_;
    writable_ = o.writable_;
    map_sync_ = o.map_sync_;
    device_ = o.device_;
    header_made_ = o.header_made_;
    persister_ = std::move(o.persister_);
    home_buckets_ = o.home_buckets_;
    seed_ = o.seed_;
    sharding_ = o.sharding_;
    items_ = o.items_;
    stats_ = o.stats_;
  }
  return *this;
}

Table::~Table() {
  if (absl::Status s = Close(); !s.ok()) LOG(ERROR) << s;
}

uint64_t Table::HomeOf(std::string_view key) const { return HomeBucket(key, seed_, home_buckets_); }

}  // namespace hopscotch
