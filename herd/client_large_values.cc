// The client's large-value path (Config::large_values(); docs/architecture.md, "Large values"):
//   PUT/CAS/INSERT of a value over the inline limit: the request is staged in one of the
//     session's landing buffers at the key's worker and sent by WRITE_WITH_IMM over the
//     worker's large-value RC QP; the buffer is reused once the answer came (and the WR retired).
//   GET answered out of line: the answer names the item in the worker's log; the client READs it
//     into a READ buffer over the same QP and delivers it only if mica::VerifyItem finds the copy
//     whole and the item named (keyhash, version). A failed check reads again (a new attempt of
//     the GET, which names the item's current place); after max_item_reads failures the GET asks
//     the worker to copy the value into a landing buffer of the client's choosing, and READs
//     that (no one else writes it).
#include <cstring>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "herd/client.h"
#include "mica/item.h"
#include "mica/remote_item.h"
#include "util/take.h"

namespace herd {

using util::Take;

absl::Status Client::CreateLargeValueResources() {
  const Config& c = config_;
  large_queue_base_ = static_cast<uint32_t>(queues_.size());
  for (uint32_t w = 0; w < c.workers; ++w) {
    transport::QpConfig qc;
    qc.type = transport::QpType::kRc;
    qc.send_cq = send_cq_.get();
    qc.recv_cq = recv_cq_.get();  // receives nothing
    qc.max_send_wr = c.sq_depth;
    qc.max_recv_wr = 1;
    qc.max_inline_data = 0;
    large_qps_.emplace_back();
    if (absl::Status s = Take(pd_->CreateQp(qc), &large_qps_.back()); !s.ok()) return s;
    SendQueue& queue = queues_.emplace_back();
    queue.qp = large_qps_.back().get();
    queue.depth = c.sq_depth;
    queue.unsig_batch = c.unsig_batch;
    queue.table_slot = static_cast<uint16_t>(large_queue_base_ + w);
  }
  auto allocate = [&](uint64_t bytes, std::unique_ptr<transport::SharedMemory>* memory,
                      std::unique_ptr<transport::MemoryRegion>* mr) -> absl::Status {
    absl::StatusOr<transport::SharedMemory> m =
        transport::SharedMemory::Allocate(bytes, "herd-client-large");
    if (!m.ok()) return m.status();
    *memory = std::make_unique<transport::SharedMemory>(*std::move(m));
    return Take(pd_->RegisterMemory((*memory)->data(), (*memory)->size(), transport::kLocalWrite),
                mr);
  };
  const uint64_t landings = uint64_t{c.workers} * c.landing_buffers;
  if (absl::Status s =
          allocate(landings * c.landing_bytes(), &landing_staging_, &landing_staging_mr_);
      !s.ok()) {
    return s;
  }
  // A READ buffer holds the largest item (header, key, value, checksum) or a copied value.
  read_buffer_bytes_ = mica::ItemBytes(c.max_key_bytes, c.value_limit(), /*checksum=*/true);
  const uint32_t buffers = std::max<uint32_t>(options_.read_buffers, 1);
  if (absl::Status s = allocate(buffers * read_buffer_bytes_, &read_memory_, &read_mr_); !s.ok()) {
    return s;
  }
  landings_.assign(landings, Landing{});
  reads_.assign(buffers, ReadBuffer{});
  return absl::OkStatus();
}

int32_t Client::TakeLanding(uint32_t worker) {
  const SendQueue& large = queues_[large_queue_base_ + worker];
  for (uint32_t b = 0; b < config_.landing_buffers; ++b) {
    Landing& l = landings_[uint64_t{worker} * config_.landing_buffers + b];
    if (l.used) continue;
    if (l.in_flight && large.retired <= l.last_wr) continue;  // a WR still reads its staging
    l.used = true;
    l.in_flight = false;
    return static_cast<int32_t>(b);
  }
  return -1;
}

void Client::ReleaseLanding(Outstanding& o) {
  if (o.landing < 0) return;
  landings_[uint64_t{o.worker} * config_.landing_buffers + static_cast<uint32_t>(o.landing)].used =
      false;
  o.landing = -1;
  o.large_body = false;
}

bool Client::DeferOutOfLine(Outstanding& o, const ResponseHeader& h, const uint8_t* value) {
  if (reads_.empty() || o.op != Op::kGet || h.status != static_cast<uint8_t>(Status::kOk) ||
      h.value_bytes != sizeof(ValueDescriptor)) {
    return false;
  }
  ValueDescriptor d;
  std::memcpy(&d, value, sizeof(d));
  const bool copied = (h.flags & kResponseCopied) != 0;
  // Holding a landing buffer, the GET asked for a copy: only a copy answers it.
  if (o.landing >= 0 && !copied) return false;
  // A copy must be in the landing buffer this GET asked for; an item must fit a READ buffer.
  if (copied) {
    const uint64_t expected =
        welcome_.landing_addr +
        (uint64_t{o.worker} * config_.landing_buffers + static_cast<uint32_t>(o.landing)) *
            config_.landing_bytes();
    if (o.landing < 0 || d.addr != expected || d.length > config_.value_limit()) return false;
  } else if (d.length > read_buffer_bytes_ || d.length == 0) {
    return false;
  }
  o.descriptor = d;
  o.version = h.version;
  o.copied = copied;
  // max_item_reads = 0: never read items in the log (only copies the worker made for us).
  o.read_state = !copied && options_.max_item_reads == 0 ? ReadState::kWaitingForLanding
                                                         : ReadState::kWaitingForBuffer;
  ++deferred_;
  ++stats_.out_of_line_gets;
  return true;
}

void Client::ReleaseDeliveredReads() {
  for (ReadBuffer& r : reads_) {
    if (r.used && r.release_at_poll) r = ReadBuffer{};
  }
}

void Client::AdvanceLargeValues(absl::Span<Result> out, size_t* n) {
  // Orphans (their request ended) free once their READ retired.
  for (ReadBuffer& r : reads_) {
    if (!r.used || !r.orphan) continue;
    const Outstanding& o = slots_[r.owner];
    if (queues_[large_queue_base_ + o.worker].retired > r.wr) {
      r = ReadBuffer{};
      --orphans_;
    }
  }
  for (uint64_t i = 0; i < slots_.size() && *n < out.size(); ++i) {
    Outstanding& o = slots_[i];
    if (!o.active || o.read_state == ReadState::kNone) continue;
    SendQueue& queue = queues_[large_queue_base_ + o.worker];
    if (o.read_state == ReadState::kReading) {
      if (queue.retired <= reads_[static_cast<uint32_t>(o.read)].wr) {
        if (queue.broken) Fail(o, Status::kSendFailed, &out[(*n)++]);
        continue;
      }
      if (queue.broken) {  // its READ completed in error
        Fail(o, Status::kSendFailed, &out[(*n)++]);
        continue;
      }
      bool delivered = false;
      FinishRead(o, &out[*n], &delivered);
      if (delivered) ++*n;
      continue;
    }
    if (o.read_state == ReadState::kWaitingForLanding) {
      // Asking for the copy rewrites the GET's staged bytes: not while a WR still reads them
      // (a retransmission posted before the answer came; a non-inline WR reads at execution).
      // Rewritten under it, the worker took the copy request, sent with that WR's attempt
      // number, for a duplicate; and every retransmission, sent as the same bytes while a WR
      // still read them, kept the buffer busy: no new attempt until the GET timed out.
      if (!BufferFree(o)) continue;
      if (o.landing < 0) {  // a GET that already holds one (a re-read after a copy) keeps it
        const int32_t landing = TakeLanding(o.worker);
        if (landing < 0) continue;
        o.landing = landing;
      }
      o.large_body = false;  // the GET itself stays in its slot; the copy goes to the landing
      o.length = SetRequestCopyToLanding(static_cast<uint32_t>(o.landing), welcome_.secret,
                                         StagedBytes(o), o.length);
      ++stats_.copied_gets;
      Resend(o);
      continue;
    }
    // kWaitingForBuffer: a free READ buffer, and room on the queue.
    uint32_t buffer = 0;
    while (buffer < reads_.size() && reads_[buffer].used) ++buffer;
    if (buffer == reads_.size() || queue.broken || !queue.HasRoom()) continue;
    if (chains_.size() == kMaxChainedRequests) (void)Flush();
    const uint64_t wr_index = SendChains::Reserve(queue);
    uint8_t* into = read_memory_->data() + buffer * read_buffer_bytes_;
    transport::Sge& sge = chains_.NextSge();
    sge = transport::Sge{reinterpret_cast<uint64_t>(into), o.descriptor.length, read_mr_->lkey()};
    transport::SendWr& wr = chains_.NextWr();
    wr.wr_id = queue.WrId(wr_index);
    wr.num_sge = 1;
    wr.flags = transport::kSignaled;  // its completion is how the client knows the bytes are in
    wr.opcode = transport::Opcode::kRead;
    wr.remote_addr = o.descriptor.addr;
    wr.rkey = o.descriptor.rkey;
    chains_.Append(&queue);
    reads_[buffer] = ReadBuffer{true, i, wr_index, false, false};
    o.read = static_cast<int32_t>(buffer);
    o.read_state = ReadState::kReading;
  }
  (void)Flush();
}

void Client::FinishRead(Outstanding& o, Result* out, bool* delivered) {
  ReadBuffer& buffer = reads_[static_cast<uint32_t>(o.read)];
  const uint8_t* copy = read_memory_->data() + static_cast<uint32_t>(o.read) * read_buffer_bytes_;
  if (o.copied) {
    // The worker's copy in our landing buffer: nobody else writes it.
    buffer.release_at_poll = true;
    o.read = -1;
    Deliver(o, Status::kOk, o.version,
            std::string_view(reinterpret_cast<const char*>(copy), o.descriptor.length), out);
    *delivered = true;
    return;
  }
  // (keyhash, version) names one item: versions are unique within a partition.
  absl::StatusOr<mica::VerifiedItem> item =
      mica::VerifyItem(copy, o.descriptor.length, o.keyhash, o.version, {});
  if (item.ok()) {
    buffer.release_at_poll = true;
    o.read = -1;
    Deliver(o, Status::kOk, o.version, item->value, out);
    *delivered = true;
    return;
  }
  // Overwritten (or moved) while it was read: ask again where it is, or for a copy.
  buffer = ReadBuffer{};
  o.read = -1;
  ++stats_.item_rereads;
  if (++o.item_reads >= options_.max_item_reads) {
    o.read_state = ReadState::kWaitingForLanding;
    return;
  }
  Resend(o);
}

void Client::Resend(Outstanding& o) {
  --deferred_;  // called only from a deferred state
  o.read_state = ReadState::kNone;
  const Clock::time_point now = Clock::now();
  if (absl::Status s = Send(o, /*wait_for_room=*/false); !s.ok()) {
    ++o.sends;  // as a retransmission that found no room: the timer sends it again
    LOG_EVERY_N(WARNING, 1000) << "re-sending a GET for its value: " << s;
  }
  o.deadline = now + timers_[o.worker].TimeoutFor(o.sends + o.holds);
  next_retry_check_ = std::min(next_retry_check_, o.deadline);
}

}  // namespace herd
