#include "herd/worker.h"

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "herd/admission.h"
#include "herd/slot_scanner.h"
#include "mica/item.h"
#include "mica/keyhash.h"

namespace herd {
namespace {

// A large PUT's immediate names the client id and the landing buffer in 16 bits each.
static_assert(kMaxClients <= (uint64_t{1} << (32 - kLandingBufferBits)) &&
              kMaxLandingBuffers <= (1u << kLandingBufferBits));

// The worker passes opcodes and the store's results (those a client may see: WireStatus)
// between the wire and the store unchanged.
static_assert(static_cast<uint8_t>(Op::kInsert) == static_cast<uint8_t>(mica::OpCode::kInsert) &&
              static_cast<uint8_t>(Op::kCas) == static_cast<uint8_t>(mica::OpCode::kCas) &&
              static_cast<uint8_t>(Op::kDelete) == static_cast<uint8_t>(mica::OpCode::kDelete) &&
              static_cast<uint8_t>(Op::kPut) == static_cast<uint8_t>(mica::OpCode::kPut));
constexpr bool SameValue(Status s, mica::Result r) {
  return static_cast<uint8_t>(s) == static_cast<uint8_t>(r);
}
static_assert(SameValue(Status::kOk, mica::Result::kOk) &&
              SameValue(Status::kNotFound, mica::Result::kNotFound) &&
              SameValue(Status::kCasFailed, mica::Result::kCasFailed) &&
              SameValue(Status::kKeyTooLong, mica::Result::kKeyTooLong) &&
              SameValue(Status::kValueTooLong, mica::Result::kValueTooLong) &&
              SameValue(Status::kBufferTooSmall, mica::Result::kBufferTooSmall) &&
              SameValue(Status::kInvalidOp, mica::Result::kInvalidOp) &&
              SameValue(Status::kExists, mica::Result::kExists) &&
              SameValue(Status::kNoMemory, mica::Result::kNoMemory));
// One line in this many INTERNAL answers is logged: a damaged log answers every GET of the
// damaged item so, and must not flood the log or slow the worker.
constexpr int kInternalLogEvery = 1000;

// Consecutive empty polls before the worker yields its core once. On a dedicated core nothing
// else is runnable and yield returns at once; on a shared development machine it lets the
// clients run.
constexpr uint32_t kIdlePollsBeforeYield = 256;
// How long a worker waits for send-queue room before it drops a response (the peer behind a
// connected queue is gone or stuck; the client will retransmit). Time, not a poll count: a
// NIC, rxe under emulation and the shm fabric complete sends at very different speeds.
constexpr absl::Duration kMaxWaitForRoom = absl::Milliseconds(100);
// Reaps between two looks at the clock while waiting for room.
constexpr uint32_t kReapsPerClockCheck = 256;
constexpr uint32_t kFromReceive = UINT32_MAX;
constexpr uint32_t kFromLanding = UINT32_MAX - 1;  // a large PUT in a landing buffer
// How long a slot may show a marker over a message that does not check out (lengths or
// checksum) before the worker gives up on it and clears it. A WRITE still landing completes in
// microseconds on a NIC and in well under this on Soft-RoCE under emulation; bytes that never
// check out were not written by the slot's session (or were corrupted), and get no answer.
constexpr int64_t kIncompleteGraceNs = 10'000'000;  // 10 ms

}  // namespace

struct Worker::Pending {
  ParsedRequest request;
  Status status = Status::kOk;
  bool replay = false;
  bool held = false;     // the gate holds its response
  bool dropped = false;  // no send-queue room for its response
  bool aside = false;    // a GET whose answer is built in get_aside_ (it may have to wait)
  uint32_t client = 0;
  uint32_t slot = 0;
  const ClientRoute* route = nullptr;
  SendQueue* queue = nullptr;
  uint64_t wr_index = 0;
  uint8_t* staging = nullptr;
  uint64_t version = 0;
  uint32_t value_bytes = 0;
  uint8_t response_flags = 0;  // kResponseOutOfLine, kResponseCopied
};

Worker::Worker(uint32_t index, const Config& config, std::unique_ptr<mica::Partition> partition,
               std::vector<transport::QueuePair*> ud_qps, transport::CompletionQueue* send_cq,
               transport::CompletionQueue* recv_cq, const WorkerMemory& memory, ResponseGate* gate,
               ReplicaReader* replica, const util::Lease* lease)
    : index_(index),
      config_(config),
      landing_share_(std::max(1u, config.postlist / kLandingShareDivisor)),
      limits_{config.max_key_bytes, config.value_limit(),
              config.large_values() ? config.landing_buffers : 0},
      response_buffer_bytes_(ResponseBytes(config.slot_value_bytes())),
      inline_limit_(config.inline_limit()),
      large_values_(config.large_values()),
      landing_value_limit_(config.landing_value_limit()),
      landing_bytes_(config.landing_bytes()),
      partition_(std::move(partition)),
      ud_qps_(std::move(ud_qps)),
      send_cq_(send_cq),
      recv_cq_(recv_cq),
      memory_(memory),
      gate_(gate),
      hold_reads_(false),
      read_answer_bytes_(static_cast<uint32_t>(Pad8(config.inline_limit()))),
      replica_(replica),
      lease_(lease),
      replica_mode_(replica != nullptr),
      routes_(config.max_clients),
      queues_(config.ud_qps_per_worker + config.max_clients),
      ud_queues_(ud_qps_.size()),
      slots_(uint64_t{config.max_clients} * config.window),
      generations_seen_(config.max_clients, 0),
      batch_(config.postlist),
      store_requests_(config.postlist),
      store_responses_(config.postlist),
      store_index_(config.postlist),
      to_post_(config.postlist),
      released_(config.postlist),
      recv_wrs_(config.postlist),
      recv_sges_(config.postlist),
      send_completions_(config.postlist + config.unsig_batch),
      recv_completions_(config.postlist),
      imm_completions_(config.postlist),
      ud_progress_(ud_qps_.size()),
      chains_(config.postlist),
      scanner_(SlotLayout{memory.region + uint64_t{index} * config.window * config.slot_bytes,
                          config.max_clients, config.window, config.slot_bytes,
                          config.client_block_bytes()}) {
  active_clients_.reserve(config_.max_clients);
  if (gate_ != nullptr) InstallGate(gate_);
  if (partition_->owner_area().size() >= OutcomeTableBytes(config_)) {
    outcomes_.emplace(partition_.get(), config_);
    awaiting_resume_.assign(config_.max_clients, 0);
  }
  for (uint32_t q = 0; q < ud_qps_.size(); ++q) {
    SendQueue& queue = ud_queues_[q];
    queue.qp = ud_qps_[q];
    queue.depth = config.sq_depth;
    queue.unsig_batch = config.unsig_batch;
    queue.table_slot = static_cast<uint16_t>(q);
    queue.staging = memory.staging + uint64_t{q} * config.sq_depth * response_buffer_bytes_;
    queue.staging_lkey = memory.staging_lkey;
    queue.buffer_bytes = response_buffer_bytes_;
    queues_[q].store(&queue, std::memory_order_relaxed);
  }
}

Worker::~Worker() = default;

void Worker::InstallGate(ResponseGate* gate) {
  gate_ = gate;
  hold_reads_ = gate->HoldsReads();
  if (!hold_reads_ || !held_reads_.empty()) return;
  const uint32_t held = config_.postlist * kHeldReadBatches;
  get_aside_.resize(uint64_t{config_.postlist} * read_answer_bytes_);
  held_reads_.resize(held);
  held_read_bytes_.resize(uint64_t{held} * read_answer_bytes_);
  free_held_reads_.reserve(held);
  for (uint32_t i = held; i-- > 0;) free_held_reads_.push_back(i);
}

void Worker::RunTask() {
  // Claimed by exchange: a task the control thread cancelled is never half run.
  ReplicaTask* task = task_.exchange(nullptr, std::memory_order_acq_rel);
  if (task == nullptr) return;
  task->status = task->apply(*partition_);
  if (task->status.ok() && task->take_writes) {
    if (outcomes_) {
      task->awaiting_resume = outcomes_->ClientsWithOutcomes(config_.max_clients);
      for (uint32_t client : task->awaiting_resume) awaiting_resume_[client] = 1;
    }
    replica_ = nullptr;  // from the next batch on, mutations execute here
    replica_mode_.store(false, std::memory_order_release);
    if (task->make_gate) {
      if (ResponseGate* gate = task->make_gate(*partition_); gate != nullptr) InstallGate(gate);
    }
    LOG(INFO) << "worker " << index_ << " promoted: it takes writes"
              << (gate_ != nullptr ? ", through a replication gate" : "");
  } else if (!task->status.ok()) {
    LOG(ERROR) << "worker " << index_ << ": replica task failed: " << task->status;
  }
  task->done.store(true, std::memory_order_release);
}

absl::Status Worker::PostInitialReceives() {
  if (config_.request_verb != RequestVerb::kUdSend) return absl::OkStatus();
  const uint32_t bytes = memory_.receive_bytes;
  for (uint32_t i = 0; i < config_.recv_depth; ++i) {
    transport::Sge sge{reinterpret_cast<uint64_t>(memory_.receives + uint64_t{i} * bytes), bytes,
                       memory_.receives_lkey};
    transport::RecvWr wr;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    transport::RecvWr* bad = nullptr;
    if (absl::Status s = ud_qps_[0]->PostRecv(&wr, &bad); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void Worker::Run(const std::atomic<bool>& stop) {
  running_.store(true, std::memory_order_release);
  uint32_t idle = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    // seq_cst, as the route and queue loads below and the control thread's unpublishing stores
    // and epoch loads (Server::WaitForWorkers): a store followed by a load of another location,
    // on each side, is the store-buffering pattern, which release/acquire does not order (x86
    // lets each load pass the thread's own earlier store). With all four seq_cst, either this
    // iteration sees the route gone, or the control thread sees this iteration's epoch and
    // waits for the next one before it frees what the route named.
    epoch_.store(epoch_.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
    if (task_.load(std::memory_order_relaxed) != nullptr) [[unlikely]]
      RunTask();
    if (lease_ != nullptr && replica_ == nullptr && !lease_->Valid()) [[unlikely]] {
      // Not (or no longer) sure of its place as primary: nothing is read, executed or
      // acknowledged until the control thread renews the lease (or for good, when fenced).
      Reap();
      std::this_thread::yield();
      continue;
    }
    // Large PUTs first, up to their share of the batch, then small requests, then large PUTs
    // again for what is left: neither kind can starve the other.
    uint32_t count = 0;
    // A replicating worker takes no more large writes than one record holds (none while its
    // gate is backlogged): a record past a third of the staging ring would drop every backup.
    uint32_t large_left = memory_.imm_cq != nullptr ? LargeWritesAllowed() : 0;
    if (large_left > 0) {
      count = GatherFromLanding(count, std::min(landing_share_, large_left));
      large_left -= count;
    }
    count = config_.request_uses_slots() ? GatherFromSlots(count) : GatherFromReceives(count);
    if (large_left > 0 && count < config_.postlist) {
      count = GatherFromLanding(count, std::min(config_.postlist, count + large_left));
    }
    if (count > 0) ExecuteAndRespond(count);
    if (gate_ != nullptr) AnswerReleased();
    if (reposts_ > 0) {
      // Consumed receives go back only now: values were read from them until the store ran.
      RepostReceives(reposts_);
      reposts_ = 0;
      idle = 0;
      continue;
    }
    if (count == 0) {
      Reap();
      if (fence_requests_.load(std::memory_order_relaxed) != fences_seen_) [[unlikely]]
        PostFences();
      if (++idle >= kIdlePollsBeforeYield) {
        idle = 0;
        std::this_thread::yield();
      }
      continue;
    }
    idle = 0;
  }
  running_.store(false, std::memory_order_release);
}

void Worker::ScanActiveClients() {
  const uint64_t changes = route_changes_.load(std::memory_order_acquire);
  if (changes == route_changes_seen_) [[likely]]
    return;
  route_changes_seen_ = changes;
  active_clients_.clear();
  for (uint32_t c = 0; c < config_.max_clients; ++c) {
    if (routes_[c].load(std::memory_order_seq_cst) != nullptr) active_clients_.push_back(c);
  }
  scanner_.SetClients(active_clients_);
}

uint32_t Worker::GatherFromSlots(uint32_t count) {
  if (count == config_.postlist) return count;
  ScanActiveClients();
  scanner_.Scan(
      [&](uint32_t client, uint32_t slot, const uint8_t* start, uint64_t) {
        return Admit(client, slot, start, config_.slot_bytes, nullptr, 0, &count) ==
                       Admitted::kNotYet
                   ? SlotAction::kLeave
                   : SlotAction::kConsume;
      },
      [&] { return count == config_.postlist; });
  return count;
}

uint32_t Worker::GatherFromReceives(uint32_t count) {
  const uint32_t got = static_cast<uint32_t>(
      recv_cq_->Poll(absl::MakeSpan(recv_completions_.data(), config_.postlist - count)));
  const uint32_t bytes = memory_.receive_bytes;
  for (uint32_t i = 0; i < got; ++i) {
    const transport::Completion& c = recv_completions_[i];
    const uint64_t buffer = c.wr_id;
    recv_sges_[i] = transport::Sge{reinterpret_cast<uint64_t>(memory_.receives + buffer * bytes),
                                   bytes, memory_.receives_lkey};
    if (c.status != transport::CompletionStatus::kSuccess || c.byte_len < transport::kGrhBytes) {
      counters_.dropped.Add();
      continue;
    }
    const uint8_t* message = memory_.receives + buffer * bytes + transport::kGrhBytes;
    const uint32_t length = c.byte_len - transport::kGrhBytes;
    if (length < kRequestTrailerBytes || length > config_.slot_bytes) {
      counters_.rejected.Add();  // no request is shorter than its header or longer than a slot
      continue;
    }
    // A SEND names its client in the immediate; the checksum under that client's secret then
    // says whether it really came from that client.
    const uint32_t client = c.imm_data;
    if (!c.has_imm || client >= config_.max_clients) {
      counters_.rejected.Add();
      continue;
    }
    Admit(client, kFromReceive, message, length, message - transport::kGrhBytes, c.src_qp, &count);
  }
  reposts_ = got;
  return count;
}

uint32_t Worker::LargeWritesAllowed() const {
  return gate_ == nullptr ? config_.postlist : gate_->LargeWritesAllowed(config_);
}

uint32_t Worker::GatherFromLanding(uint32_t count, uint32_t up_to) {
  if (count >= up_to) return count;
  const uint32_t want = up_to - count;
  const auto got =
      static_cast<uint32_t>(memory_.imm_cq->Poll(absl::MakeSpan(imm_completions_.data(), want)));
  const uint64_t landing_bytes = landing_bytes_;
  for (uint32_t i = 0; i < got; ++i) {
    const transport::Completion& c = imm_completions_[i];
    if (c.status != transport::CompletionStatus::kSuccess) {
      // A flushed receive of a QP in the error state (its immediate means nothing): nothing to
      // repost on a dead QP.
      counters_.rejected.Add();
      continue;
    }
    // The receive names the session whose QP it was posted on (its wr_id, set by the server:
    // the session's first client id), so it goes back whatever the sender wrote.
    const uint64_t owner = c.wr_id;
    const ClientRoute* session =
        owner < config_.max_clients ? routes_[owner].load(std::memory_order_seq_cst) : nullptr;
    if (session == nullptr || session->large_qpn != c.qp_num) {
      counters_.rejected.Add();  // a departed session's QP: nothing to repost on
      continue;
    }
    transport::RecvWr repost;
    repost.wr_id = owner;
    transport::RecvWr* bad = nullptr;
    if (absl::Status s = session->large_qp->PostRecv(&repost, &bad); !s.ok()) {
      LOG_EVERY_N(ERROR, 1000) << "worker " << index_ << ": re-posting a large receive: " << s;
    }
    // The immediate names a client of the session and one of its landing buffers here; both
    // are checked against the QP the WRITE came through (hostile input, as every byte is).
    const uint32_t client = c.imm_data >> kLandingBufferBits;
    const uint32_t buffer = c.imm_data & ((1u << kLandingBufferBits) - 1);
    const ClientRoute* route =
        client < config_.max_clients ? routes_[client].load(std::memory_order_seq_cst) : nullptr;
    if (route == nullptr || route->large_qpn != c.qp_num) {
      counters_.rejected.Add();  // an immediate naming a client of another session, or none
      continue;
    }
    if (!c.has_imm || buffer >= config_.landing_buffers || c.byte_len < kRequestTrailerBytes ||
        c.byte_len > landing_bytes) {
      counters_.rejected.Add();
      continue;
    }
    Admit(client, kFromLanding, route->landing + buffer * landing_bytes, c.byte_len, nullptr, 0,
          &count);
  }
  return count;
}

void Worker::StartSession(uint32_t client, const ClientRoute& route) {
  std::fill_n(slots_.begin() + uint64_t{client} * config_.window, config_.window, SlotState{});
  generations_seen_[client] = route.generation;
  // A backup's region is the primary's to write: it takes over outcomes only once promoted.
  if (!outcomes_ || route.resume_session == 0 || replica_ != nullptr) return;
  // Slot by slot, each entry read before it is written: the new id may be the old one.
  bool claimed = false;
  for (uint32_t slot = 0; slot < config_.window; ++slot) {
    MutationOutcome outcome;
    if (!outcomes_->Find(route.resume_client, slot, route.resume_session, &outcome)) continue;
    if (!claimed) {
      // Its client is back: the old id's entries (these, and any older session's, whose client
      // left the old primary before this one took the id) may be overwritten from now on. A
      // resumption naming a session that is not there claims nothing.
      awaiting_resume_[route.resume_client] = 0;
      claimed = true;
    }
    SlotState& state = slots_[uint64_t{client} * config_.window + slot];
    // last_attempt 0: the follower resends with attempt >= 1, which replays this outcome.
    state.last_seq = outcome.seq;
    state.status = static_cast<Status>(outcome.status);
    state.version = outcome.version;
    outcome.session = route.secret;  // under the new id too: a second failover finds it
    RecordOutcome(client, slot, outcome);
    counters_.resumed_outcomes.Add();
  }
}

void Worker::RecordOutcome(uint32_t client, uint32_t slot, const MutationOutcome& outcome) {
  if (awaiting_resume_[client] != 0) {
    counters_.unrecorded_outcomes.Add();  // the entry still holds an old client's outcome
    return;
  }
  outcomes_->Record(client, slot, outcome);
}

Worker::Admitted Worker::Admit(uint32_t client, uint32_t slot, const uint8_t* message,
                               uint32_t length, const uint8_t* grh, uint32_t src_qp,
                               uint32_t* count) {
  const ClientRoute* route = routes_[client].load(std::memory_order_seq_cst);
  if (route == nullptr) {
    counters_.dropped.Add();  // nobody to answer: the client id is not in use
    return Admitted::kConsumed;
  }
  if (generations_seen_[client] != route->generation) StartSession(client, *route);
  const bool from_receive = slot == kFromReceive;
  // A UD receive or a landed WRITE_WITH_IMM is whole when it completes: no grace period.
  const bool whole = from_receive || slot == kFromLanding;
  if (from_receive && (src_qp != route->ud_qpn ||
                       transport::SourceGidOfGrh(grh, memory_.grh_is_ipv4) != route->ud_gid)) {
    counters_.rejected.Add();  // a UD request names a client it was not sent by
    return Admitted::kConsumed;
  }
  Pending& p = batch_[*count];
  Status status = Status::kOk;
  if (ParseRequest(message, length, limits_, route->secret, &p.request, &status) ==
      Parse::kIncomplete) {
    if (whole) {
      counters_.rejected.Add();  // it arrived whole: it will never check out
      return Admitted::kConsumed;
    }
    // A slot: maybe a WRITE whose bytes are still landing. Give it a grace period.
    SlotState& state = slots_[uint64_t{client} * config_.window + slot];
    // The grace period belongs to these bytes: a new send into the slot (another seq, or a
    // retransmission: another checksum) starts its own.
    const uint64_t marker = PackMarker(p.request.header.seq, p.request.header.attempt);
    const uint64_t checksum = p.request.header.checksum;
    const int64_t now = absl::GetCurrentTimeNanos();
    if (state.incomplete_marker != marker || state.incomplete_checksum != checksum) {
      state.incomplete_marker = marker;
      state.incomplete_checksum = checksum;
      state.incomplete_since_ns = now;
      return Admitted::kNotYet;
    }
    if (now - state.incomplete_since_ns < kIncompleteGraceNs) return Admitted::kNotYet;
    state.incomplete_marker = 0;
    counters_.rejected.Add();
    return Admitted::kConsumed;
  }
  const RequestHeader& h = p.request.header;
  p.status = status;
  p.replay = false;
  p.client = client;
  p.route = route;
  p.version = 0;
  p.value_bytes = 0;
  p.slot = whole ? static_cast<uint32_t>(h.seq % config_.window) : slot;
  p.response_flags = 0;
  // Authentic (the session's checksum) but naming another slot: the session's own bug. Answered,
  // but kept out of the slot's dedupe state, which it does not belong to. Any other request,
  // valid or not, goes through it: a duplicate landing is never answered twice.
  const bool consistent = h.seq != 0 && h.seq % config_.window == p.slot;
  if (!consistent) p.status = Status::kBadRequest;
  SlotState* claim = nullptr;  // set when this send is new
  if (consistent) {
    SlotState& state = slots_[uint64_t{client} * config_.window + p.slot];
    state.incomplete_marker = 0;
    const SendKind kind =
        ClassifySend(state.last_seq, state.last_attempt, state.held, h.seq, h.attempt);
    switch (kind) {
      case SendKind::kOld:
        counters_.dropped.Add();  // its answer was already sent
        return Admitted::kConsumed;
      case SendKind::kDuplicate:
        counters_.duplicates.Add();  // its answer went out (or is going out) already
        return Admitted::kConsumed;
      case SendKind::kHeldRetransmission:
        // Executed, but not yet safe to acknowledge: the release answers this newest attempt.
        state.last_attempt = h.attempt;
        counters_.held_retransmissions.Add();
        return Admitted::kConsumed;
      case SendKind::kRetransmission:
      case SendKind::kNew:
        break;
    }
    switch (AdmissionOf(p.status, mica::PartitionOf(h.keyhash, config_.workers) == index_,
                        replica_ != nullptr, IsMutation(static_cast<Op>(h.op)), kind)) {
      case Admission::kWrongWorker:
        p.status = Status::kWrongWorker;
        break;
      case Admission::kNotPrimary:
        p.status = Status::kNotPrimary;  // recorded below: a retransmission replays it
        break;
      case Admission::kReplay:
        p.replay = true;  // executed once already: answer from the table, never apply twice
        break;
      case Admission::kKeepStatus:
      case Admission::kExecute:
        break;
    }
    claim = &state;
  }
  p.queue = nullptr;  // ExecuteAndRespond assigns the response's queue and staging buffer
  if (claim != nullptr) {
    // A new request in the slot: whatever the gate still holds for an older one is answered
    // never (AnswerReleased checks the sequence number).
    if (claim->last_seq != h.seq) claim->held = false;
    if (claim->last_seq != h.seq && IsMutation(static_cast<Op>(h.op))) {
      // Until the batch executes, a retransmission of this mutation must replay, not re-apply;
      // its outcome is filled in by ExecuteAndRespond before any replay of it is answered.
      claim->status = p.status;
      claim->version = 0;
    }
    claim->last_seq = h.seq;
    claim->last_attempt = h.attempt;
  }
  if (p.status != Status::kOk) counters_.bad_requests.Add();
  ++*count;
  return Admitted::kConsumed;
}

bool Worker::AssignResponse(Pending& p) {
  SendQueue* queue;
  if (config_.response_verb == ResponseVerb::kUdSend) {
    queue = &ud_queues_[next_ud_qp_];
    next_ud_qp_ = next_ud_qp_ + 1 == ud_queues_.size() ? 0 : next_ud_qp_ + 1;
  } else {
    queue = queues_[p.route->response_queue].load(std::memory_order_seq_cst);
  }
  if (queue == nullptr) return false;
  if (config_.response_verb == ResponseVerb::kUdSend) {
    // The worker's own UD queues: their completions wait on no client (UD has no ACKs), so a
    // full one is the NIC catching up, worth a bounded wait.
    if (!AwaitRoom(
            *queue, [this] { Reap(); }, kMaxWaitForRoom, kReapsPerClockCheck))
      return false;
  } else if (!queue->broken && !queue->HasRoom()) {
    // The client's own response QP: full while that client does not keep up (an RC peer that
    // stopped ACKing). The worker never waits on one peer: it drops the answer (counted) and
    // the client's retransmission gets it (a mutation's from the dedupe table).
    Reap();
    if (!queue->HasRoom()) {
      counters_.response_queue_full.Add();
      return false;
    }
  }
  if (queue->broken) return false;
  p.queue = queue;
  p.wr_index = SendChains::Reserve(*queue);
  p.staging = queue->StagingFor(p.wr_index);
  to_post_[to_post_count_++] = &p;
  return true;
}

void Worker::ExecuteAndRespond(uint32_t count) {
  // The store executes every valid, non-replayed request as one prefetched batch. A GET's value
  // lands directly in its response's staging buffer, so GETs take theirs before the store runs;
  // every other response takes its own afterwards, so a held one never reserves a send-queue
  // entry (and the WRs are still reserved and posted in the same order on each queue).
  uint32_t executed = 0;
  // A GET can read a write the backups may lack only when one was unreleased as the batch
  // began, or a mutation ahead of it in the batch wrote: otherwise its answer goes straight to
  // its staging buffer, as on an unreplicated server (no copy aside, no question to the gate).
  bool reads_may_wait = hold_reads_ && !gate_->ReadsCaughtUp();
  for (uint32_t i = 0; i < count; ++i) {
    Pending& p = batch_[i];
    p.held = false;
    p.dropped = false;
    p.aside = false;
    if (p.status != Status::kOk || p.replay) continue;
    const RequestHeader& h = p.request.header;
    const bool get = h.op == static_cast<uint8_t>(Op::kGet);
    if (!get) reads_may_wait = hold_reads_;
    p.aside = get && reads_may_wait;
    if (p.aside) {
      p.staging = get_aside_.data() + uint64_t{i} * read_answer_bytes_;
    } else if (get && !AssignResponse(p)) {
      p.dropped = true;  // unexecuted: the retransmission (a new attempt) executes it
      counters_.dropped.Add();
      continue;
    }
    mica::Request& r = store_requests_[executed];
    r.op = static_cast<mica::OpCode>(h.op);
    r.keyhash = h.keyhash;
    r.key = p.request.key();
    r.value = p.request.value;
    r.expected_version = h.expected_version;
    // A GET asking for a copy gets its value straight into the landing buffer it named, by the
    // store, in batch order: a later PUT of the batch may overwrite the item in the log. At
    // most what a landing buffer is sized for (a longer value: kBufferTooSmall, NO_MEMORY).
    const bool copy = get && h.flags == kRequestCopyToLanding && large_values_;
    r.value_out = copy  ? reinterpret_cast<char*>(LandingOf(p))
                  : get ? reinterpret_cast<char*>(p.staging)
                        : nullptr;
    r.value_out_bytes = copy ? landing_value_limit_ : get ? inline_limit_ : 0;
    store_index_[executed++] = i;
  }
  if (replica_ == nullptr) {
    partition_->ExecuteBatch(absl::MakeSpan(store_requests_.data(), executed),
                             absl::MakeSpan(store_responses_.data(), executed));
  } else {
    // A backup's batch holds only GETs (Admit answered every mutation NOT_PRIMARY).
    for (uint32_t e = 0; e < executed; ++e) {
      store_responses_[e] = replica_->Get(store_requests_[e]);
    }
  }
  for (uint32_t e = 0; e < executed; ++e) {
    Pending& p = batch_[store_index_[e]];
    const mica::Response& r = store_responses_[e];
    const Op op = static_cast<Op>(p.request.header.op);
    p.status = WireStatus(p, r.result);
    p.version = p.status == Status::kInternal ? 0 : r.version;
    p.value_bytes = op == Op::kGet && r.result == mica::Result::kOk ? r.value_bytes : 0;
    if (op == Op::kGet && large_values_) {
      const bool copy = p.request.header.flags == kRequestCopyToLanding;
      if (copy && r.result == mica::Result::kOk) {
        AnswerCopied(p);
      } else if (copy && r.result == mica::Result::kBufferTooSmall) {
        // The value is longer than a landing buffer (--landing_value_bytes): no copy can answer.
        p.status = Status::kNoMemory;
        p.version = 0;
      } else if (r.result == mica::Result::kBufferTooSmall) {
        AnswerOutOfLine(p, r);
      }
    }
    if (p.aside && (p.status == Status::kOk || p.status == Status::kNotFound) &&
        gate_->ReadMustWait(p.status == Status::kOk, p.version, p.request.header.keyhash)) {
      if (!HoldReadAnswer(p)) p.dropped = true;  // its retransmission reads again
    }
    if (!IsMutation(op)) continue;
    SlotState& state = slots_[uint64_t{p.client} * config_.window + p.slot];
    state.version = r.version;
    state.status = p.status;
    if (outcomes_) {
      // In this batch's chain with the mutation's own bytes (replication/outcome_table.h).
      MutationOutcome outcome;
      outcome.session = p.route->secret;
      outcome.seq = p.request.header.seq;
      outcome.version = p.version;
      outcome.status = static_cast<uint8_t>(p.status);
      RecordOutcome(p.client, p.slot, outcome);
    }
    if (gate_ != nullptr &&
        gate_->Hold(ExecutedMutation{
            HeldId{p.client, p.slot, generations_seen_[p.client], p.request.header.seq}, op,
            p.request.header.keyhash, p.status, p.version})) {
      state.held = true;
      p.held = true;
      counters_.held.Add();
    }
  }
  if (gate_ != nullptr && executed > 0) gate_->EndBatch();
  uint32_t answered = 0;
  for (uint32_t i = 0; i < count; ++i) {
    Pending& p = batch_[i];
    if (p.dropped || p.held) continue;
    if (p.replay) {
      const SlotState& state = slots_[uint64_t{p.client} * config_.window + p.slot];
      if (state.held) {
        // Its original ran in this very batch and is held: the release answers it.
        counters_.held_retransmissions.Add();
        continue;
      }
      p.status = state.status;
      p.version = state.version;
      p.value_bytes = 0;
      counters_.replays.Add();
    }
    if (p.status != Status::kOk) p.value_bytes = 0;
    // A GET's answer kept aside moves to its staging buffer once it has one.
    const uint8_t* aside = p.aside && p.queue == nullptr ? p.staging : nullptr;
    if (p.queue == nullptr && !AssignResponse(p)) {
      counters_.dropped.Add();  // a mutation's retransmission replays its recorded outcome
      continue;
    }
    if (aside != nullptr && p.value_bytes > 0) std::memcpy(p.staging, aside, p.value_bytes);
    EncodeResponse(p);
    ++answered;
  }
  PostResponses();
  counters_.requests.Add(answered);
  counters_.batches.Add();
}

Status Worker::WireStatus(const Pending& p, mica::Result result) {
  switch (result) {
    case mica::Result::kOk:
    case mica::Result::kNotFound:
    case mica::Result::kCasFailed:
    case mica::Result::kKeyTooLong:
    case mica::Result::kValueTooLong:
    case mica::Result::kBufferTooSmall:
    case mica::Result::kInvalidOp:
    case mica::Result::kExists:
    case mica::Result::kNoMemory:
      return static_cast<Status>(result);  // the same values (static_asserts above)
    case mica::Result::kCorrupt:
      // A backup's read that found its replica changing throughout (replication/replica_reader.h).
      if (replica_ != nullptr) return Status::kBackupBusy;
      break;
  }
  // The server's own fault, not the request's: answered, never crashed on, nothing delivered.
  counters_.internal_errors.Add();
  LOG_EVERY_N(ERROR, kInternalLogEvery)
      << "worker " << index_ << ": " << OpName(static_cast<Op>(p.request.header.op))
      << " of keyhash " << p.request.header.keyhash << " answered INTERNAL: "
      << (result == mica::Result::kCorrupt
              ? "the item in the log fails its checksum (damaged memory)"
              : "the store returned a result the engine does not know")
      << " (mica result " << static_cast<int>(result) << ", " << mica::ResultName(result) << ", "
      << counters_.internal_errors.Get() << " so far)";
  return Status::kInternal;
}

uint8_t* Worker::LandingOf(const Pending& p) const {
  // ParseRequest bounded landing_buffer by landing_buffers.
  return p.route->landing + uint64_t{p.request.header.landing_buffer} * landing_bytes_;
}

void Worker::AnswerCopied(Pending& p) {
  uint8_t* buffer = LandingOf(p);
  if (p.value_bytes <= inline_limit_) {
    std::memcpy(p.staging, buffer, p.value_bytes);  // short after all: answered inline
    return;
  }
  // The fallback: a copy the client's READ cannot see torn (no one else writes its landing
  // buffer, and the client accepts only the newest attempt's copy).
  const ValueDescriptor d{reinterpret_cast<uint64_t>(buffer), p.route->landing_rkey, p.value_bytes};
  std::memcpy(p.staging, &d, sizeof(d));
  p.response_flags = kResponseOutOfLine | kResponseCopied;
  p.value_bytes = sizeof(d);
  counters_.copied_values.Add();
}

void Worker::AnswerOutOfLine(Pending& p, const mica::Response& r) {
  const ValueDescriptor d{p.route->log_addr + r.item_position, p.route->log_rkey, r.item_bytes};
  std::memcpy(p.staging, &d, sizeof(d));
  p.response_flags = kResponseOutOfLine;
  p.status = Status::kOk;
  p.value_bytes = sizeof(d);
  counters_.out_of_line.Add();
}

void Worker::EncodeResponse(const Pending& p) {
  ResponseHeader header{};
  header.version = p.version;
  header.value_bytes = p.value_bytes;
  header.status = static_cast<uint8_t>(p.status);
  header.flags = p.response_flags;
  header.worker = static_cast<uint16_t>(index_);
  header.attempt = p.request.header.attempt;
  header.seq = p.request.header.seq;
  // A WRITE response can be torn by a late duplicate landing in the same slot: it carries a
  // checksum. A UD response lands whole in a receive buffer only the client's QP fills.
  EncodeResponseHeader(header, config_.response_uses_slots() ? p.route->secret : 0, p.staging);
}

bool Worker::HoldReadAnswer(Pending& p) {
  if (free_held_reads_.empty()) {
    counters_.reads_unanswered.Add();
    return false;
  }
  const uint32_t index = free_held_reads_.back();
  free_held_reads_.pop_back();
  HeldRead& read = held_reads_[index];
  read = HeldRead{true, p.status, p.response_flags, p.value_bytes, p.version};
  if (p.value_bytes > 0) {
    std::memcpy(held_read_bytes_.data() + uint64_t{index} * read_answer_bytes_, p.staging,
                p.value_bytes);
  }
  SlotState& state = slots_[uint64_t{p.client} * config_.window + p.slot];
  state.held = true;  // a retransmission meanwhile is consumed; the release answers it
  HeldId id{p.client, p.slot, generations_seen_[p.client], p.request.header.seq};
  id.read = index;
  gate_->HoldRead(id);
  p.held = true;
  counters_.reads_held.Add();
  return true;
}

void Worker::AnswerReleased() {
  const uint32_t released = gate_->Release(absl::MakeSpan(released_));
  if (released == 0) return;
  uint32_t answered = 0;
  for (uint32_t k = 0; k < released; ++k) {
    const HeldId& id = released_[k];
    // A held GET's buffer is free again whatever becomes of its answer (a gate that names one
    // twice, or one never held, frees nothing).
    HeldRead* read = nullptr;
    if (id.read != kNotARead) {
      if (id.read >= held_reads_.size() || !held_reads_[id.read].in_use) continue;
      read = &held_reads_[id.read];
      read->in_use = false;
      free_held_reads_.push_back(id.read);
    }
    if (id.client >= config_.max_clients || id.slot >= config_.window) continue;
    SlotState& state = slots_[uint64_t{id.client} * config_.window + id.slot];
    const ClientRoute* route = routes_[id.client].load(std::memory_order_seq_cst);
    // A release for a slot that moved on (a new session took the client id) answers nothing.
    if (route == nullptr || route->generation != id.generation ||
        generations_seen_[id.client] != id.generation || !state.held || state.last_seq != id.seq) {
      continue;
    }
    state.held = false;
    // batch_ is free between batches: a released response is built as a replay would be.
    Pending& p = batch_[answered];
    p.client = id.client;
    p.slot = id.slot;
    p.route = route;
    p.status = read != nullptr ? read->status : state.status;
    p.version = read != nullptr ? read->version : state.version;
    p.value_bytes = read != nullptr ? read->value_bytes : 0;
    p.response_flags = read != nullptr ? read->response_flags : 0;
    p.request.header.attempt = state.last_attempt;
    p.request.header.seq = id.seq;
    p.queue = nullptr;
    if (!AssignResponse(p)) {
      // Its retransmission replays it from the dedupe table (a GET's reads again).
      counters_.dropped.Add();
      continue;
    }
    if (p.value_bytes > 0) {
      // Still valid: freed above, but nothing takes a held-read buffer until the next batch.
      std::memcpy(p.staging, held_read_bytes_.data() + uint64_t{id.read} * read_answer_bytes_,
                  p.value_bytes);
    }
    EncodeResponse(p);
    ++answered;
  }
  PostResponses();
  counters_.released.Add(answered);
  counters_.requests.Add(answered);
}

void Worker::PostResponses() {
  // One chain (one doorbell) per queue the responses use, in reservation order within each.
  for (uint32_t i = 0; i < to_post_count_; ++i) {
    const Pending& p = *to_post_[i];
    const uint32_t length = ResponseBytes(p.value_bytes);
    transport::Sge& sge = chains_.NextSge();
    sge = transport::Sge{reinterpret_cast<uint64_t>(p.staging), length, p.queue->staging_lkey};
    transport::SendWr& wr = chains_.NextWr();
    wr.wr_id = p.queue->WrId(p.wr_index);
    wr.num_sge = 1;
    wr.flags = p.queue->Signal(p.wr_index) ? uint32_t{transport::kSignaled} : 0u;
    if (config_.use_inline && length <= config_.max_inline) wr.flags |= transport::kInline;
    if (config_.response_verb == ResponseVerb::kUdSend) {
      wr.opcode = transport::Opcode::kSendWithImm;
      wr.imm_data = p.client;  // the response names its client here, not in its bytes
      wr.ah = p.route->ah;
      wr.remote_qpn = p.route->ud_qpn;
      wr.remote_qkey = p.route->ud_qkey;
    } else {
      wr.opcode = transport::Opcode::kWrite;
      wr.remote_addr =
          p.route->response_addr + uint64_t{p.slot + 1} * config_.response_slot_bytes() - length;
      wr.rkey = p.route->response_rkey;
    }
    chains_.Append(p.queue);
  }
  to_post_count_ = 0;
  counters_.dropped.Add(chains_.Post());
  for (uint32_t q = 0; q < ud_queues_.size(); ++q) {
    ud_progress_[q].posted.store(ud_queues_[q].posted, std::memory_order_release);
  }
}

void Worker::RepostReceives(uint32_t count) {
  if (count == 0) return;
  for (uint32_t i = 0; i < count; ++i) {
    recv_wrs_[i] = transport::RecvWr{};
    const uint32_t bytes = memory_.receive_bytes;
    recv_wrs_[i].wr_id =
        (recv_sges_[i].addr - reinterpret_cast<uint64_t>(memory_.receives)) / bytes;
    recv_wrs_[i].sg_list = &recv_sges_[i];
    recv_wrs_[i].num_sge = 1;
    recv_wrs_[i].next = i + 1 < count ? &recv_wrs_[i + 1] : nullptr;
  }
  transport::RecvWr* bad = nullptr;
  if (absl::Status s = ud_qps_[0]->PostRecv(recv_wrs_.data(), &bad); !s.ok()) {
    LOG_EVERY_N(ERROR, 1000) << "worker " << index_ << ": re-posting receives failed: " << s;
  }
}

void Worker::PostFences() {
  const uint64_t requested = fence_requests_.load(std::memory_order_relaxed);
  if (fence_.ah == nullptr) {
    fences_seen_ = requested;
    return;
  }
  bool all = true;
  for (uint32_t q = 0; q < ud_queues_.size(); ++q) {
    SendQueue& queue = ud_queues_[q];
    if (queue.broken || queue.posted == queue.retired) continue;
    if (!queue.HasRoom()) {
      all = false;  // WRs are in flight: tried again once some retire
      continue;
    }
    transport::SendWr wr;
    wr.wr_id = queue.WrId(queue.posted);
    wr.opcode = transport::Opcode::kSend;
    wr.num_sge = 0;
    wr.flags = transport::kSignaled;
    wr.ah = fence_.ah;
    wr.remote_qpn = fence_.qpn;
    wr.remote_qkey = fence_.qkey;
    transport::SendWr* bad = nullptr;
    if (absl::Status s = queue.qp->PostSend(&wr, &bad); !s.ok()) {
      LOG_EVERY_N(WARNING, 1000) << "worker " << index_ << ": a fence was not posted: " << s;
      all = false;
      continue;
    }
    ++queue.posted;
    ud_progress_[q].posted.store(queue.posted, std::memory_order_release);
    counters_.fences.Add();
  }
  if (all) fences_seen_ = requested;
}

void Worker::Reap() {
  const size_t got = send_cq_->Poll(absl::MakeSpan(send_completions_));
  for (size_t i = 0; i < got; ++i) {
    const transport::Completion& c = send_completions_[i];
    const uint16_t slot = TableSlotOf(c.wr_id);
    if (slot >= queues_.size()) continue;
    SendQueue* queue = queues_[slot].load(std::memory_order_seq_cst);
    if (queue == nullptr) continue;
    queue->Complete(c.wr_id, c.status == transport::CompletionStatus::kSuccess);
    if (slot < ud_progress_.size()) {
      ud_progress_[slot].retired.store(queue->retired, std::memory_order_release);
    }
  }
}

}  // namespace herd
