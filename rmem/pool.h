// The remote-memory server's pool (issue 18): the data area clients reach with one-sided
// READ/WRITE, the regions allocated in it (each tied to a tag), and transactions of queued
// copies and frees that the server applies all-or-nothing, even if it is killed while applying
// one, and at most once per transaction id.
//
// Crash model: a kill -9 of the server (the file is MAP_SHARED: the page cache outlives the
// process; stores reach it in program order, x86-TSO), so the file after a kill is the memory as
// of some instruction boundary of the writer. Power failure would need flushes on top: not done.
//
// Commit(txn), the only path that changes data or frees regions on a client's behalf:
//   1. the ops and the txn's identity are written to the redo area (state still empty)
//   2. state := kRedoCommitted                         <- the commit point (one 8-byte store)
//   3. every copy (memmove, source to destination), then every free (record state := 0)
//   4. the client's record := {client_id, txn_id, outcome}
//   5. state := 0
// A refused transaction takes the same steps with no ops and its refusal as the outcome, so the
// client's record is never half-written either. Open replays 3-5 when it finds state ==
// kRedoCommitted. That is idempotent because Commit
// refuses a transaction in which a destination overlaps another destination or any source:
// replaying copies that already ran copies the same bytes again. A kill before 2 leaves no trace.
//
// Threading: one thread (the server's control thread) calls everything; readers of the data
// area are clients' one-sided READs, which see copies land with no atomicity (rmem_put/get are
// not atomic: the client library's shadow pages are how a client gets atomic commits).
#ifndef HERD_RMEM_POOL_H_
#define HERD_RMEM_POOL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rmem/format.h"
#include "rmem/types.h"

namespace rmem {

struct PoolOptions {
  // A file (created if missing, its contents kept across restarts); "": memory (a memfd, so the
  // shm fabric can map it into peers like a file).
  std::string path;
  uint64_t pool_bytes = 0;  // the data area; a multiple of kRegionAlign
  uint32_t max_regions = kDefaultMaxRegions;
  uint32_t max_clients = kDefaultMaxClients;
  uint32_t max_ops = kDefaultMaxOps;
  bool hugepages = true;  // pools in memory: try MFD_HUGETLB first (falls back quietly)
};

struct CommitResult {
  bool duplicate = false;  // txn_id was already applied: nothing was done now
  uint64_t bytes_copied = 0;
  uint32_t freed = 0;
};

// Where a test may stop a commit (or Open's replay) to play a kill at that instant.
enum class CommitStep {
  kRedoWritten,  // step 1 done, not committed
  kCommitted,    // step 2 done
  kOpApplied,    // one op of step 3 done (the hook's `op` says which)
  kRecorded,     // step 4 done
  kCleared,      // step 5 done
};
using StepHook = std::function<void(CommitStep step, uint32_t op)>;

struct PoolStats {
  uint32_t regions = 0;
  uint64_t allocated_bytes = 0;
  uint64_t commits = 0, duplicates = 0;
  bool replayed = false;  // Open found a committed transaction and applied it
};

class Pool {
 public:
  // A new pool (an existing file is replaced). Errors name the file.
  static absl::StatusOr<Pool> Create(const PoolOptions& options);
  // An existing pool file: validated (a truncated, foreign or damaged file is an error naming
  // what is wrong), and a transaction committed but not finished when its server died is applied.
  static absl::StatusOr<Pool> Open(const std::string& path, StepHook replay_hook = nullptr);

  Pool(Pool&& other) noexcept;
  Pool& operator=(Pool&& other) noexcept;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool();

  // The region tied to `tag`, or a new one of `bytes` (rounded up to kRegionAlign, zero-filled)
  // tied to it.
  // InvalidArgument: tag 0, bytes 0 or past the pool; FailedPrecondition: the tag is tied to a
  // region of another size; ResourceExhausted: no room (or no free record).
  absl::StatusOr<Region> Alloc(uint64_t bytes, uint64_t tag);
  std::optional<Region> FindTag(uint64_t tag) const;
  std::optional<Region> FindRegion(uint32_t id) const;

  // A new client's record, with a fresh random id and secret. When the table is full, a record
  // whose client `evictable(id)` allows (the server passes: not connected) is taken over, the
  // least recently used among those that never answered a transaction first, else among all: that
  // client can no longer resume, and a retry of its last transaction is refused (Unauthenticated),
  // never applied again. ResourceExhausted when none may go.
  absl::StatusOr<ClientCredential> RegisterClient(
      const std::function<bool(uint64_t client_id)>& evictable);
  // The client's last transaction id (0: none yet) when the credential names a live record (and
  // marks it used); Unauthenticated otherwise (a wrong secret, a forgotten or taken-over
  // record), saying which.
  absl::StatusOr<uint64_t> Authenticate(const ClientCredential& credential);
  // Frees a client's record (a client that leaves for good). Unauthenticated as above.
  absl::Status ForgetClient(const ClientCredential& credential);

  // Checks a transaction as Commit would, changing nothing.
  absl::Status Validate(const Txn& txn) const;
  // Applies `txn` all-or-nothing (above). Transaction ids must increase per client: a retry of
  // the client's last transaction (same id) is answered as the first time, applied or refused,
  // and never applied again; an older id is FailedPrecondition. Refused transactions are recorded
  // too. The client must be registered (FailedPrecondition otherwise); authenticating the caller
  // is the server's job (it binds a credential to a session).
  absl::StatusOr<CommitResult> Commit(const Txn& txn);
  // Commit's first step, for a caller that checks more before committing (the server checks
  // ownership): the answer to a transaction id already seen (a retry: as the first time; an
  // older one: FailedPrecondition), or to bad ids or an unregistered client; nullopt for a new id.
  std::optional<absl::StatusOr<CommitResult>> Answered(uint64_t client_id, uint64_t txn_id);
  // Records that a new transaction id was refused before Commit saw it (a retry is then answered
  // with `code`, and the id is never applied).
  void Refuse(uint64_t client_id, uint64_t txn_id, absl::StatusCode code);
  void set_step_hook(StepHook hook) { hook_ = std::move(hook); }

  uint8_t* data() const { return base_ + layout_.data_offset; }
  uint64_t data_bytes() const { return pool_bytes_; }
  uint32_t max_ops() const { return max_ops_; }
  const PoolStats& stats() const { return stats_; }
  // The file's descriptor (a memfd for a pool in memory): what the shm fabric maps into peers.
  int fd() const { return fd_; }

 private:
  Pool() = default;
  static absl::StatusOr<Pool> Map(const std::string& path, int fd, const Layout& layout,
                                  bool hugepages);
  absl::Status Load();  // validates the tables and builds the indexes
  void Apply(const RedoHead& head, const RedoOp* ops);  // steps 3-5
  // Records a refusal of `txn_id` through the redo record (steps 1-5, no ops).
  void RecordRefusal(uint64_t client_id, uint64_t txn_id, absl::StatusCode code);
  void Step(CommitStep step, uint32_t op = 0) const {
    if (hook_) hook_(step, op);
  }
  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  RegionRecord* regions() const {
    return reinterpret_cast<RegionRecord*>(base_ + layout_.region_offset);
  }
  ClientRecord* clients() const {
    return reinterpret_cast<ClientRecord*>(base_ + layout_.client_offset);
  }
  RedoHead& redo() const { return *reinterpret_cast<RedoHead*>(base_ + layout_.redo_offset); }
  RedoOp* redo_ops() const {
    return reinterpret_cast<RedoOp*>(base_ + layout_.redo_offset + kRedoHeadBytes);
  }
  ClientRecord* ClientFor(uint64_t client_id) const;  // its record, or nullptr
  // Stores a client's last transaction and its outcome in its record (none: nothing to store).
  void Record(uint64_t client_id, uint64_t txn_id, absl::StatusCode code);
  // The live record `credential` names, or Unauthenticated.
  absl::StatusOr<ClientRecord*> Find(const ClientCredential& credential) const;
  void Release();

  std::string path_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t mapped_bytes_ = 0;  // layout_.file_bytes, rounded up to a huge page for hugetlb
  Layout layout_;
  uint64_t pool_bytes_ = 0;
  uint32_t max_regions_ = 0, max_clients_ = 0, max_ops_ = 0;
  // Indexes rebuilt by Load: live regions by tag and by offset (first-fit allocation walks the
  // gaps), client records by id, and free record slots.
  absl::flat_hash_map<uint64_t, uint32_t> by_tag_;
  std::map<uint64_t, uint32_t> by_offset_;
  absl::flat_hash_map<uint64_t, uint32_t> client_index_;
  std::vector<uint32_t> free_records_;
  uint64_t use_clock_ = 1;  // the next ClientRecord::last_used (Load: past every record's)
  StepHook hook_;
  PoolStats stats_;
};

// The checksum of a redo head (its identity and ops) as Commit writes it.
uint64_t RedoChecksum(const RedoHead& head, const RedoOp* ops);

}  // namespace rmem

#endif  // HERD_RMEM_POOL_H_
