#include "rmem/pool.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "util/errno_status.h"
#include "util/memfd.h"
#include "util/word_checksum.h"

namespace rmem {
namespace {

constexpr uint64_t kHeaderSeed = 0x726d656d68656164;  // "rmemhead"
constexpr uint64_t kRedoSeed = 0x726d656d7265646f;    // "rmemredo"
// The largest absl::StatusCode (kUnauthenticated): a redo record naming a larger one is damaged.
constexpr uint32_t kMaxStatusCode = static_cast<uint32_t>(absl::StatusCode::kUnauthenticated);

// A random 64-bit word from the kernel (client ids and secrets: unguessable by other peers).
uint64_t RandomWord() {
  uint64_t word = 0;
  CHECK_EQ(getrandom(&word, sizeof(word), 0), static_cast<ssize_t>(sizeof(word)))
      << "getrandom failed";
  return word;
}

uint64_t AlignUp(uint64_t value, uint64_t align) { return (value + align - 1) / align * align; }

uint64_t HeaderChecksum(const Header& h) {
  util::WordChecksum sum(kHeaderSeed, kChecksummedHeaderBytes);
  sum.AbsorbWords(reinterpret_cast<const uint8_t*>(&h), kChecksummedHeaderBytes / 8);
  return sum.Finish();
}

// [a, a + n) and [b, b + m) share a byte.
bool Overlap(uint64_t a, uint64_t n, uint64_t b, uint64_t m) { return a < b + m && b < a + n; }

absl::Status CheckLimits(uint64_t pool_bytes, uint32_t max_regions, uint32_t max_clients,
                         uint32_t max_ops) {
  if (pool_bytes == 0 || pool_bytes % kRegionAlign != 0 || pool_bytes > kMaxPoolBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pool_bytes %u: want a multiple of %u, at most %u", pool_bytes,
                        kRegionAlign, kMaxPoolBytes));
  }
  if (max_regions == 0 || max_regions > kMaxRegionsLimit || max_clients == 0 ||
      max_clients > kMaxClientsLimit || max_ops == 0 || max_ops > kMaxOpsLimit) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_regions %u (1..%u), max_clients %u (1..%u), max_ops %u (1..%u)", max_regions,
        kMaxRegionsLimit, max_clients, kMaxClientsLimit, max_ops, kMaxOpsLimit));
  }
  return absl::OkStatus();
}

}  // namespace

Layout LayoutFor(uint64_t pool_bytes, uint32_t max_regions, uint32_t max_clients,
                 uint32_t max_ops) {
  Layout l;
  l.region_offset = kHeaderBytes;
  l.client_offset = AlignUp(l.region_offset + uint64_t{max_regions} * kRegionBytes, kSectionAlign);
  l.redo_offset = AlignUp(l.client_offset + uint64_t{max_clients} * kClientBytes, kSectionAlign);
  l.data_offset =
      AlignUp(l.redo_offset + kRedoHeadBytes + uint64_t{max_ops} * kRedoOpBytes, kSectionAlign);
  l.file_bytes = AlignUp(l.data_offset + pool_bytes, kSectionAlign);
  return l;
}

uint64_t RedoChecksum(const RedoHead& head, const RedoOp* ops) {
  const uint64_t op_bytes = uint64_t{head.ops} * kRedoOpBytes;
  util::WordChecksum sum(kRedoSeed, 24 + op_bytes);
  sum.Absorb(head.client_id);
  sum.Absorb(head.txn_id);
  // ops and code share one word (a record with code 0 sums as before the field existed).
  sum.Absorb(uint64_t{head.ops} | uint64_t{head.code} << 32);
  sum.AbsorbWords(reinterpret_cast<const uint8_t*>(ops), op_bytes / 8);
  return sum.Finish();
}

absl::StatusOr<Pool> Pool::Map(const std::string& path, int fd, const Layout& layout,
                               bool hugepages) {
  Pool p;
  p.path_ = path;
  p.fd_ = fd;
  p.layout_ = layout;
  void* base = MAP_FAILED;
  if (fd >= 0) {
    base = mmap(nullptr, layout.file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  } else {
    // In memory: a memfd (hugetlb when the machine has huge pages reserved), mapped shared, so
    // the shm fabric can register it (it maps a registered region's file into its peers).
    // Sealed at its size (util::CreateMemfd): the clients that map it can rely on its pages.
    if (hugepages) {
      // A hugetlb file's size (and its mapping's length) is a multiple of the huge page.
      const uint64_t huge = AlignUp(layout.file_bytes, util::kHugePageBytes);
      absl::StatusOr<int> memfd = util::CreateMemfd("rmem-pool", huge, util::kHugePageBytes);
      fd = memfd.ok() ? *memfd : -1;
      if (fd >= 0) base = mmap(nullptr, huge, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base != MAP_FAILED) {
        p.mapped_bytes_ = huge;
      } else if (fd >= 0) {
        close(fd);
        fd = -1;
      }
    }
    if (base == MAP_FAILED) {
      absl::StatusOr<int> memfd =
          util::CreateMemfd("rmem-pool", layout.file_bytes, static_cast<size_t>(getpagesize()));
      fd = memfd.ok() ? *memfd : -1;
      if (fd >= 0) {
        base = mmap(nullptr, layout.file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      }
    }
    p.fd_ = fd;  // ours: the pool closes it
  }
  if (base == MAP_FAILED) {
    const absl::Status s = util::ErrnoStatus(
        absl::StatusCode::kResourceExhausted,
        absl::StrFormat("%s: mmap of %u bytes", path.empty() ? "pool" : path, layout.file_bytes));
    if (path.empty() && p.fd_ >= 0) close(p.fd_);
    p.fd_ = -1;  // a file's descriptor: the caller closes it
    return s;
  }
  p.base_ = static_cast<uint8_t*>(base);
  if (p.mapped_bytes_ == 0) p.mapped_bytes_ = layout.file_bytes;
  return p;
}

absl::StatusOr<Pool> Pool::Create(const PoolOptions& o) {
  if (absl::Status s = CheckLimits(o.pool_bytes, o.max_regions, o.max_clients, o.max_ops);
      !s.ok()) {
    return s;
  }
  const Layout layout = LayoutFor(o.pool_bytes, o.max_regions, o.max_clients, o.max_ops);
  int fd = -1;
  if (!o.path.empty()) {
    fd = open(o.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return util::ErrnoStatus(absl::StatusCode::kNotFound, o.path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {  // never truncate a pool a server is using
      const absl::Status s = util::ErrnoStatus(
          absl::StatusCode::kFailedPrecondition,
          absl::StrFormat("%s: another process has this pool open (flock)", o.path));
      close(fd);
      return s;
    }
    if (ftruncate(fd, 0) != 0) {
      const absl::Status s = util::ErrnoStatus(absl::StatusCode::kInternal, o.path + ": truncate");
      close(fd);
      return s;
    }
    if (ftruncate(fd, static_cast<off_t>(layout.file_bytes)) != 0) {
      const absl::Status s =
          util::ErrnoStatus(absl::StatusCode::kResourceExhausted,
                            absl::StrFormat("%s: size to %u bytes", o.path, layout.file_bytes));
      close(fd);
      return s;
    }
  }
  absl::StatusOr<Pool> pool = Map(o.path, fd, layout, o.hugepages);
  if (!pool.ok()) {
    if (fd >= 0) close(fd);
    return pool.status();
  }
  Header& h = pool->header();
  // The file is zero (ftruncate, anonymous memory): every record free, the redo empty. The
  // header goes last: a crash before it leaves "not a pool", during it a header whose checksum
  // does not match; Open refuses both, naming the file.
  Header fresh{};
  fresh.magic = kPoolMagic;
  fresh.version = kPoolVersion;
  fresh.header_bytes = kHeaderBytes;
  fresh.pool_bytes = o.pool_bytes;
  fresh.max_regions = o.max_regions;
  fresh.max_clients = o.max_clients;
  fresh.max_ops = o.max_ops;
  fresh.data_offset = layout.data_offset;
  fresh.checksum = HeaderChecksum(fresh);
  std::memcpy(&h, &fresh, sizeof(fresh));
  pool->pool_bytes_ = o.pool_bytes;
  pool->max_regions_ = o.max_regions;
  pool->max_clients_ = o.max_clients;
  pool->max_ops_ = o.max_ops;
  if (absl::Status s = pool->Load(); !s.ok()) return s;
  return pool;
}

absl::StatusOr<Pool> Pool::Open(const std::string& path, StepHook replay_hook) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return util::ErrnoStatus(absl::StatusCode::kNotFound, path);
  // One server per pool: a second (a restarted server beside a hung one) would write the same
  // redo area. The lock goes with the descriptor, so with the process.
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const absl::Status s =
        util::ErrnoStatus(absl::StatusCode::kFailedPrecondition,
                          absl::StrFormat("%s: another process has this pool open (flock)", path));
    close(fd);
    return s;
  }
  auto fail = [&](absl::Status s) {
    close(fd);
    return absl::Status(s.code(), absl::StrFormat("%s: %s", path, s.message()));
  };
  struct stat st {};
  if (fstat(fd, &st) != 0) return fail(util::ErrnoStatus(absl::StatusCode::kInternal, "fstat"));
  if (!S_ISREG(st.st_mode)) return fail(absl::InvalidArgumentError("not a regular file"));
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  Header h{};
  if (file_bytes < kHeaderBytes || pread(fd, &h, sizeof(h), 0) != sizeof(h)) {
    return fail(absl::DataLossError(absl::StrFormat(
        "%u bytes: shorter than a pool's %u-byte header", file_bytes, kHeaderBytes)));
  }
  if (h.magic != kPoolMagic) return fail(absl::DataLossError("not an rmem pool (bad magic)"));
  if (h.version != kPoolVersion) {
    return fail(absl::FailedPreconditionError(
        absl::StrFormat("pool format version %u, this server reads %u", h.version, kPoolVersion)));
  }
  if (h.checksum != HeaderChecksum(h)) {
    return fail(absl::DataLossError("the header's checksum does not match (damaged)"));
  }
  if (absl::Status s = CheckLimits(h.pool_bytes, h.max_regions, h.max_clients, h.max_ops);
      !s.ok()) {
    return fail(absl::DataLossError(std::string(s.message())));
  }
  const Layout layout = LayoutFor(h.pool_bytes, h.max_regions, h.max_clients, h.max_ops);
  if (h.header_bytes != kHeaderBytes || h.data_offset != layout.data_offset) {
    return fail(absl::DataLossError("the header's geometry is inconsistent"));
  }
  if (file_bytes != layout.file_bytes) {
    return fail(absl::DataLossError(
        absl::StrFormat("%u bytes, the header describes a pool file of %u (truncated or extended)",
                        file_bytes, layout.file_bytes)));
  }
  absl::StatusOr<Pool> pool = Map(path, fd, layout, /*hugepages=*/false);
  if (!pool.ok()) return fail(pool.status());
  pool->pool_bytes_ = h.pool_bytes;
  pool->max_regions_ = h.max_regions;
  pool->max_clients_ = h.max_clients;
  pool->max_ops_ = h.max_ops;
  if (absl::Status s = pool->Load(); !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("%s: %s", path, s.message()));
  }
  RedoHead& redo = pool->redo();
  if (redo.state == kRedoCommitted) {
    if (redo.ops > pool->max_ops_ || RedoChecksum(redo, pool->redo_ops()) != redo.checksum ||
        redo.code > kMaxStatusCode || (redo.code != 0 && redo.ops != 0)) {
      return absl::DataLossError(absl::StrFormat(
          "%s: a committed transaction's redo record is damaged (its checksum does not match)",
          path));
    }
    // The checksum catches damage, not a forger: check every op is one Apply can execute.
    for (uint32_t i = 0; i < redo.ops; ++i) {
      const RedoOp& op = pool->redo_ops()[i];
      const bool copy_ok = op.kind == static_cast<uint32_t>(OpKind::kCopy) && op.bytes > 0 &&
                           op.bytes <= h.pool_bytes && op.a <= h.pool_bytes - op.bytes &&
                           op.b <= h.pool_bytes - op.bytes;
      const bool free_ok = op.kind == static_cast<uint32_t>(OpKind::kFree) && op.a < h.max_regions;
      if (!copy_ok && !free_ok) {
        return absl::DataLossError(
            absl::StrFormat("%s: op %u of the committed transaction is malformed", path, i));
      }
    }
    // Finish what the dead server committed (steps 3-5), then rebuild the indexes it changed.
    pool->hook_ = std::move(replay_hook);
    pool->Apply(redo, pool->redo_ops());
    pool->hook_ = nullptr;
    if (absl::Status s = pool->Load(); !s.ok()) return s;
    pool->stats_.replayed = true;
    LOG(WARNING) << path << ": applied transaction " << redo.txn_id << " of client "
                 << redo.client_id << ", committed before its server died";
  }
  return pool;
}

absl::Status Pool::Load() {
  by_tag_.clear();
  by_offset_.clear();
  client_index_.clear();
  free_records_.clear();
  stats_.regions = 0;
  stats_.allocated_bytes = 0;
  const RegionRecord* r = regions();
  for (uint32_t i = max_regions_; i-- > 0;) {  // popped from the back: lowest index first
    if (r[i].state == 0) {
      free_records_.push_back(i);
      continue;
    }
    const RegionRecord& rec = r[i];
    if (rec.state != kRegionLive || rec.tag == 0 || rec.bytes == 0 ||
        rec.offset % kRegionAlign != 0 || rec.bytes % kRegionAlign != 0 ||
        rec.offset > pool_bytes_ || rec.bytes > pool_bytes_ - rec.offset) {
      return absl::DataLossError(
          absl::StrFormat("region record %u is damaged (state %u, tag %u, %u bytes at %u)", i,
                          rec.state, rec.tag, rec.bytes, rec.offset));
    }
    if (!by_tag_.emplace(rec.tag, i).second) {
      return absl::DataLossError(absl::StrFormat("tag %u is tied to two regions", rec.tag));
    }
    if (!by_offset_.emplace(rec.offset, i).second) {
      return absl::DataLossError(absl::StrFormat("two regions start at offset %u", rec.offset));
    }
    ++stats_.regions;
    stats_.allocated_bytes += rec.bytes;
  }
  // Live regions must not overlap: walk them in offset order.
  uint64_t end = 0;
  for (const auto& [offset, id] : by_offset_) {
    if (offset < end) return absl::DataLossError(absl::StrFormat("region %u overlaps another", id));
    end = offset + r[id].bytes;
  }
  const ClientRecord* c = clients();
  use_clock_ = 1;
  for (uint32_t i = 0; i < max_clients_; ++i) {
    if (c[i].client_id == 0) continue;
    if (!client_index_.emplace(c[i].client_id, i).second) {
      return absl::DataLossError(absl::StrFormat("client %u has two records", c[i].client_id));
    }
    use_clock_ = std::max(use_clock_, c[i].last_used + 1);
  }
  return absl::OkStatus();
}

Pool::Pool(Pool&& other) noexcept { *this = std::move(other); }

Pool& Pool::operator=(Pool&& other) noexcept {
  if (this == &other) return *this;
  Release();
  path_ = std::move(other.path_);
  fd_ = std::exchange(other.fd_, -1);
  base_ = std::exchange(other.base_, nullptr);
  mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
  layout_ = other.layout_;
  pool_bytes_ = other.pool_bytes_;
  max_regions_ = other.max_regions_;
  max_clients_ = other.max_clients_;
  max_ops_ = other.max_ops_;
  by_tag_ = std::move(other.by_tag_);
  by_offset_ = std::move(other.by_offset_);
  client_index_ = std::move(other.client_index_);
  free_records_ = std::move(other.free_records_);
  use_clock_ = other.use_clock_;
  hook_ = std::move(other.hook_);
  stats_ = other.stats_;
  return *this;
}

Pool::~Pool() { Release(); }

void Pool::Release() {
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
  if (fd_ >= 0) close(fd_);
  base_ = nullptr;
  fd_ = -1;
}

absl::StatusOr<Region> Pool::Alloc(uint64_t bytes, uint64_t tag) {
  if (tag == 0) return absl::InvalidArgumentError("tag 0 is reserved (no region is tied to it)");
  if (bytes == 0 || bytes > pool_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a region of %u bytes: want 1..%u (the pool)", bytes, pool_bytes_));
  }
  const uint64_t size = AlignUp(bytes, kRegionAlign);
  if (std::optional<Region> existing = FindTag(tag)) {
    if (existing->bytes != size) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "tag %u is tied to a region of %u bytes, not %u", tag, existing->bytes, size));
    }
    return *existing;  // idempotent: the same region for the same tag
  }
  if (free_records_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%u regions allocated, the most this pool records", max_regions_));
  }
  // First fit over the gaps between live regions (in offset order).
  uint64_t at = 0;
  bool found = false;
  for (const auto& [offset, id] : by_offset_) {
    if (offset - at >= size) {
      found = true;
      break;
    }
    at = offset + regions()[id].bytes;
  }
  if (!found && pool_bytes_ - at < size) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("no free extent of %u bytes in the pool (%u of %u bytes allocated)", size,
                        stats_.allocated_bytes, pool_bytes_));
  }
  const uint32_t id = free_records_.back();
  // A new region starts zeroed: the extent may hold a freed region's bytes, which must not reach
  // the next owner. (A kill before the record is live leaves zeros in free space: harmless.)
  std::memset(data() + at, 0, size);
  RegionRecord& rec = regions()[id];
  rec.tag = tag;
  rec.offset = at;
  rec.bytes = size;
  // The record is live only with its extent and tag in place (a kill before this store leaves
  // a free record).
  __atomic_store_n(&rec.state, kRegionLive, __ATOMIC_RELEASE);
  free_records_.pop_back();
  by_tag_[tag] = id;
  by_offset_[at] = id;
  ++stats_.regions;
  stats_.allocated_bytes += size;
  return Region{id, tag, at, size};
}

std::optional<Region> Pool::FindTag(uint64_t tag) const {
  auto it = by_tag_.find(tag);
  if (it == by_tag_.end()) return std::nullopt;
  return FindRegion(it->second);
}

std::optional<Region> Pool::FindRegion(uint32_t id) const {
  if (id >= max_regions_) return std::nullopt;
  const RegionRecord& r = regions()[id];
  if (r.state != kRegionLive) return std::nullopt;
  return Region{id, r.tag, r.offset, r.bytes};
}

absl::Status Pool::Validate(const Txn& txn) const {
  if (txn.client_id == 0 || txn.txn_id == 0) {
    return absl::InvalidArgumentError("client and transaction ids must be non-zero");
  }
  if (txn.ops.empty()) {
    return absl::FailedPreconditionError("a transaction with nothing queued");
  }
  if (txn.ops.size() > max_ops_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%u ops in one transaction, at most %u", txn.ops.size(), max_ops_));
  }
  std::vector<const TxnOp*> copies;
  std::vector<uint32_t> frees;
  for (const TxnOp& op : txn.ops) {
    if (op.kind == OpKind::kCopy) {
      // 64-bit arithmetic on peer-controlled lengths: no sum can wrap.
      if (op.bytes == 0 || op.bytes > pool_bytes_ || op.src > pool_bytes_ - op.bytes ||
          op.dst > pool_bytes_ - op.bytes) {
        return absl::OutOfRangeError(
            absl::StrFormat("copy of %u bytes from %u to %u leaves the pool of %u bytes", op.bytes,
                            op.src, op.dst, pool_bytes_));
      }
      copies.push_back(&op);
    } else if (op.kind == OpKind::kFree) {
      std::optional<Region> r = FindRegion(op.region);
      if (!r.has_value() || r->tag != op.tag) {
        return absl::NotFoundError(
            absl::StrFormat("free of region %u (tag %u): no such live region", op.region, op.tag));
      }
      for (uint32_t f : frees) {
        if (f == op.region) {
          return absl::InvalidArgumentError(
              absl::StrFormat("region %u freed twice in one transaction", op.region));
        }
      }
      frees.push_back(op.region);
    } else {
      return absl::InvalidArgumentError("an op of unknown kind");
    }
  }
  // Replaying a transaction must copy the same bytes again: no destination overlaps another
  // destination or any source of the same transaction. Sorted, so hostile op counts cost
  // O(n log n).
  struct Extent {
    uint64_t start, bytes;
    bool operator<(const Extent& o) const { return start < o.start; }
  };
  std::vector<Extent> dsts;
  dsts.reserve(copies.size());
  for (const TxnOp* c : copies) dsts.push_back({c->dst, c->bytes});
  std::sort(dsts.begin(), dsts.end());
  for (size_t i = 1; i < dsts.size(); ++i) {
    if (Overlap(dsts[i - 1].start, dsts[i - 1].bytes, dsts[i].start, dsts[i].bytes)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "copies overlap: destinations [%u, +%u) and [%u, +%u) (a transaction's copies must be "
          "independent, to be replayed after a crash)",
          dsts[i - 1].start, dsts[i - 1].bytes, dsts[i].start, dsts[i].bytes));
    }
  }
  for (const TxnOp* c : copies) {
    // The destinations are disjoint and sorted: only the last one starting before the source's
    // end can reach into it.
    auto after = std::upper_bound(dsts.begin(), dsts.end(), Extent{c->src + c->bytes - 1, 0});
    if (after != dsts.begin() &&
        Overlap(std::prev(after)->start, std::prev(after)->bytes, c->src, c->bytes)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "copies overlap: the destination [%u, +%u) meets the source [%u, +%u) of the same "
          "transaction (its copies must be independent, to be replayed after a crash)",
          std::prev(after)->start, std::prev(after)->bytes, c->src, c->bytes));
    }
  }
  return absl::OkStatus();
}

ClientRecord* Pool::ClientFor(uint64_t client_id) const {
  auto it = client_index_.find(client_id);
  return it == client_index_.end() ? nullptr : &clients()[it->second];
}

std::optional<absl::StatusOr<CommitResult>> Pool::Answered(uint64_t client_id, uint64_t txn_id) {
  if (client_id == 0 || txn_id == 0) {
    return absl::InvalidArgumentError("client and transaction ids must be non-zero");
  }
  ClientRecord* record = ClientFor(client_id);
  if (record == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("client %u is not registered with this pool", client_id));
  }
  record->last_used = use_clock_++;
  if (txn_id < record->last_txn) {
    return absl::FailedPreconditionError(
        absl::StrFormat("transaction %u of client %u is older than its last one, %u: ids must "
                        "increase",
                        txn_id, client_id, record->last_txn));
  }
  if (txn_id > record->last_txn) return std::nullopt;
  // A retry (its reply was lost): answered as the first time, never applied again.
  ++stats_.duplicates;
  if (record->last_code != 0) {
    return absl::Status(
        static_cast<absl::StatusCode>(record->last_code),
        absl::StrFormat("transaction %u was refused (a retry is answered the same)", txn_id));
  }
  CommitResult result;
  result.duplicate = true;
  return result;
}

void Pool::Refuse(uint64_t client_id, uint64_t txn_id, absl::StatusCode code) {
  if (ClientFor(client_id) != nullptr && code != absl::StatusCode::kOk) {
    RecordRefusal(client_id, txn_id, code);
  }
}

void Pool::RecordRefusal(uint64_t client_id, uint64_t txn_id, absl::StatusCode code) {
  // Steps 1-5 with no ops: the refusal is recorded all-or-nothing, as an applied transaction.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  RedoHead& head = redo();
  head.client_id = client_id;
  head.txn_id = txn_id;
  head.ops = 0;
  head.code = static_cast<uint32_t>(code);
  head.checksum = RedoChecksum(head, redo_ops());
  Step(CommitStep::kRedoWritten);
  __atomic_store_n(&head.state, kRedoCommitted, __ATOMIC_RELEASE);
  Step(CommitStep::kCommitted);
  Apply(head, redo_ops());
}

absl::StatusOr<CommitResult> Pool::Commit(const Txn& txn) {
  if (std::optional<absl::StatusOr<CommitResult>> answer = Answered(txn.client_id, txn.txn_id)) {
    return *std::move(answer);
  }
  CommitResult result;
  if (absl::Status s = Validate(txn); !s.ok()) {
    // Refused: recorded too, so a retry is answered with the same refusal and an id is never
    // applied after a newer one was answered.
    RecordRefusal(txn.client_id, txn.txn_id, s.code());
    return s;
  }
  // 1: the ops and the txn's identity, state still empty. The previous commit's clear (a
  // release store) must not be reordered after these stores by the compiler.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  RedoHead& head = redo();
  RedoOp* ops = redo_ops();
  for (size_t i = 0; i < txn.ops.size(); ++i) {
    const TxnOp& op = txn.ops[i];
    RedoOp& r = ops[i];
    r = RedoOp{};
    r.kind = static_cast<uint32_t>(op.kind);
    if (op.kind == OpKind::kCopy) {
      r.a = op.src;
      r.b = op.dst;
      r.bytes = op.bytes;
      result.bytes_copied += op.bytes;
    } else {
      r.a = op.region;
      r.b = op.tag;
      ++result.freed;
    }
  }
  head.client_id = txn.client_id;
  head.txn_id = txn.txn_id;
  head.ops = static_cast<uint32_t>(txn.ops.size());
  head.code = 0;
  head.checksum = RedoChecksum(head, ops);
  Step(CommitStep::kRedoWritten);
  // 2: the commit point.
  __atomic_store_n(&head.state, kRedoCommitted, __ATOMIC_RELEASE);
  Step(CommitStep::kCommitted);
  Apply(head, ops);
  ++stats_.commits;
  return result;
}

void Pool::Record(uint64_t client_id, uint64_t txn_id, absl::StatusCode code) {
  // Commit found the record; records are taken over only between commits (RegisterClient), so a
  // replay finds it too, unless the file was edited: then there is nothing to record.
  ClientRecord* c = ClientFor(client_id);
  if (c == nullptr) {
    LOG(WARNING) << "client " << client_id << " has no record: transaction " << txn_id
                 << " applied but not recorded";
    return;
  }
  // The two fields are not one store: a kill between them is repaired by replaying the redo
  // record this runs under (Apply, for applied and refused transactions alike).
  c->last_code = static_cast<uint32_t>(code);
  __atomic_store_n(&c->last_txn, txn_id, __ATOMIC_RELEASE);
}

absl::StatusOr<ClientCredential> Pool::RegisterClient(
    const std::function<bool(uint64_t client_id)>& evictable) {
  ClientRecord* free = nullptr;
  // The victim when the table is full: the least recently used record that never answered a
  // transaction (joins that came and went: a peer churning joins takes over its own), else the
  // least recently used of all.
  ClientRecord* lru = nullptr;
  auto before = [](const ClientRecord& a, const ClientRecord& b) {
    if ((a.last_txn == 0) != (b.last_txn == 0)) return a.last_txn == 0;
    return a.last_used < b.last_used;
  };
  for (uint32_t i = 0; i < max_clients_ && free == nullptr; ++i) {
    ClientRecord& c = clients()[i];
    if (c.client_id == 0) {
      free = &c;
    } else if ((lru == nullptr || before(c, *lru)) && evictable(c.client_id)) {
      lru = &c;
    }
  }
  if (free == nullptr && lru == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%u clients are connected to this pool, the most it records", max_clients_));
  }
  ClientRecord* c = free;
  if (c == nullptr) {
    LOG(WARNING) << "client table full: client " << lru->client_id
                 << " (least recently used, not connected) is forgotten";
    c = lru;
    client_index_.erase(c->client_id);
    __atomic_store_n(&c->client_id, uint64_t{0}, __ATOMIC_RELEASE);  // given up first
  }
  ClientCredential credential;
  do {
    credential.id = RandomWord();
  } while (credential.id == 0 || client_index_.contains(credential.id));
  credential.secret = RandomWord();
  c->secret = credential.secret;
  c->last_txn = 0;
  c->last_code = 0;
  c->last_used = use_clock_++;
  // Taken last: a kill before this store leaves the record free.
  __atomic_store_n(&c->client_id, credential.id, __ATOMIC_RELEASE);
  client_index_[credential.id] = static_cast<uint32_t>(c - clients());
  return credential;
}

absl::StatusOr<ClientRecord*> Pool::Find(const ClientCredential& credential) const {
  ClientRecord* c = credential.id == 0 ? nullptr : ClientFor(credential.id);
  if (c == nullptr) {
    return absl::UnauthenticatedError(absl::StrFormat(
        "client %u is not known to this pool (never registered, left, or forgotten when the "
        "client table was full)",
        credential.id));
  }
  if (c->secret != credential.secret) {
    return absl::UnauthenticatedError(
        absl::StrFormat("client %u: the secret does not match", credential.id));
  }
  return c;
}

absl::StatusOr<uint64_t> Pool::Authenticate(const ClientCredential& credential) {
  absl::StatusOr<ClientRecord*> c = Find(credential);
  if (!c.ok()) return c.status();
  (*c)->last_used = use_clock_++;
  return (*c)->last_txn;
}

absl::Status Pool::ForgetClient(const ClientCredential& credential) {
  absl::StatusOr<ClientRecord*> c = Find(credential);
  if (!c.ok()) return c.status();
  client_index_.erase(credential.id);
  __atomic_store_n(&(*c)->client_id, uint64_t{0}, __ATOMIC_RELEASE);
  return absl::OkStatus();
}

void Pool::Apply(const RedoHead& head, const RedoOp* ops) {
  // 3: copies first (a region freed by the same transaction may be a source), then frees.
  for (uint32_t i = 0; i < head.ops; ++i) {
    if (ops[i].kind != static_cast<uint32_t>(OpKind::kCopy)) continue;
    std::memmove(data() + ops[i].b, data() + ops[i].a, ops[i].bytes);
    Step(CommitStep::kOpApplied, i);
  }
  for (uint32_t i = 0; i < head.ops; ++i) {
    if (ops[i].kind != static_cast<uint32_t>(OpKind::kFree)) continue;
    const uint32_t id = static_cast<uint32_t>(ops[i].a);
    RegionRecord& rec = regions()[id];
    if (rec.state == kRegionLive && rec.tag == ops[i].b) {  // replayed: may be free already
      __atomic_store_n(&rec.state, 0u, __ATOMIC_RELEASE);
      by_tag_.erase(rec.tag);
      by_offset_.erase(rec.offset);
      free_records_.push_back(id);
      --stats_.regions;
      stats_.allocated_bytes -= rec.bytes;
    }
    Step(CommitStep::kOpApplied, i);
  }
  // 4: the client's record.
  Record(head.client_id, head.txn_id, static_cast<absl::StatusCode>(head.code));
  Step(CommitStep::kRecorded);
  // 5: done.
  __atomic_store_n(&redo().state, uint64_t{0}, __ATOMIC_RELEASE);
  Step(CommitStep::kCleared);
}

}  // namespace rmem
