#include "transport/shm/partition_table.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "util/errno_status.h"

namespace transport::shm {
namespace {

constexpr uint64_t kMagic = 0x48455244'50415254;  // "HERDPART"

// A cut pair as one word: the smaller pid high, the larger low (0 is an empty slot: pids are
// positive).
uint64_t PairKey(int32_t a, int32_t b) {
  const auto lo = static_cast<uint32_t>(std::min(a, b));
  const auto hi = static_cast<uint32_t>(std::max(a, b));
  return (uint64_t{lo} << 32) | hi;
}

// Holds the file's flock for its scope: writers (and the first opener's initialisation) take
// it, readers never do.
class FileLock {
 public:
  explicit FileLock(int fd) : fd_(fd) { locked_ = flock(fd_, LOCK_EX) == 0; }
  ~FileLock() {
    if (locked_) flock(fd_, LOCK_UN);
  }
  bool locked() const { return locked_; }

 private:
  int fd_;
  bool locked_;
};

}  // namespace

struct PartitionTable::Layout {
  std::atomic<uint64_t> magic;
  std::atomic<uint32_t> cut_count;  // non-empty slots: IsCut's fast "nothing cut" answer
  uint32_t reserved;
  std::atomic<uint64_t> slots[kMaxCuts];  // PairKey, or 0
};

absl::StatusOr<PartitionTable> PartitionTable::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return util::ErrnoStatus(absl::StatusCode::kInvalidArgument,
                             absl::StrFormat("partition file %s", path));
  }
  auto fail = [&](absl::Status status) {
    close(fd);
    return status;
  };
  constexpr size_t kFileBytes = sizeof(Layout);
  FileLock lock(fd);
  if (!lock.locked()) return fail(util::ErrnoStatus(absl::StatusCode::kInternal, "flock"));
  struct stat st;
  if (fstat(fd, &st) != 0) return fail(util::ErrnoStatus(absl::StatusCode::kInternal, "fstat"));
  const bool fresh = st.st_size == 0;
  if (!S_ISREG(st.st_mode) || (!fresh && static_cast<uint64_t>(st.st_size) != kFileBytes)) {
    return fail(absl::InvalidArgumentError(
        absl::StrFormat("partition file %s: %d bytes, not a partition table (%d bytes)", path,
                        st.st_size, kFileBytes)));
  }
  if (fresh && ftruncate(fd, kFileBytes) != 0) {
    return fail(util::ErrnoStatus(absl::StatusCode::kInternal, "ftruncate"));
  }
  void* map = mmap(nullptr, sizeof(Layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return fail(util::ErrnoStatus(absl::StatusCode::kInternal, "mmap"));
  auto* layout = static_cast<Layout*>(map);
  if (fresh) {
    layout->magic.store(kMagic, std::memory_order_release);
  } else if (layout->magic.load(std::memory_order_acquire) != kMagic) {
    munmap(map, sizeof(Layout));
    return fail(absl::InvalidArgumentError(
        absl::StrFormat("partition file %s: not a partition table (bad magic)", path)));
  }
  return PartitionTable(layout, fd);
}

PartitionTable::PartitionTable(PartitionTable&& other) noexcept
    : layout_(std::exchange(other.layout_, nullptr)), fd_(std::exchange(other.fd_, -1)) {}

PartitionTable& PartitionTable::operator=(PartitionTable&& other) noexcept {
  if (this != &other) {
    this->~PartitionTable();
    layout_ = std::exchange(other.layout_, nullptr);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

PartitionTable::~PartitionTable() {
  if (layout_ != nullptr) munmap(layout_, sizeof(Layout));
  if (fd_ >= 0) close(fd_);
}

absl::Status PartitionTable::Cut(int32_t a, int32_t b) {
  if (a <= 0 || b <= 0 || a == b) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cut %d %d: two different processes (pids > 0)", a, b));
  }
  const uint64_t key = PairKey(a, b);
  FileLock lock(fd_);
  std::atomic<uint64_t>* free_slot = nullptr;
  for (std::atomic<uint64_t>& slot : layout_->slots) {
    const uint64_t now = slot.load(std::memory_order_relaxed);
    if (now == key) return absl::OkStatus();
    if (now == 0 && free_slot == nullptr) free_slot = &slot;
  }
  if (free_slot == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cut %d %d: %d pairs are cut already", a, b, kMaxCuts));
  }
  free_slot->store(key, std::memory_order_relaxed);
  layout_->cut_count.fetch_add(1, std::memory_order_release);
  return absl::OkStatus();
}

void PartitionTable::Heal(int32_t a, int32_t b) {
  const uint64_t key = PairKey(a, b);
  FileLock lock(fd_);
  for (std::atomic<uint64_t>& slot : layout_->slots) {
    if (slot.load(std::memory_order_relaxed) == key) {
      slot.store(0, std::memory_order_relaxed);
      layout_->cut_count.fetch_sub(1, std::memory_order_release);
    }
  }
}

void PartitionTable::HealAll() {
  FileLock lock(fd_);
  for (std::atomic<uint64_t>& slot : layout_->slots) slot.store(0, std::memory_order_relaxed);
  layout_->cut_count.store(0, std::memory_order_release);
}

bool PartitionTable::IsCut(int32_t a, int32_t b) const {
  // A WR racing a Cut or Heal may see either side of it, as a packet in flight when a link goes
  // down may or may not arrive: no ordering beyond the words themselves is needed.
  if (layout_->cut_count.load(std::memory_order_relaxed) == 0) return false;
  const uint64_t key = PairKey(a, b);
  for (const std::atomic<uint64_t>& slot : layout_->slots) {
    if (slot.load(std::memory_order_relaxed) == key) return true;
  }
  return false;
}

std::vector<std::pair<int32_t, int32_t>> PartitionTable::Cuts() const {
  std::vector<std::pair<int32_t, int32_t>> cuts;
  for (const std::atomic<uint64_t>& slot : layout_->slots) {
    const uint64_t key = slot.load(std::memory_order_relaxed);
    if (key != 0) {
      cuts.emplace_back(static_cast<int32_t>(key >> 32), static_cast<int32_t>(key & 0xffffffff));
    }
  }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

}  // namespace transport::shm
