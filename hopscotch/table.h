// A hopscotch table in one file (format.h), mapped MAP_SHARED: one writer inserts and updates
// while one-sided readers copy neighbourhoods (neighbourhood.h).
//
// Writer ordering (one writer thread; every store to the mapping is a 64-bit atomic store, word 0
// of a line with release order; on x86 these are plain stores in program order):
//   fill(e, key, value)   word 0 := info {empty, version+1 (odd: busy)}; release fence;
//                         words 1..7 (key, value); word 0 := info {occupied, version+2}
//   insert new key k      find a free bucket e (linear probe from home h); while e - h >= H,
//                         move an item from below e into e (displacement, below) and take its
//                         old bucket as e; then fill(e, k, v); then set hop bit e - h in h's
//                         word 0: that store is the insert's linearization point
//   move x: s -> e, home g (s < e < g + H: items only ever move to HIGHER buckets)
//                         fill(e, x); ONE store of g's word 0 setting bit e - g and clearing
//                         bit s - g; then word 0 of s := {empty, version+2}
//   update k at p, home h if a free bucket f in (p, h + H) exists: move k to f with the new value
//                         (fill, switch, clear: never torn, crash-atomic); otherwise in place:
//                         word 0 := {occupied, odd}; words 4..7; word 0 := {occupied, even}
// Why a snapshot never gives a wrong value: a line is copied at one instant (model (1)); a clean
// occupied line is a complete fill or a complete update, so its key and value belong together.
// Why no false miss for a key x present before the copy began: x occupies buckets
// p0 < p1 < ... (it only moves up), sitting at p_i from a_i to c_i with a_(i+1) < c_i (copy
// before clear). Lines are copied in ascending order (model (2)) at t_q. If t_(p0) >= c_0 then
// t_(p1) > t_(p0) >= c_0 > a_1, so either x is seen at p1 or t_(p1) >= c_1, and so on; the last
// position is never cleared, so some clean line shows x, or the line holding x is busy (an
// in-place update) and the reader reports torn. The reader scans all 32 lines when the hop bits
// do not lead to the key, so a stale hop bit cannot hide x.
//
// Durability (kill -9; the page cache of a MAP_SHARED file outlives the process): the file is
// the memory image at an instruction boundary of the writer, i.e. any prefix of the stores
// above. Every prefix reopens consistent: a busy empty line (fill cut short) holds no key yet;
// an occupied line no hop bit names is an unfinished insert (absent: never acknowledged) or
// the left-behind source or destination of a move (the other copy is named); the hop switch is
// one store. Open(writable) of a dirty file repairs exactly these (busy -> clean, unnamed
// occupied -> empty) and recounts; an in-place update cut short keeps its key but may leave a
// mix of old and new value bytes (not acknowledged; the only non-atomic case).
// Power failure (TableOptions::persistence = kPowerFailure; persist.h): the media may then hold
// any subset of the unflushed 8-byte words, not a prefix, so the writer makes each step durable
// before the step that depends on it: a fill's line before the hop bit (or hop switch) that
// publishes it, the hop switch before the clear of the source, the dirty mark in the header
// before the first bucket store, and all of an Insert's lines before it returns. Recovery is
// then the same: an unpublished fill is unnamed whatever part of it reached the media, the
// source is cleared only once the switch naming the destination is durable, and an in-place
// update cut short is the same mixed value as above. On a MAP_SYNC mapping (DAX file) or a
// device-DAX device each point is a cache-line write-back and SFENCE; on a page-cache file an
// msync of the touched pages. The default, kProcessCrash, does none of this.
#ifndef HERD_HOPSCOTCH_TABLE_H_
#define HERD_HOPSCOTCH_TABLE_H_

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hopscotch/format.h"
#include "hopscotch/neighbourhood.h"
#include "hopscotch/persist.h"

namespace hopscotch {

// The header's checksum (bytes 0..55) and its validation against a file of `file_bytes` (the
// table must fill it exactly) or, with `device`, a device of `file_bytes` (the table must fit
// in it); the error says what is wrong, without the path (Open adds it).
uint64_t HeaderChecksum(const Header& header);
absl::Status ValidateHeader(const Header& header, uint64_t file_bytes, bool device = false);

// How far an insert probes for a free bucket before it calls the table full.
inline constexpr uint64_t kMaxProbe = 1024;

struct TableStats {
  uint64_t inserts = 0;           // new keys
  uint64_t updates = 0;           // existing keys rewritten
  uint64_t updates_in_place = 0;  // of which without a free bucket above: rewritten in place
  uint64_t moves = 0;             // displacements
  uint32_t max_distance = 0;      // the largest bucket - home of any key placed by this writer
  // Set by Open of a dirty file (the writer died): what the repair found.
  uint64_t recovered_busy = 0;
  uint64_t recovered_orphans = 0;
  uint64_t recovered_dangling = 0;  // hop bits naming no key of theirs (corruption, not a kill)
};

// Which part of a sharded key space a table holds (format.h: shard, shards).
struct Sharding {
  uint32_t shard = 0;
  uint32_t shards = 1;
  bool Holds(std::string_view key) const;
};

struct TableOptions {
  // What an acknowledged Insert survives (persist.h). kPowerFailure costs, per ordering point of
  // an Insert, a cache-line write-back and SFENCE (DAX) or an msync (page-cache file).
  Persistence persistence = Persistence::kProcessCrash;
  // Where a character device's size and alignment are read:
  // SYSFS_ROOT/dev/char/MAJOR:MINOR/{size,align} (tests point it at fake files).
  std::string sysfs_root = "/sys";
  // Tests, kPowerFailure only: sees every store of the writer and every range made durable.
  // Not owned; must outlive the table (Close reports its flushes too).
  WriteObserver* observer = nullptr;
  // Open(writable = false) of a regular file maps it MAP_PRIVATE instead of MAP_SHARED: what a
  // verbs device needs to register it on Linux before 6.2 (which pins even READ-only MRs for
  // writing: a read-only SHARED file mapping fails ibv_reg_mr with EFAULT, a private one is
  // registered by copying its pages into pinned anonymous memory); the shm fabric needs the
  // shared mapping (its peers map the same file). hop_server tries shared first.
  bool private_when_read_only = false;
  // Holds the file's lock for the table's life (table_lock.h: exclusive when writable, shared
  // when read-only), so that a second writer, or hop_build replacing a file being served, is
  // refused. Tests only turn it off: a reader watching a file its writer holds, and /dev/zero
  // standing in for a device-DAX device (one inode shared by every test process).
  bool lock = true;
  // Create only: leaves the header zero, so that no Open accepts the file, until Publish writes
  // it; a table closed without Publish stays "not a hopscotch table". hop_build builds this way:
  // a build that fails or dies part way leaves no partial table anyone could serve.
  bool defer_header = false;
};

class Table {
 public:
  // A new table of `home_buckets` (a power of two, 1..2^32) empty home buckets. Writable. The
  // path is a regular file (created, or replaced if it exists) or a device-DAX character device
  // (e.g. /dev/dax0.0: its first FileBytes(home_buckets) bytes are zeroed and mapped, the
  // mapping rounded up to the device's alignment; the rest of the device is left alone). A path
  // another process holds (TableOptions::lock) is refused before anything in it changes.
  static absl::StatusOr<Table> Create(const std::string& path, uint64_t home_buckets,
                                      uint64_t seed = 0, Sharding sharding = {},
                                      const TableOptions& options = {});
  // The same in anonymous memory (tests).
  static absl::StatusOr<Table> CreateInMemory(uint64_t home_buckets, uint64_t seed = 0,
                                              const TableOptions& options = {});
  // Maps and validates an existing table (a regular file exactly the table's size, or a
  // device-DAX character device at least that big); errors name the path and what is wrong,
  // including a file another process holds (TableOptions::lock). Writable: marks it dirty until
  // Close, and repairs it first if its writer died. A file marked clean is still checked for
  // busy lines (a clean writer leaves none; one there would make every lookup reaching it spin
  // and end torn): writable, it is repaired as a dirty one; read-only, refused. A file replaced
  // at the path while it is being opened (hop_build renames a new table over it) is let go and
  // the path opened again: the table served is always the one the path names.
  static absl::StatusOr<Table> Open(const std::string& path, bool writable,
                                    const TableOptions& options = {});

  Table(Table&& other) noexcept;
  Table& operator=(Table&& other) noexcept;
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  ~Table();  // Close(), errors logged

  // Inserts `key` or rewrites its value. InvalidArgument for a key ValidateKey rejects,
  // ResourceExhausted when no free bucket can be brought into its neighbourhood (the moves
  // already made stay: each one is a valid state); under kPowerFailure, Internal when a flush
  // (msync) fails, before any later step of the protocol is stored.
  absl::Status Insert(std::string_view key, const Value& value);
  // A local one-sided lookup: copies the neighbourhood (CopyLines) and reads it again while torn
  // (up to `max_reads` copies; rereads counts the extra ones).
  LookupResult Lookup(std::string_view key, int max_reads = 1000) const;
  // Every occupied bucket is clean, well formed, within H - 1 of its home, named by its home's
  // hop info; every hop bit names such a bucket; no key twice; the count matches.
  absl::Status CheckInvariants() const;
  // Makes the buckets durable (msync, or cache-line flushes on a device), then writes the item
  // count and marks the file clean (made durable in turn), and unmaps. Idempotent.
  absl::Status Close();
  // A table created with TableOptions::defer_header: makes the buckets durable, then writes the
  // whole header (clean, with the item count), durable in turn, and unmaps: from here on the
  // file is a table. Any other table: Close().
  absl::Status Publish();

  uint64_t home_buckets() const { return home_buckets_; }
  uint64_t total_buckets() const { return home_buckets_ + kNeighbourhood - 1; }
  uint64_t seed() const { return seed_; }
  const Sharding& sharding() const { return sharding_; }
  uint64_t items() const { return items_; }
  uint64_t file_bytes() const { return FileBytes(home_buckets_); }
  // The mapping's first byte (the header): what a server registers for remote READ.
  const uint8_t* data() const { return base_; }
  bool map_sync() const { return map_sync_; }
  // A device-DAX character device rather than a regular file.
  bool device() const { return device_; }
  Persistence persistence() const {
    return persister_.active() ? Persistence::kPowerFailure : Persistence::kProcessCrash;
  }
  const TableStats& stats() const { return stats_; }
  uint64_t HomeOf(std::string_view key) const;
  // The neighbourhood of home bucket `home`: what a client READs (file offset
  // kHeaderBytes + home * kBucketBytes, kNeighbourhoodBytes long).
  const uint8_t* NeighbourhoodOf(uint64_t home) const { return Bucket(home); }

 private:
  Table() = default;
  // One attempt of Open: kAborted when the path came to name another file before the lock.
  static absl::StatusOr<Table> OpenOnce(const std::string& path, bool writable,
                                        const TableOptions& options);
  // Maps `bytes` of `fd` (-1: anonymous memory); `device`: fd is a device-DAX device.
  static absl::StatusOr<Table> Map(const std::string& path, int fd, uint64_t bytes, bool writable,
                                   bool device, const TableOptions& options);
  uint8_t* Bucket(uint64_t i) const { return base_ + kHeaderBytes + i * kBucketBytes; }
  // Every writer store to a bucket goes through Store (the Persister sees it under
  // kPowerFailure); Durable is an ordering point of table.h's protocol.
  void Store(uint8_t* bucket, int w, uint64_t value,
             std::memory_order order = std::memory_order_relaxed);
  // Word 0 with release order: everything stored before is visible first.
  void StoreWord0(uint8_t* bucket, uint64_t w0) { Store(bucket, 0, w0, std::memory_order_release); }
  absl::Status Durable();
  void Fill(uint64_t e, const uint8_t* image);
  absl::Status Move(uint64_t s, uint64_t e, uint64_t home);
  void Recover();
  // How many buckets are busy (a clean writer leaves none), the lowest in *first.
  uint64_t BusyLines(uint64_t* first) const;
  // Writes a TableOptions::defer_header table's header (dirty), durable on return.
  absl::Status MakeHeader();
  // Close (publish = false) or Publish.
  absl::Status Finish(bool publish);
  void Release();

  std::string path_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  bool writable_ = false;
  bool map_sync_ = false;
  bool device_ = false;
  // False while a TableOptions::defer_header table is unpublished: Close leaves the header zero.
  bool header_made_ = true;
  Persister persister_;
  uint64_t home_buckets_ = 0;
  uint64_t seed_ = 0;
  Sharding sharding_;
  uint64_t items_ = 0;
  TableStats stats_;
};

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_TABLE_H_
