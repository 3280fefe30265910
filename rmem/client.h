// rmem's client library: the six operations of the remote-memory design, over one RC QP to
// rmem_server (commands by SEND/RECV, data by one-sided READ/WRITE; wire.h).
//
//   rmem_alloc(size, tag)   Client::Alloc   the region tied to tag (created if none)
//   rmem_free(region)       Client::Free    queued: applied by the next TxnGo
//   rmem_cp(dst, src, n)    Client::Cp      queued: applied by the next TxnGo
//   rmem_txn_go()           Client::TxnGo   the server applies every queued op, all-or-nothing,
//                                           even if this client dies right after sending it
//   rmem_put(region, ...)   Client::Put     one-sided WRITE; not atomic
//   rmem_get(region, ...)   Client::Get     one-sided READ; not atomic
//
// Queued ops travel in batches: Free and Cp fill a command buffer locally and send it (one round
// trip) only when it holds kMaxOpsPerCommand ops; TxnGo carries the rest. So the server's
// checks of a queued op (ownership, bounds, overlaps) are reported by the call that sends it:
// the Free or Cp that filled a batch, or TxnGo. Any refusal ends the transaction (every op
// queued so far is discarded on the server and here).
//
// Identity: the server gives a new client a credential (an id and a secret). A client that
// reconnects with ClientOptions::resume is the same client: last_txn() says which transaction
// it was answered last, and RetryTxnGo asks what became of one whose reply was lost (answered
// as the first time, never applied twice).
//
// Not thread-safe: one thread per Client (each has its own QP).
#ifndef HERD_RMEM_CLIENT_H_
#define HERD_RMEM_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "rmem/types.h"
#include "rmem/wire.h"
#include "transport/control/message_channel.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

namespace rmem {

// The bounce buffer Put and Get copy through when the caller's memory is not registered.
inline constexpr uint64_t kDefaultStagingBytes = 1 << 20;
// Send WRs one doorbell may carry: a command's SEND and the WRITEs chained before it.
inline constexpr uint32_t kMaxChainedWrites = kMaxOpsPerCommand;

struct ClientOptions {
  std::string server;  // host:port of rmem_server's control port
  transport::DeviceOptions device;
  ClientCredential resume;                     // id 0: join as a new client
  absl::Duration timeout = absl::Seconds(10);  // joining, and each reply or completion
  uint64_t staging_bytes = kDefaultStagingBytes;
};

// A region this client may reach: its name (tag) and its place in the server's memory.
struct RemoteRegion {
  uint64_t tag = 0;
  uint64_t addr = 0;  // the server's address of its first byte (what READ/WRITE name)
  uint32_t rkey = 0;  // valid on this client's QP only (the server's PD for this client)
  uint64_t bytes = 0;
};

struct TxnResult {
  uint64_t txn_id = 0;
  uint64_t bytes_copied = 0;
  uint32_t freed = 0;
  bool duplicate = false;  // answered before: this retry applied nothing
};

// One WRITE to chain before a command (the shadow layer's dirty runs): `bytes` at `local` (in
// memory from AllocateLocal) onto `offset` of `region`.
struct ChainedWrite {
  const uint8_t* local = nullptr;
  uint64_t bytes = 0;
  RemoteRegion region;
  uint64_t offset = 0;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  absl::StatusOr<RemoteRegion> Alloc(uint64_t bytes, uint64_t tag);
  absl::Status Free(const RemoteRegion& region);
  absl::Status Cp(const RemoteRegion& dst, uint64_t dst_offset, const RemoteRegion& src,
                  uint64_t src_offset, uint64_t bytes);
  // Applies the queued ops under the next transaction id. Unavailable or DeadlineExceeded when
  // the reply did not come: the transaction may or may not be applied; reconnect (resume) and
  // RetryTxnGo(that id) to learn which.
  absl::StatusOr<TxnResult> TxnGo();
  // Asks about transaction `txn_id` again with nothing queued: answered as it was the first
  // time if the server saw it (applied: duplicate = true; refused: the same error), refused
  // with FailedPrecondition ("nothing queued") if it never did, which also burns the id.
  absl::StatusOr<TxnResult> RetryTxnGo(uint64_t txn_id);
  absl::Status Put(const RemoteRegion& region, uint64_t offset, const void* src, uint64_t bytes);
  absl::Status Get(const RemoteRegion& region, uint64_t offset, void* dst, uint64_t bytes);
  // Frees this client's identity on the server (it leaves for good; queued ops are discarded).
  absl::Status Forget();

  // Registered local memory (owned by the client, zero-filled): Put and Get from it, and the
  // chained WRITEs, copy nothing.
  absl::StatusOr<uint8_t*> AllocateLocal(uint64_t bytes);
  // Sends the queued ops and `writes`' WRITEs with one doorbell (the WRITEs first: an RC QP
  // places them before the server sees the command), then a TxnGo. The shadow layer's commit.
  absl::StatusOr<TxnResult> WriteAndCommit(absl::Span<const ChainedWrite> writes);

  const ClientCredential& credential() const { return credential_; }
  bool resumed() const { return resumed_; }
  uint64_t last_txn() const { return last_txn_; }  // the last id this client was answered
  uint32_t max_ops() const { return max_ops_; }
  uint64_t pool_bytes() const { return pool_bytes_; }  // the server's pool (its data area)
  size_t queued() const { return batch_ops_ + sent_ops_; }
  // Tests: called once a TxnGo's command has left this client (its SEND completed), before the
  // reply is awaited; a test kills the client there.
  void set_on_txn_sent(std::function<void()> hook) { on_txn_sent_ = std::move(hook); }
  transport::Device& device() { return *device_; }

 private:
  explicit Client(const ClientOptions& options) : options_(options) {}
  absl::Status Open();
  absl::Status Join();
  // Appends an op to the batch, sending a full batch first (kQueue).
  absl::Status Queue(const WireOp& op);
  // Sends the batch as `kind` with `a`, after `writes`' WRITEs, and awaits the reply.
  absl::StatusOr<ReplyHeader> Exchange(CommandKind kind, uint64_t a, uint64_t b,
                                       absl::Span<const ChainedWrite> writes = {});
  absl::StatusOr<TxnResult> Go(uint64_t txn_id, absl::Span<const ChainedWrite> writes);
  // Fills wrs_/sges_ with `writes`' WRITEs (unsignaled, chained) and `extra` blank WRs after
  // them (chained to the last WRITE); checks each WRITE first.
  absl::Status ChainWrites(absl::Span<const ChainedWrite> writes, size_t extra);
  // One-sided READ or WRITE of [local, +bytes) (registered) at `remote` of `region`; waits.
  absl::Status Transfer(bool write, const RemoteRegion& region, uint64_t offset, uint8_t* local,
                        uint32_t lkey, uint64_t bytes);
  // The lkey of registered local memory holding [p, +bytes), or 0.
  uint32_t LkeyOf(const void* p, uint64_t bytes) const;
  absl::Status CheckRange(const RemoteRegion& region, uint64_t offset, uint64_t bytes) const;
  absl::Status PostReceive(uint32_t slot);
  // Polls until `want` completions arrived (every one successful), or the deadline.
  absl::Status Await(size_t want, absl::Time deadline, std::vector<transport::Completion>* got);
  absl::Status Broken(absl::Status why);  // marks the client unusable and returns why

  ClientOptions options_;
  std::unique_ptr<transport::control::MessageChannel> control_;
  std::unique_ptr<transport::Device> device_;
  std::unique_ptr<transport::ProtectionDomain> pd_;
  std::unique_ptr<transport::CompletionQueue> cq_;
  // [command | replies (kCommandSlots) | staging], one MR.
  std::unique_ptr<transport::SharedMemory> buffers_;
  std::unique_ptr<transport::MemoryRegion> buffers_mr_;
  struct Local {
    std::unique_ptr<transport::SharedMemory> memory;
    std::unique_ptr<transport::MemoryRegion> mr;
  };
  std::vector<Local> locals_;
  std::unique_ptr<transport::QueuePair> qp_;
  ClientCredential credential_;
  bool resumed_ = false;
  uint64_t last_txn_ = 0;
  uint32_t max_ops_ = 0;
  uint64_t pool_bytes_ = 0;
  uint64_t seq_ = 0;
  uint32_t batch_ops_ = 0;  // ops in the command buffer, not sent yet
  size_t sent_ops_ = 0;     // ops queued on the server (sent in kQueue batches)
  absl::Status broken_;
  std::function<void()> on_txn_sent_;
  std::vector<transport::Completion> completions_;  // Await's scratch
  std::vector<transport::SendWr> wrs_;              // ChainWrites' scratch
  std::vector<transport::Sge> sges_;
};

}  // namespace rmem

#endif  // HERD_RMEM_CLIENT_H_
