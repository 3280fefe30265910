// Client: Poll. UD and WRITE responses checked and delivered, requests ended, the
// retransmission timer and the server's health.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "herd/client.h"
#include "util/modulo.h"
#include "util/prefetch.h"

namespace herd {
namespace {

// UD responses: Polls with no response read the clock (for the retransmission check) once in
// this many; an empty poll of a CQ is about 50-100 ns, the retry timeout milliseconds. (WRITE
// responses: every Poll looks at every outstanding request's slot, and reads it.)
constexpr uint32_t kPollsPerIdleClockRead = 64;
// A worker that answered nothing for this fraction of its timeout is silent (Retransmit).
constexpr int kSilenceFraction = 2;
// How often Poll asks the control connection whether the server is still there (a syscall).
constexpr absl::Duration kHealthCheckInterval = absl::Milliseconds(10);

}  // namespace

Client::Accepted Client::Accept(const ParsedResponse& response, Result* out) {
  const ResponseHeader& h = response.header;
  const uint32_t client = h.client_id - first_client_id_;  // wraps for foreign ids
  if (client >= options_.clients || h.worker >= config_.workers ||
      h.value_bytes > config_.slot_value_bytes()) {
    return Accepted::kStray;
  }
  const auto slot = static_cast<uint32_t>(util::Mod(h.seq, config_.window));
  Outstanding& o = slots_[SlotIndex(client, h.worker, slot)];
  if (!o.active || o.seq != h.seq || h.attempt > o.attempt) {
    return Accepted::kStray;
  }
  const auto status = static_cast<Status>(h.status);
  if (o.op != Op::kGet && h.value_bytes != 0) return Accepted::kStray;
  // An answer while its value is being read is a duplicate of the one that named it.
  if (o.read_state != ReadState::kNone) return Accepted::kStray;
  // A GET that asked for a copy into its landing buffer takes only its newest attempt's answer:
  // after it, no attempt of it can still copy into the buffer (older ones are duplicates at the
  // worker), so the buffer may be reused once this one is delivered.
  if (o.landing >= 0 && !o.large_body && h.attempt != o.attempt) return Accepted::kStray;
  // Every answer samples the time since the request was FIRST sent. Sampling only first-attempt
  // answers (Karn) sees only the requests fast enough to beat the timeout, and an answer to a
  // retransmission timed from that retransmission sees only the residual wait of a request
  // that sat unscanned in its slot (the retransmission overwrote it): both bias the estimate
  // low, and a timeout below the real round trip retransmits everything slower (measured:
  // window 1024, 0.4-1.2M retransmissions and 4x lower throughput). Timing from the first send
  // errs high only for requests that were really lost, which are rare.
  // A request handed over by Follow was first sent before the failover: not a round trip.
  // Only an answer taken (not a stray) is a round trip.
  const bool out_of_line = (h.flags & kResponseOutOfLine) != 0;
  if (!out_of_line && h.flags != 0) return Accepted::kStray;
  if (out_of_line && !DeferOutOfLine(o, h, response.value)) return Accepted::kStray;
  // Nor is an answer whose wait the client's own absence lengthened (ExcuseAbsence: the clock
  // read first, as it may find the absence).
  const Clock::time_point now = PollClock();
  // The first answer since a probe went: the requests held for it are due a timeout from now.
  if (probe_sent_[o.worker] > last_answer_[o.worker]) [[unlikely]] {
    next_retry_check_ = std::min(next_retry_check_, now + timers_[o.worker].TimeoutFor(1));
  }
  if (now - last_answer_[o.worker] >= absence_threshold_) [[unlikely]] {
    ExcuseSilence(o.worker, now - last_answer_[o.worker], now);
  }
  last_answer_[o.worker] = now;
  if (!o.handed_over && !o.client_away) {
    timers_[o.worker].Sample(
        SincePoll(o.submitted),
        std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()),
        /*resent=*/o.sends > 1);
  }
  if (out_of_line) return Accepted::kDeferred;
  Deliver(o, status, h.version,
          std::string_view(reinterpret_cast<const char*>(response.value), h.value_bytes), out);
  return Accepted::kDelivered;
}

void Client::Deliver(Outstanding& o, Status status, uint64_t version, std::string_view value,
                     Result* out) {
  out->tag = o.tag;
  out->client = o.client;
  out->worker = o.worker;
  out->op = o.op;
  out->status = status;
  out->version = version;
  out->value = value;
  out->attempts = o.sends;
  out->latency_ns = static_cast<uint64_t>(SincePoll(o.submitted).count());
  o.active = false;
  MarkEnded(o);
  if (o.read_state != ReadState::kNone) --deferred_;
  o.read_state = ReadState::kNone;
  ReleaseLanding(o);
  --outstanding_;
  ++stats_.completed;
}

void Client::PollUdResponses(absl::Span<Result> out, size_t* n) {
  const size_t want = std::min(out.size() - *n, completions_.size());
  const size_t got = recv_cq_->Poll(absl::MakeSpan(completions_.data(), want));
  // The responses' lines were just written by a worker's core (or a NIC): all of them asked for
  // before the first is parsed, so their misses overlap (the parse stalled on each in turn).
  for (size_t i = 0; i < got; ++i) {
    const transport::Completion& c = completions_[i];
    util::PrefetchRangeForRead(receives_->data() + c.wr_id * receive_bytes_,
                               std::min<uint64_t>(c.byte_len, receive_bytes_));
  }
  for (size_t i = 0; i < got; ++i) {
    const transport::Completion& c = completions_[i];
    to_repost_.push_back(static_cast<uint32_t>(c.wr_id));
    ParsedResponse response;
    bool ok = c.status == transport::CompletionStatus::kSuccess && c.has_imm &&
              c.byte_len >= transport::kGrhBytes &&
              ParseResponse(receives_->data() + c.wr_id * receive_bytes_ + transport::kGrhBytes,
                            c.byte_len - transport::kGrhBytes, /*secret=*/0, &response) &&
              response.header.worker < config_.workers;
    if (ok) {
      // Only the named worker's own QPs answer for it: their numbers, on the server's device
      // (QP numbers are unique per device only).
      const uint32_t per_worker = config_.ud_qps_per_worker;
      const auto first = welcome_.worker_response_qpns.begin() +
                         static_cast<ptrdiff_t>(response.header.worker * per_worker);
      const uint8_t* grh = receives_->data() + c.wr_id * receive_bytes_;
      ok = std::find(first, first + per_worker, c.src_qp) != first + per_worker &&
           transport::SourceGidOfGrh(grh, grh_is_ipv4_) ==
               welcome_.worker_ud[response.header.worker].gid;
    }
    response.header.client_id = c.imm_data;  // a UD response names its client in the immediate
    const Accepted accepted = ok ? Accept(response, &out[*n]) : Accepted::kStray;
    if (accepted == Accepted::kDelivered) {
      ++*n;
    } else if (accepted == Accepted::kStray) {
      ++stats_.stray;
    }
  }
}

void Client::PollWriteResponses(absl::Span<Result> out, size_t* n) {
  // Each live slot once, from where the last Poll stopped. A slot whose request ends is swapped
  // out of live_ for the last one, which is looked at next in its place.
  size_t position = live_cursor_;
  for (size_t remaining = live_.size(); remaining > 0 && *n < out.size(); --remaining) {
    if (position >= live_.size()) position = 0;
    const uint32_t index = live_[position];
    PollWriteResponse(index, out, n);
    if (live_position_[index] == position) ++position;
  }
  live_cursor_ = position;
}

void Client::PollWriteResponse(uint64_t index, absl::Span<Result> out, size_t* n) {
  const uint32_t bytes = config_.response_slot_bytes();
  Outstanding& o = slots_[index];
  if (!o.active) return;
  // The server writes [worker][client][window] response slots.
  const uint64_t at =
      ((uint64_t{o.worker} * options_.clients + o.client) * config_.window + o.slot) * bytes;
  uint8_t* slot = responses_->data() + at;
  std::atomic_ref<uint64_t> marker(*reinterpret_cast<uint64_t*>(slot + bytes - sizeof(uint64_t)));
  const uint64_t seen = marker.load(std::memory_order_acquire);
  if (seen == 0) return;
  if (SeqOfMarker(seen) != o.seq) {
    marker.store(0, std::memory_order_relaxed);
    ++stats_.stray;  // a late answer to this slot's previous request
    return;
  }
  // Copy first, then check the copy: what is delivered is what was checked, and no late
  // duplicate landing in the slot can change it afterwards.
  uint32_t value_bytes;
  std::memcpy(&value_bytes,
              slot + bytes - kResponseHeaderBytes + offsetof(ResponseTrailer, value_bytes),
              sizeof(value_bytes));
  ParsedResponse response;
  uint8_t* copy = delivered_.data() + index * bytes;
  const uint64_t length = uint64_t{Pad8(value_bytes)} + kResponseHeaderBytes;
  if (length > bytes) {
    ++stats_.torn;  // still landing, or torn: looked at again on the next Poll
    return;
  }
  std::memcpy(copy + bytes - length, slot + bytes - length, length);
  if (!ParseResponse(copy + bytes - length, static_cast<uint32_t>(length), welcome_.secret,
                     &response)) {
    ++stats_.torn;
    return;
  }
  response.header.client_id = first_client_id_ + o.client;  // the slot says whose it is
  const Accepted accepted = Accept(response, &out[*n]);
  if (accepted == Accepted::kDelivered) {
    ++*n;
  } else if (accepted == Accepted::kStray) {
    ++stats_.stray;
  }
  marker.store(0, std::memory_order_relaxed);
}

void Client::MarkLive(const Outstanding& o) {
  if (live_position_.empty()) return;
  const auto index = static_cast<uint32_t>(&o - slots_.data());
  if (live_position_[index] != kNotLive) return;
  live_position_[index] = static_cast<uint32_t>(live_.size());
  live_.push_back(index);  // reserved for every slot: never allocates
}

void Client::MarkEnded(const Outstanding& o) {
  if (live_position_.empty()) return;
  const auto index = static_cast<uint32_t>(&o - slots_.data());
  const uint32_t position = live_position_[index];
  if (position == kNotLive) return;
  const uint32_t last = live_.back();
  live_[position] = last;
  live_position_[last] = position;
  live_.pop_back();
  live_position_[index] = kNotLive;
}

void Client::Fail(Outstanding& o, Status status, Result* r) {
  *r = Result{};
  r->tag = o.tag;
  r->client = o.client;
  r->worker = o.worker;
  r->op = o.op;
  r->status = status;
  r->attempts = o.sends;
  Forget(o);
  ++(status == Status::kSendFailed ? stats_.send_failed : stats_.timed_out);
}

void Client::Forget(Outstanding& o) {
  o.active = false;
  MarkEnded(o);
  ReleaseLanding(o);
  if (o.read >= 0) {
    // A READ into its buffer may still be in flight: the buffer frees once that retired.
    reads_[static_cast<uint32_t>(o.read)].orphan = true;
    ++orphans_;
    o.read = -1;
  }
  if (o.read_state != ReadState::kNone) --deferred_;
  o.read_state = ReadState::kNone;
  --outstanding_;
}

Client::Clock::time_point Client::PollClock() {
  if (!clock_read_) {
    poll_now_ = Clock::now();
    clock_read_ = true;
    polls_since_clock_ = 0;
    if (poll_now_ - last_watch_ >= absence_threshold_) [[unlikely]] {
      ExcuseAbsence(poll_now_ - last_watch_);
    }
    last_watch_ = poll_now_;
  }
  return poll_now_;
}

void Client::ExcuseAbsence(std::chrono::nanoseconds gap) {
  // The answers that came meanwhile wait in the CQ (this Poll and the next few take them), and a
  // host that descheduled this thread may have descheduled the worker too: a request unanswered
  // over the gap is no evidence of loss, so its timeout restarts where it stopped. Each request
  // is excused the part of the gap it was outstanding, if that is an absence itself (a Submit
  // reads the clock too, and marks the start of a gap when nothing was outstanding). Once per
  // send (Send clears it): an application that polls less often than its timeouts still
  // retransmits, one gap late. The retransmission check stays due when it was: deadlines only
  // moved later.
  bool excused_any = false;
  for (Outstanding& o : slots_) {
    if (!o.active || o.excused) continue;
    const std::chrono::nanoseconds excuse = std::min(gap, SincePoll(o.submitted));
    if (excuse < absence_threshold_) continue;
    o.deadline += excuse;
    o.excused = true;
    o.client_away = true;
    excused_any = true;
  }
  if (excused_any) ++stats_.absences;
}

void Client::ExcuseSilence(uint32_t worker, std::chrono::nanoseconds gap, Clock::time_point now) {
  // A worker that stalls for a little less than the timeout answers its backlog (slot by slot,
  // not oldest first) after the oldest requests' deadlines: they were resent though the worker
  // was only catching up (930 of 4,096 at 1,024 clients, after a 2-vCPU VM's host took the
  // worker's core for ~5 ms). A held request already waited for a probe's answer, and goes at
  // its deadline. The time a request waited before the silence, and its round trips, stay
  // counted: the silence is the server's, and the estimator should see it.
  bool excused_any = false;
  for (uint32_t client = 0; client < options_.clients; ++client) {
    for (uint32_t slot = 0; slot < config_.window; ++slot) {
      Outstanding& o = slots_[SlotIndex(client, worker, slot)];
      // A request resent (or held) is backed off already, and maybe lost: only first sends.
      if (!o.active || o.excused || o.holds > 0 || o.sends > 1) continue;
      const std::chrono::nanoseconds excuse = std::min(
          gap, std::max(std::chrono::nanoseconds(0),
                        std::chrono::duration_cast<std::chrono::nanoseconds>(now - o.submitted)));
      if (excuse < absence_threshold_) continue;
      o.deadline += excuse;
      o.excused = true;
      excused_any = true;
    }
  }
  if (excused_any) ++stats_.silences;
}

bool Client::RetryCheckDue() {
  if (!clock_read_ && !config_.response_uses_slots() &&
      ++polls_since_clock_ < kPollsPerIdleClockRead) {
    return false;
  }
  return PollClock() >= next_retry_check_;
}

std::chrono::nanoseconds Client::SincePoll(Clock::time_point submitted) {
  // A request submitted after this Poll read the clock (a synchronous call's, from inside a
  // Poll) has waited 0, not a negative time.
  return std::max(std::chrono::nanoseconds(0),
                  std::chrono::duration_cast<std::chrono::nanoseconds>(PollClock() - submitted));
}

void Client::Retransmit(absl::Span<Result> out, size_t* n) {
  const Clock::time_point now = PollClock();
  if (now >= next_health_check_) {
    next_health_check_ = now + absl::ToChronoNanoseconds(kHealthCheckInterval);
    if (health_.ok() && channel_ != nullptr && channel_->PeerClosed()) {
      health_ = absl::UnavailableError(absl::StrFormat(
          "the server (%s) closed its control connection: it stopped or died", options_.server));
      LOG(WARNING) << health_;
    }
  }
  const std::chrono::nanoseconds deadline = absl::ToChronoNanoseconds(options_.request_deadline);
  // No later than any worker's first timeout from now (a request submitted meanwhile).
  std::chrono::nanoseconds shortest = retransmit_policy_.ceiling;
  for (const RetransmitTimer& timer : timers_) shortest = std::min(shortest, timer.TimeoutFor(1));
  if (retransmit_policy_.adaptive) {
    absence_threshold_ = std::max(kMinAbsence, shortest / kAbsenceFraction);
  }
  Clock::time_point next = now + shortest;
  for (Outstanding& o : slots_) {
    if (!o.active) continue;
    // Answered out of line: its value is being read (AdvanceLargeValues owns it); only the
    // request deadline and the server's health still end it here.
    if (o.read_state != ReadState::kNone && health_.ok() && now - o.submitted < deadline) {
      continue;
    }
    // (An excused deadline may lie past the request deadline, which still ends it in time.)
    // A held request whose worker has answered since its probe went is due one timeout after
    // that answer (what the worker still had of its backlog came within it), not at the end of
    // the probe's backed-off timeout.
    const bool released = o.holds > 0 && last_answer_[o.worker] > probe_sent_[o.worker] &&
                          now >= last_answer_[o.worker] + timers_[o.worker].TimeoutFor(1);
    if (o.deadline > now && !released && health_.ok() && o.read_state == ReadState::kNone &&
        now - o.submitted < deadline) {
      next = std::min({next, o.deadline, o.submitted + deadline});
      continue;
    }
    // A client with members keeps its requests for Follow() when the server is lost.
    const bool lost = !health_.ok() && (options_.members.empty() || followed_);
    if (!health_.ok() && !lost && now - o.submitted < deadline) continue;
    if (lost || o.sends + o.holds >= options_.max_attempts || o.attempt >= kMaxAttempt ||
        now - o.submitted >= deadline) {
      if (*n == out.size()) return;  // the rest on the next Poll
      Fail(o, Status::kTimedOut, &out[(*n)++]);
      continue;
    }
    // A worker silent for half its timeout (longer than any recent round trip: the timeout is
    // at least twice their tail) is stalled, gone, or cut off: resending its whole window helps
    // none of those (a stalled worker answers the requests already in its slots when it runs
    // again). So one request probes it, and until the probe's own timeout the others due are
    // held, backing off as if sent (TCP resends only its oldest segment on a timeout). A probe
    // answered says the worker lives: the requests held for it are resent when due, as any
    // (they were lost; a stalled worker's backlog came before). Under load a lost request's
    // worker is not silent, and it is resent at once.
    bool probe = false;
    if (retransmit_policy_.adaptive &&
        now - last_answer_[o.worker] >= timers_[o.worker].TimeoutFor(1) / kSilenceFraction) {
      // A probe sent after the worker's last answer is out, unanswered.
      const bool probing = probe_sent_[o.worker] > last_answer_[o.worker];
      if (probing && now < probe_due_[o.worker]) {
        ++o.holds;
        ++stats_.holds;
        o.deadline = probe_due_[o.worker];  // the probe's timeout backs the rounds off
        next = std::min(next, o.deadline);
        continue;
      }
      probe = probing || o.holds == 0;  // else held for a probe since answered: resent as any
    }
    // Holds back off a probe's rounds while its worker is silent; a request resent to a worker
    // that answers backs off for its own sends only.
    if (!probe) o.holds = 0;
    ++stats_.retransmissions;
    absl::Status sent = Send(o, /*wait_for_room=*/false);
    if (!sent.ok() && absl::IsUnavailable(sent)) {
      if (*n == out.size()) return;
      Fail(o, Status::kSendFailed, &out[(*n)++]);
      continue;
    }
    if (!sent.ok()) {
      ++o.sends;  // a full send queue: counted as a send, so max_attempts still bounds it
      LOG_EVERY_N(WARNING, 1000) << "retransmission not sent: " << sent;
    }
    o.deadline = now + timers_[o.worker].TimeoutFor(o.sends + o.holds);
    if (probe) {
      probe_sent_[o.worker] = now;
      probe_due_[o.worker] = o.deadline;
    }
    next = std::min(next, o.deadline);
  }
  next_retry_check_ = next;
}

size_t Client::Poll(absl::Span<Result> out) {
  (void)Flush();  // a failed post leaves its requests to retransmission
  if (!reads_.empty()) ReleaseDeliveredReads();
  if (to_repost_.size() >= repost_batch_) RepostReceives();
  Reap();
  size_t n = 0;
  if (!config_.response_uses_slots()) {
    PollUdResponses(out, &n);
  } else if (outstanding_ > 0) {
    PollWriteResponses(out, &n);
  }
  if (deferred_ > 0 || orphans_ > 0) AdvanceLargeValues(out, &n);
  if (outstanding_ > 0 && n < out.size() && RetryCheckDue()) {
    Retransmit(out, &n);
    (void)Flush();
  }
  clock_read_ = false;  // poll_now_ is this Poll's only: the next one reads the clock again
  return n;
}

}  // namespace herd
