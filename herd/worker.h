// One server worker: a pinned thread that polls its own request slots (or its UD receive
// queue), runs what it finds through its MICA partition's batch API, and answers with one
// chained post_send per response QP. EREW: the worker alone touches its partition, its
// dedupe table, its staging buffers and its send queues; the control thread only publishes
// and unpublishes routes (atomic pointers) and waits for the worker's epoch to advance before
// freeing what it unpublished.
#ifndef HERD_HERD_WORKER_H_
#define HERD_HERD_WORKER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "herd/config.h"
#include "herd/protocol.h"
#include "herd/replication/outcome_table.h"
#include "herd/replication/replica_reader.h"
#include "herd/replication/replica_task.h"
#include "herd/response_gate.h"
#include "herd/send_chains.h"
#include "herd/send_queue.h"
#include "herd/slot_scanner.h"
#include "mica/partition.h"
#include "transport/fabric.h"
#include "util/lease.h"

namespace herd {

// How a worker reaches one client. Built by the control thread, immutable once published.
struct ClientRoute {
  const transport::AddressHandle* ah = nullptr;  // UD responses (this worker's own AH)
  uint32_t ud_qpn = 0;      // the client's UD QP: where responses go, and (request_verb = ud_send)
                            // with ud_gid the only sender its requests are accepted from
  transport::Gid ud_gid{};  // the device of that QP (QP numbers are unique per device only)
  uint32_t ud_qkey = 0;     // the session's own qkey: the client's UD QP accepts nothing else
  uint64_t secret = 0;      // the session's checksum key (protocol.h: WireChecksum)
  uint32_t generation = 0;  // new for every session that takes this client id
  uint16_t response_queue = 0;  // response_verb = *_write: the session's table slot
  uint64_t response_addr = 0;   // ... this client's response slots for this worker
  uint32_t response_rkey = 0;
  // Config::large_values(): the session's large-value QP at this worker (its WRITE_WITH_IMMs
  // are accepted from it alone; the worker reposts its receives), its landing buffers here
  // (local address = the address the client names), and this worker's log as the session
  // may READ it.
  transport::QueuePair* large_qp = nullptr;
  uint32_t large_qpn = 0;
  uint8_t* landing = nullptr;
  uint32_t landing_rkey = 0;
  uint64_t log_addr = 0;
  uint32_t log_rkey = 0;
  // A client that followed a failover (Join::resume_*): the id it had at the old primary and
  // that session's secret. The worker takes over its recorded outcomes
  // (herd/replication/outcome_table.h) when it first sees this session. 0: a fresh session.
  uint32_t resume_client = 0;
  uint64_t resume_session = 0;
};

// Receives a session's large-value QP keeps posted: each large PUT (WRITE_WITH_IMM) takes one
// and the worker puts it back (any WRITE_WITH_IMM, valid or not: a receive's wr_id names its
// session). The client has at most landing_buffers in flight per worker; retransmissions of them
// and slack for the worker's reposting lag make up the rest.
inline uint32_t LargeReceiveDepth(const Config& c) { return 4 * c.landing_buffers + 8; }

// What the worker counts (single writer; the progress printer reads them relaxed).
struct WorkerCounters {
  transport::Counter requests;             // requests answered (OK or not)
  transport::Counter batches;              // batches executed
  transport::Counter bad_requests;         // answered with an error status
  transport::Counter replays;              // retransmitted mutations answered from the dedupe table
  transport::Counter duplicates;           // a send seen again (same seq and attempt): bytes that
                                           // landed twice; consumed, never executed or answered
  transport::Counter rejected;             // never complete or not authentic (lengths, checksum, UD
                                           // sender): dropped unanswered
  transport::Counter dropped;              // stale sequence numbers, unknown clients, broken QPs
  transport::Counter response_queue_full;  // answers dropped (among `dropped`) because their
                                           // client's own response QP was full: retransmitted
  transport::Counter fences;               // RequestFence's empty SENDs (an idle worker's, rare)
  transport::Counter held;                 // mutation responses the gate held (response_gate.h)
  transport::Counter released;             // ... and released and answered
  transport::Counter held_retransmissions;  // retransmissions of a held response: consumed
  transport::Counter reads_held;           // GETs whose answer the gate held (a write not yet safe)
  transport::Counter reads_unanswered;     // ... with no held-read buffer free: left to their
                                           // client's retransmission
  transport::Counter out_of_line;          // GETs answered with a descriptor of their item
  transport::Counter copied_values;        // ... with a copy in a landing buffer (the fallback)
  transport::Counter internal_errors;      // answered INTERNAL: the server's own inconsistency
  transport::Counter resumed_outcomes;     // outcomes taken over from a client's old primary
  transport::Counter unrecorded_outcomes;  // ... not recorded: the id's old outcomes await
                                           // their client (a second failover may re-apply)
};

// A UD response queue's progress, published by the worker for the control thread: an address
// handle named by WRs posted up to `posted` may be destroyed once `retired` passed that count.
struct QueueProgress {
  std::atomic<uint64_t> posted{0};
  std::atomic<uint64_t> retired{0};
};

// Where a worker's fences go (Worker::RequestFence): a UD QP of the server's that takes them
// and discards them.
struct FenceTarget {
  transport::AddressHandle* ah = nullptr;
  uint32_t qpn = 0;
  uint32_t qkey = 0;
};

// Registered memory a worker uses; allocated by the server (one MR per piece).
struct WorkerMemory {
  uint8_t* region = nullptr;   // the server's whole request region
  uint8_t* staging = nullptr;  // ud_qps * sq_depth response buffers
  uint32_t staging_lkey = 0;
  uint8_t* receives = nullptr;  // recv_depth UD request buffers (request_verb = ud_send)
  uint32_t receives_lkey = 0;
  // Bytes of one receive buffer: the GRH area and a whole path-MTU payload, however small the
  // slot. A UD message larger than its receive buffer is an error completion on a NIC, and rxe
  // then moves the QP to the error state: one oversize request would silence the worker.
  uint32_t receive_bytes = 0;
  bool grh_is_ipv4 = false;  // how a receive's GRH area names the sender (transport::PortInfo)
  // Config::large_values(): where large PUTs' WRITE_WITH_IMMs complete (every session's
  // large-value QP at this worker receives into it).
  transport::CompletionQueue* imm_cq = nullptr;
};

class Worker {
 public:
  // `ud_qps`: the worker's response UD QPs; the first also receives UD requests. `gate`, if
  // not null, may hold mutations' responses (response_gate.h); it must outlive the worker's
  // thread. `replica`, if not null, makes this a backup's worker: GETs read the replica through
  // it (replication/replica_reader.h) and mutations are answered NOT_PRIMARY.
  Worker(uint32_t index, const Config& config, std::unique_ptr<mica::Partition> partition,
         std::vector<transport::QueuePair*> ud_qps, transport::CompletionQueue* send_cq,
         transport::CompletionQueue* recv_cq, const WorkerMemory& memory,
         ResponseGate* gate = nullptr, ReplicaReader* replica = nullptr,
         const util::Lease* lease = nullptr);
  ~Worker();

  // The thread body: runs until `stop` is set.
  void Run(const std::atomic<bool>& stop);
  // Posts the initial UD request receives (request_verb = ud_send); call before Run.
  absl::Status PostInitialReceives();

  // Control thread: publish/unpublish a client's route, and a session's response queue.
  void PublishRoute(uint32_t client, const ClientRoute* route) {
    routes_[client].store(route, std::memory_order_seq_cst);  // see Run: epoch_
    // After the route: a worker that sees the new count sees the route (ScanActiveClients).
    route_changes_.fetch_add(1, std::memory_order_acq_rel);
  }
  void PublishQueue(uint16_t slot, SendQueue* queue) {
    queues_[slot].store(queue, std::memory_order_seq_cst);  // see Run: epoch_
  }
  // Control threads: hands the worker `task` and returns at once; the worker claims it at the
  // top of its next loop, runs it and sets task->done. `task` must live until done, or until
  // CancelTask took it back (true: the worker never claimed it and never will).
  void RequestTask(ReplicaTask* task) { task_.store(task, std::memory_order_release); }
  bool CancelTask(ReplicaTask* task) {
    return task_.compare_exchange_strong(task, nullptr, std::memory_order_acq_rel);
  }
  // Before Run: where fences go. Without one, RequestFence does nothing.
  void SetFenceTarget(const FenceTarget& target) { fence_ = target; }
  // Any thread (the control thread, while departed sessions' address handles wait): the next
  // time the worker finds nothing to do, it posts a signalled, empty SEND to the fence target on
  // each UD response queue with WRs not yet known complete. Its completion retires every WR
  // before it (QueueProgress::retired), which an idle worker's unsignalled WRs never do
  // otherwise (one WR in unsig_batch is signalled). Costs a busy worker nothing.
  void RequestFence() { fence_requests_.fetch_add(1, std::memory_order_relaxed); }
  bool replica() const { return replica_mode_.load(std::memory_order_acquire); }
  // A loop count: once it moves past a value read after unpublishing, the worker holds no
  // pointer it read before.
  uint64_t epoch() const { return epoch_.load(std::memory_order_seq_cst); }  // see Run
  bool running() const { return running_.load(std::memory_order_acquire); }

  const WorkerCounters& counters() const { return counters_; }
  // Per UD response queue (ud_qps_per_worker of them).
  const QueueProgress& ud_progress(uint32_t queue) const { return ud_progress_[queue]; }
  const mica::Partition& partition() const { return *partition_; }
  // The partition itself, for what runs before or after the thread (a replication gate's
  // recorder, a promotion's ResumeFromRegion). Never while Run runs.
  mica::Partition* mutable_partition() { return partition_.get(); }
  uint32_t index() const { return index_; }
  // Queue table slots 0..ud_qps-1 are the UD QPs; sessions take the rest.
  uint32_t queue_table_size() const { return static_cast<uint32_t>(queues_.size()); }

 private:
  struct Pending;  // one request of the batch being built
  // A new session's first request: forget the id's old sequence numbers, and take over the
  // outcomes its client had at the old primary (ClientRoute::resume_*).
  void StartSession(uint32_t client, const ClientRoute& route);
  // Writes (client, slot)'s outcome into the replicated table, unless an old client's outcome
  // there still awaits its resumption.
  void RecordOutcome(uint32_t client, uint32_t slot, const MutationOutcome& outcome);
  struct SlotState {
    uint64_t last_seq = 0;      // the newest request seen (executed or replayed)
    uint32_t last_attempt = 0;  // ... and its newest send
    Status status = Status::kOk;
    bool held = false;     // the last request's response is held by the gate
    uint64_t version = 0;  // the last mutation's outcome, replayed to a retransmission
    // A slot whose marker is set but whose message does not check out yet: which marker, and
    // since when (a WRITE still landing completes within microseconds; one that never does is
    // rejected after kIncompleteGrace).
    uint64_t incomplete_marker = 0;
    uint64_t incomplete_checksum = 0;
    int64_t incomplete_since_ns = 0;
  };
  // What Admit did with a message.
  enum class Admitted : uint8_t {
    kConsumed,  // batched, or dropped for good: the slot's marker may be cleared
    kNotYet,    // an incomplete WRITE within its grace period: leave the marker, look again
  };

  // Each Gather adds ready requests to a batch that holds `count` and returns the new count
  // (at most postlist).
  uint32_t GatherFromSlots(uint32_t count);
  // Points the scanner at the clients that have a route, when the routes changed since it last
  // looked (one relaxed-cost load per gather otherwise).
  void ScanActiveClients();
  uint32_t GatherFromReceives(uint32_t count);
  // Large PUTs that landed (WRITE_WITH_IMM completions), until the batch holds `up_to`.
  uint32_t GatherFromLanding(uint32_t count, uint32_t up_to);
  // Large writes the next batch may take: postlist, or what the gate allows
  // (ResponseGate::LargeWritesAllowed).
  uint32_t LargeWritesAllowed() const;
  // Of each batch, postlist / kLandingShareDivisor (at least 1) is open to large PUTs before
  // small requests are gathered: a large PUT copies up to a MiB into the store, so small
  // requests wait behind at most that many of them, and a steady stream of small requests (which
  // fills every batch) cannot starve large ones.
  static constexpr uint32_t kLandingShareDivisor = 4;
  // A GET whose value is longer than the inline limit: answers with a descriptor of its item
  // (or, kRequestCopyToLanding, of a copy in the session's landing buffer).
  void AnswerOutOfLine(Pending& p, const mica::Response& r);
  // kRequestCopyToLanding: the store copied the value into the landing buffer the GET named;
  // answers with a descriptor of it (or inline, when the value is short after all).
  void AnswerCopied(Pending& p);
  uint8_t* LandingOf(const Pending& p) const;
  // The wire status of the store's result for `p`: the store's own results pass through; an
  // item that fails its checksum, or a result the engine does not know, is kInternal (counted,
  // logged at most once in kInternalLogEvery).
  Status WireStatus(const Pending& p, mica::Result result);
  // Validates one request, gives it a response slot and appends it to batch_[*count] (or
  // counts a drop). `slot` is the window slot it was polled from, or kFromReceive (then `grh`
  // is the receive's GRH area and `src_qp` the sender's QP number: together the client's).
  Admitted Admit(uint32_t client, uint32_t slot, const uint8_t* message, uint32_t length,
                 const uint8_t* grh, uint32_t src_qp, uint32_t* count);
  void ExecuteAndRespond(uint32_t count);
  // Picks the queue and staging buffer for a response and appends it to the responses to post;
  // false if there is none (the response is dropped; the client's retransmission executes a
  // GET again and replays a mutation's outcome).
  bool AssignResponse(Pending& p);
  // Writes p's response header into its staging buffer.
  void EncodeResponse(const Pending& p);
  // Answers what the gate released (mutations as replays of their slots' outcomes, GETs from
  // their held-read buffers).
  void AnswerReleased();
  // A GET the gate must hold (ReadMustWait): saves its answer and hands it to the gate; false
  // (unanswered) when no held-read buffer is free.
  bool HoldReadAnswer(Pending& p);
  // A held GET's answer, kept off the send queues until the gate releases it.
  struct HeldRead {
    bool in_use = false;
    Status status = Status::kOk;
    uint8_t response_flags = 0;
    uint32_t value_bytes = 0;
    uint64_t version = 0;
  };
  // Held-read buffers: this many batches of GETs (a read waits for the batches in flight).
  static constexpr uint32_t kHeldReadBatches = 8;
  // Posts the responses assigned since the last post, in assignment order.
  void PostResponses();
  void RepostReceives(uint32_t count);
  // Claims and runs the pending task (RequestTask).
  void RunTask();
  // Answers through `gate` from now on (its held-read buffers, if it holds reads).
  void InstallGate(ResponseGate* gate);
  // Polls the send CQ once; applies signalled completions.
  void Reap();

  const uint32_t index_;
  const Config config_;
  const uint32_t landing_share_;  // see kLandingShareDivisor
  const RequestLimits limits_;
  const uint32_t response_buffer_bytes_;
  // Config's derived limits, computed once (each is a call and a few branches per request).
  const uint32_t inline_limit_;
  const bool large_values_;
  const uint32_t landing_value_limit_;
  const uint64_t landing_bytes_;
  std::unique_ptr<mica::Partition> partition_;
  std::vector<transport::QueuePair*> ud_qps_;
  transport::CompletionQueue* send_cq_;
  transport::CompletionQueue* recv_cq_;
  WorkerMemory memory_;
  // Set at construction, or once by a promotion's task (ReplicaTask::make_gate).
  ResponseGate* gate_;
  // The gate may hold GETs: the answer of a GET that could read an unreleased write
  // (ResponseGate::ReadsCaughtUp false as its batch began, or a mutation ahead of it in the
  // batch) is built in get_aside_ and copied to its send-queue staging buffer only once it may
  // go (a held one would keep a reserved WR from being posted).
  bool hold_reads_;
  const uint32_t read_answer_bytes_;  // the most a GET's answer holds (inline limit, padded)
  ReplicaReader* replica_;            // null once promoted
  // Coordinated replication: the primary's lease on its place. A primary worker whose lease is
  // not valid takes no request and releases no answer (its requests wait in their slots).
  const util::Lease* const lease_;
  // A replicated partition's mutation outcomes (its owner area holds OutcomeTableBytes): set on
  // a primary and on a backup (which writes none until promoted).
  std::optional<OutcomeTable> outcomes_;
  // [client id]: outcomes the old primary left that no resumed session took over yet (set at
  // promotion); they are never overwritten (that id's own new outcomes go unrecorded until then).
  std::vector<uint8_t> awaiting_resume_;
  std::atomic<bool> replica_mode_{false};
  std::atomic<ReplicaTask*> task_{nullptr};

  std::vector<std::atomic<const ClientRoute*>> routes_;  // by client id
  std::atomic<uint64_t> route_changes_{0};               // PublishRoute calls; the control thread's
  uint64_t route_changes_seen_ = UINT64_MAX;             // ... as of the scanner's list (none yet)
  std::vector<uint32_t> active_clients_;  // ScanActiveClients' scratch (max_clients capacity)
  std::vector<std::atomic<SendQueue*>> queues_;  // by table slot
  std::vector<SendQueue> ud_queues_;
  std::vector<SlotState> slots_;            // [client][window]
  std::vector<uint32_t> generations_seen_;  // [client]
  std::atomic<uint64_t> epoch_{0};
  std::atomic<bool> running_{false};

  // Per-batch scratch, sized once (the hot path allocates nothing).
  std::vector<Pending> batch_;
  std::vector<mica::Request> store_requests_;
  std::vector<mica::Response> store_responses_;
  std::vector<uint32_t> store_index_;  // batch position of each store request
  std::vector<Pending*> to_post_;      // responses in the order their WRs were reserved
  uint32_t to_post_count_ = 0;
  std::vector<HeldId> released_;           // AnswerReleased's
  std::vector<uint8_t> get_aside_;         // [postlist] answers (hold_reads_)
  std::vector<HeldRead> held_reads_;       // [postlist x kHeldReadBatches] (hold_reads_)
  std::vector<uint8_t> held_read_bytes_;   // ... their answers' bytes
  std::vector<uint32_t> free_held_reads_;  // indices into held_reads_
  std::vector<transport::RecvWr> recv_wrs_;
  std::vector<transport::Sge> recv_sges_;
  std::vector<transport::Completion> send_completions_;  // Reap's
  std::vector<transport::Completion> recv_completions_;  // GatherFromReceives' (Admit may Reap)
  std::vector<transport::Completion> imm_completions_;   // GatherFromLanding's
  std::vector<QueueProgress> ud_progress_;
  SendChains chains_;        // PostResponses: one chain per distinct queue
  SlotScanner scanner_;      // over this worker's slots of the region
  uint32_t reposts_ = 0;     // receives consumed by the current batch (recv_sges_[0..reposts_))
  uint32_t next_ud_qp_ = 0;  // round robin over the response UD QPs
  // RequestFence's: the requests so far, and the count the last complete round of fences saw.
  FenceTarget fence_;
  std::atomic<uint64_t> fence_requests_{0};
  uint64_t fences_seen_ = 0;
  // An idle loop's: a fence on every UD queue with WRs not known complete.
  void PostFences();
  WorkerCounters counters_;
};

}  // namespace herd

#endif  // HERD_HERD_WORKER_H_
