// Client: checking, staging and posting requests (one doorbell per QP per flush), and the
// send queues' completions.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "herd/client.h"
#include "mica/keyhash.h"
#include "util/modulo.h"

namespace herd {

bool Client::CanSubmit(uint32_t client, uint64_t keyhash, uint64_t value_bytes) const {
  const uint32_t worker = WorkerOf(keyhash);
  const uint64_t seq = next_seq_[uint64_t{client} * config_.workers + worker];
  const Outstanding& o =
      slots_[SlotIndex(client, worker, static_cast<uint32_t>(util::Mod(seq, config_.window)))];
  if (o.active || !BufferFree(o)) return false;
  if (value_bytes <= config_.inline_limit()) return true;
  const SendQueue& large = queues_[large_queue_base_ + worker];
  for (uint32_t b = 0; b < config_.landing_buffers; ++b) {
    const Landing& l = landings_[uint64_t{worker} * config_.landing_buffers + b];
    if (!l.used && (!l.in_flight || large.retired > l.last_wr)) return true;
  }
  return false;
}

bool Client::BufferFree(const Outstanding& o) const {
  if (!o.buffer_in_flight) return true;
  return queues_[o.queue].retired > o.last_wr;
}

absl::Status Client::CheckRequest(Op op, std::string_view key, std::string_view value) const {
  if (key.empty() || key.size() > config_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KEY_TOO_LONG: a key of %d bytes; the server takes 1..%d", key.size(),
                        config_.max_key_bytes));
  }
  if (!CarriesValue(op)) return absl::OkStatus();
  if (value.size() > config_.value_limit()) {
    return absl::OutOfRangeError(
        absl::StrFormat("VALUE_TOO_LONG: a value of %d bytes; the server takes at most %d",
                        value.size(), config_.value_limit()));
  }
  // Out of line, the whole request lands in one of the worker's landing buffers: a server may
  // provision them for less than its value limit (--landing_value_bytes).
  if (value.size() > config_.inline_limit()) {
    const uint64_t request =
        RequestBytes(op, static_cast<uint32_t>(key.size()), static_cast<uint32_t>(value.size()));
    if (request > config_.landing_bytes()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "NO_MEMORY: a %d-byte value makes a %d-byte request, longer than the server's %d-byte "
          "landing buffers (--landing_value_bytes=%d); nothing was sent",
          value.size(), request, config_.landing_bytes(), config_.landing_value_limit()));
    }
  }
  return absl::OkStatus();
}

absl::Status Client::Submit(uint32_t client, Op op, std::string_view key, std::string_view value,
                            uint64_t expected_version, uint64_t tag) {
  return Submit(client, op, key, mica::KeyHash(key), value, expected_version, tag);
}

absl::Status Client::Submit(uint32_t client, Op op, std::string_view key, uint64_t keyhash,
                            std::string_view value, uint64_t expected_version, uint64_t tag) {
  DCHECK_EQ(keyhash, mica::KeyHash(key));
  if (!health_.ok()) return health_;
  if (client >= options_.clients) {
    return absl::InvalidArgumentError(
        absl::StrFormat("client %d: this connection hosts %d", client, options_.clients));
  }
  if (!CarriesValue(op)) value = {};
  if (absl::Status s = CheckRequest(op, key, value); !s.ok()) return s;
  uint64_t& next = next_seq_[uint64_t{client} * config_.workers + WorkerOf(keyhash)];
  if (next > kMaxSeq) {
    return absl::ResourceExhaustedError(
        "this stream's sequence numbers are spent (2^48 requests): connect a new Client");
  }
  if (absl::Status s = Stage(Staged{client, op, key, keyhash, value, expected_version, tag, next,
                                    /*attempt=*/0, Clock::now()});
      !s.ok()) {
    return s;
  }
  ++next;
  ++stats_.submitted;
  return absl::OkStatus();
}

absl::Status Client::Stage(const Staged& r) {
  if (r.attempt > kMaxAttempt) {  // past the marker's attempt bits (HandOver clamps to it)
    return absl::ResourceExhaustedError("a request's attempt numbers are spent");
  }
  // Over the inline limit: WRITE_WITH_IMM into a landing buffer at the worker.
  const bool large = r.value.size() > config_.inline_limit();
  const uint32_t worker = WorkerOf(r.keyhash);
  const auto slot = static_cast<uint32_t>(util::Mod(r.seq, config_.window));
  const uint64_t index = SlotIndex(r.client, worker, slot);
  Outstanding& o = slots_[index];
  if (o.active) {
    return absl::ResourceExhaustedError("the window to this key's worker is full: Poll first");
  }
  if (!BufferFree(o)) {
    Reap();
    if (!BufferFree(o)) {
      return absl::ResourceExhaustedError(
          "the slot's previous request is still being read by the NIC: Poll first");
    }
  }
  // The slot's previous request no longer reads its buffer: forget it (the next request may go
  // on another queue, whose WR indices say nothing about that one).
  o.buffer_in_flight = false;
  int32_t landing = -1;
  if (large) {
    landing = TakeLanding(worker);
    if (landing < 0) {
      return absl::ResourceExhaustedError(
          "every landing buffer at this key's worker is in use by a large PUT: Poll first");
    }
  }
  RequestHeader header{};
  header.keyhash = r.keyhash;
  header.expected_version = r.op == Op::kCas ? r.expected_version : 0;
  header.value_bytes = static_cast<uint32_t>(r.value.size());
  header.key_bytes = static_cast<uint16_t>(r.key.size());
  header.op = static_cast<uint8_t>(r.op);
  header.attempt = r.attempt;
  header.seq = r.seq;
  o.large_body = large;
  o.landing = landing;
  o.read = -1;
  o.read_state = ReadState::kNone;
  o.item_reads = 0;
  o.queue = large ? large_queue_base_ + worker : (config_.request_uses_slots() ? 1 + worker : 0);
  o.client = r.client;
  o.worker = worker;
  o.slot = slot;
  o.length = EncodeRequest(header, r.key, r.value, welcome_.secret, StagedBytes(o));
  o.active = true;
  o.op = r.op;
  o.sends = 0;
  o.holds = 0;
  o.attempt = r.attempt;
  o.seq = r.seq;
  o.tag = r.tag;
  o.keyhash = r.keyhash;
  o.submitted = r.submitted;
  o.handed_over = r.attempt > 0;
  if (absl::Status s = Send(o, /*wait_for_room=*/true); !s.ok()) {
    // Nothing was posted: the request never existed, its slot and sequence number stay free.
    o.active = false;
    ReleaseLanding(o);
    return s;
  }
  if (large) ++stats_.large_puts;
  // A new request's clock was read by Submit; a handed-over one was submitted before a failover.
  o.deadline = (r.attempt == 0 ? r.submitted : Clock::now()) + timers_[o.worker].TimeoutFor(1);
  // With nothing outstanding, no gap in watching can matter before this: the next absence, if
  // any, starts here (not at the last Poll, maybe an idle hour ago).
  if (outstanding_ == 0 && r.attempt == 0) last_watch_ = std::max(last_watch_, r.submitted);
  ++outstanding_;
  MarkLive(o);
  return absl::OkStatus();
}

uint8_t* Client::StagedBytes(const Outstanding& o) const {
  if (o.large_body) {
    return landing_staging_->data() +
           (uint64_t{o.worker} * config_.landing_buffers + static_cast<uint32_t>(o.landing)) *
               config_.landing_bytes();
  }
  return staging_->data() + SlotIndex(o.client, o.worker, o.slot) * config_.slot_bytes;
}

absl::Status Client::Send(Outstanding& o, bool wait_for_room) {
  SendQueue& queue = queues_[o.queue];
  // Room counts the WRs staged for the next doorbell too. A queue full of this client's own
  // staged requests frees up only once they are posted (their completions, or a later signalled
  // one, retire them): post them before waiting on completions.
  auto make_room = [this, &queue] {
    if (queue.unposted > 0) (void)Flush();
    Reap();
  };
  if (!queue.broken && !queue.HasRoom()) make_room();
  if (!queue.broken && !queue.HasRoom()) {
    if (!wait_for_room) return absl::ResourceExhaustedError("the request send queue is full");
    const Clock::time_point give_up =
        Clock::now() + absl::ToChronoNanoseconds(options_.send_queue_timeout);
    while (!queue.broken && !queue.HasRoom()) {
      make_room();
      if (Clock::now() > give_up) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "the request send queue stayed full for %s (%d WRs, no completion): the NIC or the "
            "QP is stuck",
            absl::FormatDuration(options_.send_queue_timeout), queue.depth));
      }
    }
  }
  if (queue.broken) {
    return absl::UnavailableError(
        "the request QP is in the error state (the server is gone?): reconnect");
  }
  uint8_t* staged = StagedBytes(o);
  o.excused = false;  // a new send, a new timeout (its caller sets the deadline)
  o.client_away = false;
  // A retransmission is a new attempt (the worker tells it from a duplicate landing of the last
  // one) unless a WR still reads the buffer: then the same bytes go again, and the next
  // retransmission, after that WR retired, is the new attempt.
  const bool new_attempt = o.sends == 0 || BufferFree(o);
  // At kMaxAttempt the same bytes go again (a duplicate the worker drops): the next attempt
  // number would not fit the marker, and Retransmit ends the request.
  if (o.sends > 0 && new_attempt && o.attempt < kMaxAttempt) {
    SetRequestAttempt(++o.attempt, welcome_.secret, staged, o.length);
  }
  // A full chain goes first, so that a failure to post it never involves this request (a Submit
  // that fails leaves no trace; the chain's requests are retransmitted).
  if (chains_.size() == kMaxChainedRequests) (void)Flush();
  const uint64_t wr_index = SendChains::Reserve(queue);
  transport::Sge& sge = chains_.NextSge();
  sge = transport::Sge{reinterpret_cast<uint64_t>(staged), o.length,
                       o.large_body ? landing_staging_mr_->lkey() : staging_mr_->lkey()};
  const bool inline_send = config_.use_inline && o.length <= config_.max_inline && !o.large_body;
  transport::SendWr& wr = chains_.NextWr();
  wr.wr_id = queue.WrId(wr_index);
  wr.num_sge = 1;
  // Non-inline WRs are signalled so their buffers are known free; retransmissions too, rare.
  const bool signal = queue.Signal(wr_index) || !inline_send || o.sends > 0;
  wr.flags = signal ? uint32_t{transport::kSignaled} : 0u;
  if (inline_send) wr.flags |= transport::kInline;
  if (o.large_body) {
    // The whole request at the start of its landing buffer; the immediate names it, and its
    // completion at the worker says every byte landed.
    wr.opcode = transport::Opcode::kWriteWithImm;
    wr.remote_addr = welcome_.landing_addr + (uint64_t{o.worker} * config_.landing_buffers +
                                              static_cast<uint32_t>(o.landing)) *
                                                 config_.landing_bytes();
    wr.rkey = welcome_.landing_rkey;
    wr.imm_data = LandingImmediate(first_client_id_ + o.client, static_cast<uint32_t>(o.landing));
  } else if (config_.request_uses_slots()) {
    wr.opcode = transport::Opcode::kWrite;
    // End-aligned in the slot, inside this session's block ([client][worker][window]).
    wr.remote_addr = welcome_.region_addr + config_.SlotOffset(o.worker, o.client, o.slot) +
                     config_.slot_bytes - o.length;
    wr.rkey = welcome_.region_rkey;
  } else {
    wr.opcode = transport::Opcode::kSendWithImm;
    wr.imm_data = first_client_id_ + o.client;  // the request names its client here
    wr.ah = worker_ahs_[o.worker].get();
    wr.remote_qpn = welcome_.worker_ud[o.worker].qp_num;
    wr.remote_qkey = kQkey;
  }
  chains_.Append(&queue);
  if (!batching_) {
    // Alone in the chain: if it is not posted, nothing reads its buffer and it was never sent.
    if (absl::Status s = Flush(); !s.ok()) return s;
  }
  if (!inline_send) {
    o.buffer_in_flight = true;
    o.last_wr = wr_index;
    if (o.large_body) {
      Landing& landing = landings_[uint64_t{o.worker} * config_.landing_buffers +
                                   static_cast<uint32_t>(o.landing)];
      landing.in_flight = true;
      landing.last_wr = wr_index;
    }
  }
  ++o.sends;
  return absl::OkStatus();
}

absl::Status Client::Flush() {
  if (chains_.size() == 0) return absl::OkStatus();
  const uint32_t staged = chains_.size();
  const uint32_t not_posted = chains_.Post();
  if (not_posted == 0) return absl::OkStatus();
  return absl::UnavailableError(absl::StrFormat(
      "%d of %d staged requests could not be posted (a broken QP?)", not_posted, staged));
}

void Client::Reap() {
  const size_t got = send_cq_->Poll(absl::MakeSpan(completions_));
  for (size_t i = 0; i < got; ++i) {
    const uint16_t slot = TableSlotOf(completions_[i].wr_id);
    if (slot < queues_.size()) {
      queues_[slot].Complete(completions_[i].wr_id,
                             completions_[i].status == transport::CompletionStatus::kSuccess);
    }
  }
}

void Client::RepostReceives() {
  if (to_repost_.empty()) return;
  for (size_t i = 0; i < to_repost_.size(); ++i) {
    const uint32_t buffer = to_repost_[i];
    recv_sges_[i] = transport::Sge{
        reinterpret_cast<uint64_t>(receives_->data() + uint64_t{buffer} * receive_bytes_),
        receive_bytes_, receives_mr_->lkey()};
    recv_wrs_[i] = transport::RecvWr{};
    recv_wrs_[i].wr_id = buffer;
    recv_wrs_[i].sg_list = &recv_sges_[i];
    recv_wrs_[i].num_sge = 1;
    recv_wrs_[i].next = i + 1 < to_repost_.size() ? &recv_wrs_[i + 1] : nullptr;
  }
  transport::RecvWr* bad = nullptr;
  if (absl::Status s = ud_qp_->PostRecv(recv_wrs_.data(), &bad); !s.ok()) {
    LOG_EVERY_N(ERROR, 1000) << "re-posting receives failed: " << s;
  }
  to_repost_.clear();
}

}  // namespace herd
