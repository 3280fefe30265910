// The worker: holding answers the replication gate has not released, posting responses in
// chains, reposting receives, fences, and reaping send completions.
#include <atomic>
#include <cstring>

#include "glog/logging.h"
#include "herd/worker.h"
#include "herd/worker_internal.h"

namespace herd {

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
