// The worker: executing a batch in the store and encoding each answer (inline, out of line for
// the client to READ, or copied into its landing buffer).
#include <cstring>

#include "glog/logging.h"
#include "herd/worker.h"
#include "herd/worker_internal.h"

namespace herd {
namespace {

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

}  // namespace

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

}  // namespace herd
