// The herd client library: embed it with one Bazel dependency, //herd:client.
//
// Connect, then run operations synchronously:
//
//   herd::ClientOptions options;
//   options.server = "10.0.0.1:31850";                   // the server's control plane
//   options.device.name = "mlx5_0";                      // a verbs device; default: "shm"
//   absl::StatusOr<std::unique_ptr<herd::Client>> client = herd::Client::Connect(options);
//   if (!client.ok()) return client.status();
//   absl::StatusOr<uint64_t> v = (*client)->Put("key", "value");   // the new version
//   absl::StatusOr<herd::Value> got = (*client)->Get("key");       // .value, .version
//   (*client)->Cas("key", got->version, "newer");  // CAS_FAILED names the current version
//
// or asynchronously, many requests in flight (this is how the throughput numbers are made):
//
//   std::vector<herd::Result> results(64);
//   uint64_t hash = herd::Client::HashKey(key);     // routes the key to its worker
//   if ((*client)->CanSubmit(c, hash))              // logical client c has window room there
//     (*client)->Submit(c, herd::Op::kGet, key, hash, /*value=*/"", 0, /*tag=*/i);
//   size_t n = (*client)->Poll(absl::MakeSpan(results));   // results[0..n), by tag
//
// Submit stages requests; Poll (or Flush) posts every staged request of a QP with one doorbell
// and delivers up to results.size() results. A result's value points into this Client's memory
// until the next Poll or Submit. One Client is driven by one thread (a process runs a Client per
// thread). examples/kv_client.cc and examples/batch_client.cc are these two in full.
//
// A replicated store (README "Replication"): list the members in ClientOptions::members; when
// health() is no longer OK, Follow(timeout) returns a Client joined to the promoted member that
// carries every outstanding request over (a mutation the old primary executed is answered from
// its replicated outcome, never applied twice). Use the follower from then on.
//
// What the library guarantees:
// One Client is one connection to a server and hosts `clients` logical
// clients (each with its own client id, sequence numbers and window of request slots per
// worker), driven by ONE thread: a client process runs many threads, each with its own Client.
//
// Asynchronous use: Submit() requests while Submit returns OK, Poll() for results. A logical
// client has at most `window` requests outstanding to each worker; Submit answers
// kResourceExhausted when the key's worker has no free slot for that client.
//
// Every response is checked before it is delivered: it must come from one of the server's
// worker QPs (UD: the sender's QP number, and the session's own qkey) or carry the session's
// checksum (WRITE responses), name the client (by its immediate, or its response slot), and
// carry the worker, sequence number and attempt of an outstanding request, and lengths that add
// up. Anything else is counted (stats().stray) and dropped. UD responses (and UC requests) can be
// lost: a request not answered within its retransmission timeout is sent again (same slot, same
// sequence number, next attempt number); the worker answers a repeated mutation from its dedupe
// table instead of applying it twice. The timeout adapts, per worker, to the round trips measured
// to it (srtt + 4 rttvar, as TCP's RTO, and at least twice the recent tail; each answer timed
// from its request's first send: herd/retransmit_timer.h) within [min_retry_timeout,
// max_retry_timeout], doubling per retransmission of a request. Some timeouts are no evidence of
// loss. The client's own absence (a gap between its clock readings, which Submit and Poll take,
// of a quarter of the shortest timeout or more: a descheduled thread, or an application that did
// not poll) resends nothing: each request outstanding over it gets the part of the gap it waited
// back, once per send. So does each request of a worker that answers again after such a silence
// (it is working through a backlog). A worker silent for half its timeout gets one request, a
// probe, not its whole window: the others due are held until the probe times out, backing off as
// if sent, and are resent when due once it has answered. (All three with the adaptive policy
// only.) Every request ends (answered, kTimedOut, or kSendFailed) within request_deadline.
#ifndef HERD_HERD_CLIENT_H_
#define HERD_HERD_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "herd/config.h"
#include "herd/join.h"
#include "herd/protocol.h"
#include "herd/retransmit_timer.h"
#include "herd/send_chains.h"
#include "herd/send_queue.h"
#include "transport/control/channel.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

namespace herd {

struct ClientOptions {
  std::string server = "127.0.0.1:31850";  // host:port of the server's control plane
  // kCm: join over RDMA-CM (a verbs device; `server` is an address of the server's RDMA
  // interface and its CM port) instead of TCP.
  transport::ConnectMode connect = transport::ConnectMode::kTcp;
  uint32_t clients = 1;  // logical clients on this connection
  transport::DeviceOptions device;
  // The retransmission timeout before any round trip was measured (and always, when
  // adaptive_retry is false).
  absl::Duration retry_timeout = absl::Milliseconds(20);
  bool adaptive_retry = true;
  // Floor of the adaptive timeout: eRPC's fixed RTO. Below a few ms, a time-sliced host (a
  // thread descheduled for a scheduler slice) times out everything outstanding at once.
  absl::Duration min_retry_timeout = absl::Milliseconds(5);
  absl::Duration max_retry_timeout = absl::Seconds(1);  // ceiling, backoff included
  // Sends (and holds, above) of one request; then it completes with kTimedOut. Attempt numbers past
  // kMaxAttempt (65,535) do not fit the wire: a request that reaches it completes with kTimedOut
  // too.
  uint32_t max_attempts = 250;
  // A request outstanding this long completes with kTimedOut whatever its attempts.
  absl::Duration request_deadline = absl::Seconds(10);
  absl::Duration connect_timeout = absl::Seconds(10);
  // How long a send waits for send-queue room. Completions trail posts by microseconds under
  // any load; a queue that stays full this long means a stuck NIC or QP, and the send fails
  // (kDeadlineExceeded) instead of hanging the thread.
  absl::Duration send_queue_timeout = absl::Seconds(1);
  // Doorbell batching: Submit stages a request's WR, and the staged WRs go out with one
  // post_send per QP at the next Poll() or Flush() (or once kMaxChainedRequests are staged).
  // false: every Submit posts at once (one doorbell per request).
  bool batch_doorbells = true;
  // Out-of-line GETs (the server's Config::large_values()): READ buffers, each the largest
  // item, shared by this Client's logical clients; an out-of-line answer waits for a free one.
  uint32_t read_buffers = 4;
  // READs of an item that fail its check (the log overwrote it while it was read) before the
  // GET falls back to a copy through the worker into one of the session's landing buffers.
  // 0: always the copy (the client then reads only memory the worker wrote for it, which no
  // other client can forge: see docs/architecture.md's trust model).
  uint32_t max_item_reads = 4;
  // A replicated store's members (host:port of each server's control plane, the primary's
  // among them), for Follow(). With members, a lost server's requests are kept for Follow()
  // (until request_deadline) instead of ending kTimedOut.
  std::vector<std::string> members;
};

struct Result {
  uint64_t tag = 0;  // the caller's, from Submit
  uint32_t client = 0;
  uint32_t worker = 0;  // the worker (partition) that owns the key
  Op op = Op::kGet;
  Status status = Status::kOk;
  uint64_t version = 0;
  // GET: the value, in memory of this Client that nothing remote writes. Valid until the next
  // Poll() or Submit() on this Client.
  std::string_view value;
  uint32_t attempts = 1;
  // Submit to the clock read of the Poll that delivered it (taken before its first response:
  // every result of one Poll shares that time).
  uint64_t latency_ns = 0;
};

struct ClientStats {
  uint64_t submitted = 0, completed = 0, retransmissions = 0, timed_out = 0, send_failed = 0,
           stray = 0;
  uint64_t torn = 0;  // WRITE responses seen torn or still landing (checked again later)
  // Gaps between the client's clock readings long enough to excuse requests outstanding over
  // them (the thread descheduled, or the application not polling): their deadlines moved by
  // the part of the gap each waited. And answers that ended a worker's silence so (its backlog's
  // deadlines moved alike).
  uint64_t absences = 0, silences = 0;
  // Timed-out requests held instead of resent: their worker had answered nothing for half its
  // timeout, and another request, resent as a probe, had not timed out yet.
  uint64_t holds = 0;
  // Large values: PUTs sent by WRITE_WITH_IMM; GETs answered out of line; READs of an item
  // that failed its check (read again); GETs that fell back to a copy through the worker.
  uint64_t large_puts = 0, out_of_line_gets = 0, item_rereads = 0, copied_gets = 0;
  absl::Duration retry_timeout;  // the current adaptive timeout (before backoff), the longest
                                 // of the workers'
  transport::CounterSnapshot fabric;
};

// A synchronous result.
struct Value {
  std::string value;
  uint64_t version = 0;
};

struct KeyValue {
  std::string_view key;
  std::string_view value;
};

// The API's error for a result: OK for Status::kOk, else an absl code that fits, with a message
// that starts with the status's wire name (NOT_FOUND, EXISTS, CAS_FAILED, ...) and says what
// it means.
absl::Status ResultError(const Result& r);

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  const Config& config() const { return config_; }
  uint32_t clients() const { return options_.clients; }
  uint32_t first_client_id() const { return first_client_id_; }
  // The hash Submit, CanSubmit and WorkerOf route a key by (mica::KeyHash: the server's
  // partitioning); compute it once per key.
  static uint64_t HashKey(std::string_view key);
  // The worker that owns a key of hash `keyhash` (clients route by the key hash, as the server
  // partitions).
  uint32_t WorkerOf(uint64_t keyhash) const;

  // True when `client` may have another request outstanding to `keyhash`'s worker (and, for a
  // value over the inline limit, a landing buffer there is free).
  bool CanSubmit(uint32_t client, uint64_t keyhash, uint64_t value_bytes = 0) const;
  // Sends one request of logical client `client` (0..clients-1). expected_version: CAS only.
  // With batch_doorbells (the default) the request is staged and goes out at the next Poll()
  // or Flush(), with every other request staged for the same QP (one doorbell). A request no
  // server answer could make succeed fails here, unsent, with a message that starts with its
  // wire name: KEY_TOO_LONG, VALUE_TOO_LONG, or NO_MEMORY (a value over the inline limit whose
  // request is longer than the server's landing buffers: kResourceExhausted, naming both sizes).
  absl::Status Submit(uint32_t client, Op op, std::string_view key, std::string_view value,
                      uint64_t expected_version, uint64_t tag);
  // The same, with the key's hash the caller already has (it routed the key with CanSubmit):
  // `keyhash` must be HashKey(key): it picks the worker (the hash does not travel; a
  // worker that does not own the key answers WRONG_WORKER).
  absl::Status Submit(uint32_t client, Op op, std::string_view key, uint64_t keyhash,
                      std::string_view value, uint64_t expected_version, uint64_t tag);
  // Delivers up to out.size() results; also retransmits overdue requests. Never blocks (a
  // retransmission that finds its send queue full counts as sent and is tried again later).
  size_t Poll(absl::Span<Result> out);
  // Posts every staged request now (one post_send per QP). A request whose post fails stays
  // outstanding: it is retransmitted, or ends with kSendFailed once its QP is known broken.
  absl::Status Flush();
  uint64_t outstanding() const { return outstanding_; }
  // OK while the server is there. Once its control connection closes (the server stopped or
  // died; Poll checks whenever it checks for overdue requests), kUnavailable: every outstanding
  // request is delivered as kTimedOut and every later Submit fails with this status.
  const absl::Status& health() const { return health_; }

  // After the server was lost (health() is not OK): joins the first member that is a promoted
  // backup of it with the same configuration (ClientOptions::members, tried in turn until
  // `timeout`: a promotion may still be under way) and hands it every outstanding request,
  // resent with its sequence number as a new attempt. Once: a hand-over that fails ends what it
  // could not hand over as TIMED_OUT (outcome unknown), and Follow refuses from then on.
  // The new primary answers a mutation the old one executed from the outcome replicated with
  // it (herd/replication/outcome_table.h): it is never applied twice, and no acknowledged one is
  // lost. With coordinated replication (the server's Welcome names an epoch), only a primary of
  // a newer epoch is followed. The follower continues this client's sequence numbers; use it from
  // now on (results of the handed-over requests come from its Poll, with their tags and
  // first-submit latencies).
  absl::StatusOr<std::unique_ptr<Client>> Follow(absl::Duration timeout);
  // Follow's pause between rounds over the members, and the most time one join attempt takes
  // (ClientOptions::connect_timeout, if shorter).
  static constexpr absl::Duration kFollowRetryInterval = absl::Milliseconds(20);
  static constexpr absl::Duration kFollowConnectTimeout = absl::Seconds(1);

  // Synchronous wrappers on logical client 0 (for tests and examples): wait for the request's
  // slot and buffers (kDeadlineExceeded past request_deadline), submit, poll until done.
  absl::StatusOr<Value> Get(std::string_view key);
  absl::StatusOr<uint64_t> Put(std::string_view key, std::string_view value);  // new version
  // The new version, or kAlreadyExists (EXISTS) naming the present version.
  absl::StatusOr<uint64_t> Insert(std::string_view key, std::string_view value);
  absl::StatusOr<uint64_t> Delete(std::string_view key);
  // OK with the new version, or kFailedPrecondition (CAS_FAILED) naming the current version.
  // Every error's message starts with the wire status's name (ResultError).
  absl::StatusOr<uint64_t> Cas(std::string_view key, uint64_t expected_version,
                               std::string_view value);

  // Batches on logical client 0: the requests go out with one doorbell per worker QP (as many
  // as the windows hold; the rest as answers free slots), results in input order. Operations
  // on one key within one call are not ordered among themselves.
  std::vector<absl::StatusOr<Value>> MultiGet(absl::Span<const std::string_view> keys);
  std::vector<absl::StatusOr<uint64_t>> MultiPut(absl::Span<const KeyValue> items);

  ClientStats stats() const;

  // Requests staged before a Flush is forced: a post list as long as HERD's and eRPC's
  // (16-32 WRs per doorbell), beyond which a longer chain saves nothing measurable.
  static constexpr uint32_t kMaxChainedRequests = 32;

 private:
  // Test access (tests/herd/client_test_peer.h): a hostile client's raw sends, the session's
  // secret, the UD QP a forger would target, broken QPs. Nothing of it is API.
  friend class ClientTestPeer;

  using Clock = std::chrono::steady_clock;
  // Where an out-of-line GET stands (after its response named the value).
  enum class ReadState : uint8_t {
    kNone,
    kWaitingForBuffer,   // a READ buffer must free up
    kReading,            // the READ is posted
    kWaitingForLanding,  // the fallback needs a landing buffer
  };
  struct Outstanding {
    bool active = false;
    Op op = Op::kGet;
    uint32_t client = 0, worker = 0, slot = 0;
    uint32_t queue = 0;    // queues_ index its WRs go on
    uint32_t length = 0;   // staged request bytes
    uint32_t sends = 0;    // times posted (or tried: a full send queue counts)
    uint32_t attempt = 0;  // the attempt number in the staged bytes
    uint64_t seq = 0, tag = 0, keyhash = 0;
    Clock::time_point submitted, deadline;
    // The staging buffer is read by the NIC when a non-inline WR executes, not when it is
    // posted: such WRs are signalled, and the buffer is rewritten only once the newest retired.
    bool buffer_in_flight = false;
    uint64_t last_wr = 0;  // that WR's send-queue index
    // Large values.
    bool large_body = false;  // staged in its landing buffer's staging, sent by WRITE_WITH_IMM
    int32_t landing = -1;     // the landing buffer it holds at its worker
    int32_t read = -1;        // the READ buffer it holds
    ReadState read_state = ReadState::kNone;
    ValueDescriptor descriptor{};  // what the out-of-line answer named
    uint64_t version = 0;          // ... and the version it answered
    bool copied = false;           // ... a bare value in the landing buffer (kResponseCopied)
    uint32_t item_reads = 0;       // READs of the item that failed their check
    bool handed_over = false;      // by Follow: first sent before the failover (no RTT sample)
    // This send's deadline was moved for the client's own absence or its worker's silence
    // (ExcuseAbsence, ExcuseSilence): at most once per send.
    bool excused = false;
    // ... for the client's absence: its answer is no round trip (the absence is in it).
    bool client_away = false;
    // Timeouts met by holding it instead of sending it again (its worker silent, another
    // request probing it): they back off its timeout should it become the probe, and count
    // toward max_attempts as sends do, until it is resent to a worker that answers again.
    uint32_t holds = 0;
  };
  // What Accept made of a response.
  enum class Accepted : uint8_t { kStray, kDelivered, kDeferred };
  // A request to stage: a new one (attempt 0), or one handed over by Follow.
  struct Staged {
    uint32_t client;
    Op op;
    std::string_view key;
    uint64_t keyhash;
    std::string_view value;
    uint64_t expected_version;
    uint64_t tag;
    uint64_t seq;
    uint32_t attempt;
    Clock::time_point submitted;
  };
  // What a follower's Join names: the ids and session it had at the lost server.
  struct Resumption {
    uint32_t first_client_id = 0;
    uint64_t session = 0;  // 0: a fresh join
  };
  explicit Client(const ClientOptions& options);
  absl::Status Handshake();
  // Encodes and sends a checked request in the slot its sequence number names.
  absl::Status Stage(const Staged& request);
  // Follow: restages every outstanding request in `follower`; this client forgets them.
  absl::Status HandOver(Client& follower);
  absl::Status CreateResources(const Config& config);
  absl::StatusOr<Result> RunOne(Op op, std::string_view key, std::string_view value,
                                uint64_t expected_version);
  // KEY_TOO_LONG, VALUE_TOO_LONG or NO_MEMORY (a request no landing buffer holds) when no
  // attempt could succeed: nothing is sent.
  absl::Status CheckRequest(Op op, std::string_view key, std::string_view value) const;
  // Runs `op` on every key (values: one per key, or empty) on logical client 0; calls
  // deliver(i, result) for each, in completion order.
  template <typename OnResult>
  absl::Status RunMany(Op op, absl::Span<const KeyValue> items, OnResult&& deliver);
  uint64_t SlotIndex(uint32_t client, uint32_t worker, uint32_t slot) const {
    return (uint64_t{client} * config_.workers + worker) * config_.window + slot;
  }
  // Posts the staged request of `o`. wait_for_room: Submit waits up to send_queue_timeout for
  // send-queue room; Poll's retransmissions never wait.
  absl::Status Send(Outstanding& o, bool wait_for_room);
  // Whether the staging buffer of `o` may be rewritten: no posted WR still reads it.
  bool BufferFree(const Outstanding& o) const;
  // Validates a response (its bytes already in private memory) and fills `out`; false for a
  // stray.
  Accepted Accept(const ParsedResponse& response, Result* out);
  // Fills `out` for `o`'s completion and ends it (status, version, value).
  void Deliver(Outstanding& o, Status status, uint64_t version, std::string_view value,
               Result* out);
  // The bytes `o`'s request is staged in.
  uint8_t* StagedBytes(const Outstanding& o) const;

  // Large values (client_large_values.cc).
  absl::Status CreateLargeValueResources();
  // Takes a free landing buffer at `worker` (one no posted WR still reads): its index, or -1.
  int32_t TakeLanding(uint32_t worker);
  void ReleaseLanding(Outstanding& o);
  // An out-of-line answer to `o`: checks and records it; false for a stray.
  bool DeferOutOfLine(Outstanding& o, const ResponseHeader& h, const uint8_t* value);
  // Posts READs for answers waiting for a buffer, checks finished READs, delivers, re-reads or
  // falls back.
  void AdvanceLargeValues(absl::Span<Result> out, size_t* n);
  // A READ of `o`'s value finished into its buffer: deliver it, or read again / fall back.
  void FinishRead(Outstanding& o, Result* out, bool* delivered);
  // Sends `o` again as a new attempt now (a re-read, or its fallback).
  void Resend(Outstanding& o);
  // Read buffers released by the previous Poll's deliveries go back now.
  void ReleaseDeliveredReads();
  void PollUdResponses(absl::Span<Result> out, size_t* n);
  void PollWriteResponses(absl::Span<Result> out, size_t* n);
  // Looks at one WRITE response slot (slots_[index]): delivers, drops or leaves its answer.
  void PollWriteResponse(uint64_t index, absl::Span<Result> out, size_t* n);
  // `o` became outstanding / ended: keeps live_ (WRITE responses only).
  void MarkLive(const Outstanding& o);
  void MarkEnded(const Outstanding& o);
  void Retransmit(absl::Span<Result> out, size_t* n);
  // Ends `o` with a client-side status (kTimedOut, kSendFailed) into *r.
  void Fail(Outstanding& o, Status status, Result* r);
  // Ends `o` without a result (its buffers freed or orphaned).
  void Forget(Outstanding& o);
  // This Poll's clock: read at the first call of the Poll. A gap since the previous reading of
  // at least absence_threshold_ is the client's absence: ExcuseAbsence.
  Clock::time_point PollClock();
  // Moves each outstanding request's deadline later by `gap` (once per send): the client did not
  // look at its responses for that long, so a request unanswered over it is no evidence of loss.
  void ExcuseAbsence(std::chrono::nanoseconds gap);
  // An answer from `worker` after it answered nothing for `gap`: moves the deadline of each of
  // its requests that waited over the gap, never held, later by the part of the gap it waited
  // (once per send). The worker was stalled or cut off, and is working through its backlog.
  void ExcuseSilence(uint32_t worker, std::chrono::nanoseconds gap, Clock::time_point now);
  // Whether the retransmission timer is due: a Poll that took no response looks at the clock
  // only once in kPollsPerIdleClockRead.
  bool RetryCheckDue();
  // Time from `submitted` to this Poll's clock, at least 0.
  std::chrono::nanoseconds SincePoll(Clock::time_point submitted);
  void RepostReceives();
  void Reap();

  const ClientOptions options_;
  Config config_;
  uint32_t first_client_id_ = 0;
  Welcome welcome_;
  Resumption resume_;
  bool followed_ = false;  // Follow took (or tried to take) the outstanding requests

  // Destroyed in reverse: the QPs first (their pending WRs read the staging buffers and name the
  // address handles until they are gone), then handles and memory, then CQs, PD, device.
  std::unique_ptr<transport::Device> device_;
  // The control link (TCP or RDMA-CM), open for the session's life; an RDMA-CM one holds a QP
  // on device_, so it is declared after it.
  std::unique_ptr<transport::control::MessageChannel> channel_;
  std::unique_ptr<transport::ProtectionDomain> pd_;
  std::unique_ptr<transport::CompletionQueue> send_cq_, recv_cq_;
  std::unique_ptr<transport::SharedMemory> staging_, receives_, responses_;
  std::unique_ptr<transport::MemoryRegion> staging_mr_, receives_mr_, responses_mr_;
  std::vector<std::unique_ptr<transport::AddressHandle>> worker_ahs_;
  std::unique_ptr<transport::QueuePair> ud_qp_;
  std::vector<std::unique_ptr<transport::QueuePair>> request_qps_, response_qps_;
  std::vector<SendQueue> queues_;  // [0] = UD QP, then worker request QPs, then large-value QPs
  SendChains chains_{kMaxChainedRequests};  // staged request WRs (batch_doorbells)
  bool batching_ = true;                    // batch_doorbells, or inside MultiGet/MultiPut

  std::vector<Outstanding> slots_;  // [client][worker][window]
  // Large values (Config::large_values()).
  struct Landing {
    bool used = false;
    bool in_flight = false;  // a WRITE_WITH_IMM from its staging may still be read
    uint64_t last_wr = 0;    // ... that WR's index on its worker's large queue
  };
  struct ReadBuffer {
    bool used = false;
    uint64_t owner = 0;            // slots_ index of the request it reads for
    uint64_t wr = 0;               // the READ's index on the owner's large queue
    bool orphan = false;           // its request ended: free once the READ retired
    bool release_at_poll = false;  // its value was delivered: free at the next Poll
  };
  uint32_t large_queue_base_ = 0;  // queues_ index of worker 0's large QP
  std::unique_ptr<transport::SharedMemory> landing_staging_, read_memory_;
  std::unique_ptr<transport::MemoryRegion> landing_staging_mr_, read_mr_;
  // After the memory its WRs read and write: destroyed first.
  std::vector<std::unique_ptr<transport::QueuePair>> large_qps_;  // per worker (RC)
  std::vector<Landing> landings_;                                 // [worker][landing_buffers]
  std::vector<ReadBuffer> reads_;
  uint64_t read_buffer_bytes_ = 0;
  // Requests answered out of line and not ended yet, and READ buffers orphaned by a request that
  // ended while its READ was in flight: Poll scans for large-value work only when either is > 0.
  uint64_t deferred_ = 0;
  uint64_t orphans_ = 0;
  std::vector<uint64_t> next_seq_;  // [client][worker]
  std::vector<uint8_t> delivered_;  // WRITE responses copied out before checking: [slot]
  // WRITE responses: the slots_ indices of the outstanding requests (Poll looks at these only),
  // each one's place in live_, and where the next Poll starts looking (a cursor, so that a full
  // output span never leaves the same slots unexamined Poll after Poll).
  static constexpr uint32_t kNotLive = UINT32_MAX;
  std::vector<uint32_t> live_;
  std::vector<uint32_t> live_position_;
  size_t live_cursor_ = 0;
  uint32_t ud_qkey_ = 0;      // our UD QP's own qkey
  bool grh_is_ipv4_ = false;  // how our receives' GRH area names a sender
  // The adaptive retransmission timeouts, one per worker (each over the round trips to it: one
  // worker's queue does not set another's timeout).
  RetransmitPolicy retransmit_policy_;
  std::vector<RetransmitTimer> timers_;
  // Per worker: the clock of the Poll that took its latest answer (adaptive policy: a silent
  // worker is probed with one request, not sent all that are due), and when its latest probe
  // went and times out.
  std::vector<Clock::time_point> last_answer_;
  std::vector<Clock::time_point> probe_sent_;
  std::vector<Clock::time_point> probe_due_;
  std::vector<uint32_t> to_repost_;  // receive buffers consumed and not yet re-posted
  std::vector<transport::Completion> completions_;
  std::vector<transport::RecvWr> recv_wrs_;
  std::vector<transport::Sge> recv_sges_;
  uint64_t outstanding_ = 0;
  uint32_t receive_bytes_ = 0;
  uint32_t receive_count_ = 0;
  std::chrono::steady_clock::time_point next_retry_check_;  // the earliest request deadline
  // The clock as a Poll read it (PollClock): at most once per Poll, when its first response
  // is taken or its retransmission check is due. Round trips, latencies and the check all use
  // it (a clock read costs 20-40 ns on a VM; three per response were a fifth of the client's
  // time).
  std::chrono::steady_clock::time_point poll_now_;
  bool clock_read_ = false;  // this Poll read poll_now_
  // The previous PollClock reading, and the gap between two that is an absence (or between two
  // answers of a worker, a silence): a quarter of the shortest first timeout of any worker (as
  // of the last retransmission check). A shorter gap leaves a request at least three quarters
  // of its timeout watched. Never, without the adaptive policy (a fixed timeout resends every
  // request due).
  static constexpr int kAbsenceFraction = 4;
  // ... and never less than this (a floor set near 0 would make every pause an absence).
  static constexpr std::chrono::nanoseconds kMinAbsence{100'000};
  std::chrono::steady_clock::time_point last_watch_;
  std::chrono::nanoseconds absence_threshold_;
  uint32_t polls_since_clock_ = 0;  // Polls that took no response since the last read
  uint32_t repost_batch_ = 1;       // receives consumed before Poll re-posts them
  std::chrono::steady_clock::time_point next_health_check_;
  absl::Status health_;
  ClientStats stats_;
};

}  // namespace herd

#endif  // HERD_HERD_CLIENT_H_
