// The worker: its poll loop, gathering requests from slots, receives and landing buffers, and
// its sessions. Admission is in worker_admit.cc, execution in worker_execute.cc, responses in
// worker_respond.cc.
#include "herd/worker.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "herd/slot_scanner.h"
#include "herd/worker_internal.h"

namespace herd {
namespace {

// A large PUT's immediate names the client id and the landing buffer in 16 bits each.
static_assert(kMaxClients <= (uint64_t{1} << (32 - kLandingBufferBits)) &&
              kMaxLandingBuffers <= (1u << kLandingBufferBits));

// Consecutive empty polls before the worker yields its core once. On a dedicated core nothing
// else is runnable and yield returns at once; on a shared development machine it lets the
// clients run.
constexpr uint32_t kIdlePollsBeforeYield = 256;

}  // namespace

using worker_internal::kFromLanding;
using worker_internal::kFromReceive;

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

}  // namespace herd
