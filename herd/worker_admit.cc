// The worker: admitting a request from a slot, a receive or a landing buffer (the rules are
// herd/admission.h's), and reserving its response's send-queue entry.
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "herd/admission.h"
#include "herd/worker.h"
#include "herd/worker_internal.h"
#include "util/modulo.h"

namespace herd {
namespace {

// How long a worker waits for send-queue room before it drops a response (the peer behind a
// connected queue is gone or stuck; the client will retransmit). Time, not a poll count: a
// NIC, rxe under emulation and the shm fabric complete sends at very different speeds.
constexpr absl::Duration kMaxWaitForRoom = absl::Milliseconds(100);
// Reaps between two looks at the clock while waiting for room.
constexpr uint32_t kReapsPerClockCheck = 256;
// How long a slot may show a marker over a message that does not check out (lengths or
// checksum) before the worker gives up on it and clears it. A WRITE still landing completes in
// microseconds on a NIC and in well under this on Soft-RoCE under emulation; bytes that never
// check out were not written by the slot's session (or were corrupted), and get no answer.
constexpr int64_t kIncompleteGraceNs = 10'000'000;  // 10 ms

}  // namespace

using worker_internal::kFromLanding;
using worker_internal::kFromReceive;

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
  p.slot = whole ? static_cast<uint32_t>(util::Mod(h.seq, config_.window)) : slot;
  p.response_flags = 0;
  // Authentic (the session's checksum) but naming another slot: the session's own bug. Answered,
  // but kept out of the slot's dedupe state, which it does not belong to. Any other request,
  // valid or not, goes through it: a duplicate landing is never answered twice.
  const bool consistent = h.seq != 0 && util::Mod(h.seq, config_.window) == p.slot;
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

}  // namespace herd
