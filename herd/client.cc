#include "herd/client.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "mica/keyhash.h"
#include "util/take.h"

namespace herd {
namespace {

using util::Take;

using Clock = std::chrono::steady_clock;

// Receives posted per outstanding request: room for a duplicate answer (a replay racing the
// original) without starving the next response.
constexpr uint32_t kReceivesPerOutstanding = 2;
// Consumed receives are re-posted in batches of up to this many (one PostRecv each), holding
// back at most half of the receives beyond one per outstanding request (none where the receive
// count is capped at one per request: then every Poll re-posts).
constexpr uint32_t kMaxRepostBatch = 32;
// UD responses: Polls with no response read the clock (for the retransmission check) once in
// this many; an empty poll of a CQ is about 50-100 ns, the retry timeout milliseconds. (WRITE
// responses: every Poll walks every slot, far more than a clock read, and reads it.)
constexpr uint32_t kPollsPerIdleClockRead = 64;
constexpr uint64_t kSyncTag = ~uint64_t{0};
// How often Poll asks the control connection whether the server is still there (a syscall).
constexpr absl::Duration kHealthCheckInterval = absl::Milliseconds(10);
// TCP's estimator gains (RFC 6298): alpha = 1/8 for the mean, beta = 1/4 for the deviation,
// and a timeout of srtt + 4 rttvar.
constexpr double kRttGain = 0.125;
constexpr double kRttVarGain = 0.25;
constexpr double kRttVarWeight = 4;
// Doublings of the timeout for a request sent many times (then it stays at the ceiling).
constexpr uint32_t kMaxBackoffShift = 16;

absl::StatusOr<std::unique_ptr<transport::SharedMemory>> Allocate(uint64_t bytes) {
  absl::StatusOr<transport::SharedMemory> memory = transport::SharedMemory::Allocate(bytes);
  if (!memory.ok()) return memory.status();
  return std::make_unique<transport::SharedMemory>(*std::move(memory));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.clients == 0) return absl::InvalidArgumentError("a Client needs at least 1 client");
  std::unique_ptr<Client> client(new Client(options));
  if (absl::Status s = client->Handshake(); !s.ok()) return s;
  return client;
}

Client::Client(const ClientOptions& options)
    : options_(options), batching_(options.batch_doorbells) {}

Client::~Client() = default;

absl::Status Client::Handshake() {
  if (absl::Status s = Take(transport::OpenDevice(options_.device), &device_); !s.ok()) return s;
  grh_is_ipv4_ = device_->port().grh_is_ipv4;
  absl::StatusOr<std::unique_ptr<transport::control::MessageChannel>> channel =
      ConnectControl(options_.connect, device_.get(), options_.server, options_.connect_timeout);
  if (!channel.ok()) return channel.status();
  channel_ = *std::move(channel);
  if (absl::Status s = channel_->Send(kHello, Encode(Hello{options_.clients})); !s.ok()) return s;
  absl::StatusOr<transport::control::Message> reply =
      Expect(*channel_, kServerConfig, options_.connect_timeout);
  if (!reply.ok()) return reply.status();
  absl::StatusOr<Config> config = DecodeConfig(reply->payload);
  if (!config.ok()) return config.status();
  if (absl::Status s = Validate(*config, device_->port().active_mtu); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the server's configuration does not work on this device: ", s.message()));
  }
  if (absl::Status s = CreateResources(*config); !s.ok()) return s;

  Join join;
  join.ud = ud_qp_->endpoint();
  join.ud_qkey = ud_qkey_;
  for (auto& qp : request_qps_) join.request_qps.push_back(qp->endpoint());
  for (auto& qp : response_qps_) join.response_qps.push_back(qp->endpoint());
  for (auto& qp : large_qps_) join.large_qps.push_back(qp->endpoint());
  if (responses_mr_) {
    join.response_region_addr = reinterpret_cast<uint64_t>(responses_->data());
    join.response_region_rkey = responses_mr_->rkey();
  }
  if (resume_.session != 0) {
    join.resume_first_client_id = resume_.first_client_id;
    join.resume_session = resume_.session;
  }
  if (absl::Status s = channel_->Send(kJoin, Encode(join)); !s.ok()) return s;
  reply = Expect(*channel_, kWelcome, options_.connect_timeout);
  if (!reply.ok()) return reply.status();
  absl::StatusOr<Welcome> welcome =
      DecodeWelcome(reply->payload, config_.workers, config_.ud_qps_per_worker);
  if (!welcome.ok()) return welcome.status();
  welcome_ = *std::move(welcome);
  first_client_id_ = welcome_.first_client_id;
  if (welcome_.worker_ud.size() != config_.workers ||
      welcome_.request_qps.size() != request_qps_.size() ||
      welcome_.response_qps.size() != response_qps_.size() ||
      welcome_.large_qps.size() != large_qps_.size()) {
    return absl::DataLossError("welcome: endpoint lists do not match the server's config");
  }
  for (uint32_t w = 0; w < config_.workers; ++w) {
    transport::ConnectConfig connect;
    if (!request_qps_.empty()) {
      connect.remote = welcome_.request_qps[w];
      if (absl::Status s = request_qps_[w]->Connect(connect); !s.ok()) return s;
    }
    if (!response_qps_.empty()) {
      connect.remote = welcome_.response_qps[w];
      if (absl::Status s = response_qps_[w]->Connect(connect); !s.ok()) return s;
    }
    if (!large_qps_.empty()) {
      connect.remote = welcome_.large_qps[w];
      if (absl::Status s = large_qps_[w]->Connect(connect); !s.ok()) return s;
    }
    std::unique_ptr<transport::AddressHandle> ah;
    const transport::QpEndpoint& ud = welcome_.worker_ud[w];
    if (absl::Status s = Take(pd_->CreateAddressHandle({ud.lid, ud.gid}), &ah); !s.ok()) return s;
    worker_ahs_.push_back(std::move(ah));
  }
  next_retry_check_ = Clock::now();
  return absl::OkStatus();
}

absl::Status Client::CreateResources(const Config& config) {
  config_ = config;
  const Config& c = config_;
  if (absl::Status s = ValidateClientLoad(c, options_.clients); !s.ok()) return s;
  const uint64_t slot_count = uint64_t{options_.clients} * c.workers * c.window;
  receive_count_ = static_cast<uint32_t>(
      std::min<uint64_t>(slot_count * kReceivesPerOutstanding, kMaxClientReceives));
  const uint64_t spare_receives = receive_count_ > slot_count ? receive_count_ - slot_count : 0;
  repost_batch_ =
      static_cast<uint32_t>(std::clamp<uint64_t>(spare_receives / 2, 1, kMaxRepostBatch));
  receive_bytes_ = transport::kGrhBytes + ResponseBytes(c.slot_value_bytes());
  if (absl::Status s = Take(device_->AllocatePd(), &pd_); !s.ok()) return s;
  // UD, request and large-value queues: at most sq_depth WRs each, every one may complete.
  const uint32_t send_queues = 1 + 2 * c.workers;
  if (absl::Status s = Take(device_->CreateCq(send_queues * c.sq_depth), &send_cq_); !s.ok()) {
    return s;
  }
  if (absl::Status s = Take(device_->CreateCq(receive_count_ + 1), &recv_cq_); !s.ok()) return s;
  auto make_qp = [&](transport::QpType type, uint32_t receives,
                     std::unique_ptr<transport::QueuePair>* out) {
    transport::QpConfig qc;
    qc.type = type;
    qc.send_cq = send_cq_.get();
    qc.recv_cq = recv_cq_.get();
    qc.max_send_wr = c.sq_depth;
    qc.max_recv_wr = receives;
    qc.max_inline_data = c.max_inline;
    return Take(pd_->CreateQp(qc), out);
  };
  if (absl::Status s = make_qp(transport::QpType::kUd, receive_count_, &ud_qp_); !s.ok()) return s;
  // Our own qkey: a UD SEND with any other is dropped by our QP, so a process that does not know
  // it cannot deliver a forged response (one that does must also send from a worker's QP).
  std::random_device entropy;
  while (ud_qkey_ == 0 || ud_qkey_ == kQkey) ud_qkey_ = entropy() & ~kControlledQkeyBit;
  transport::ConnectConfig ud;
  ud.qkey = ud_qkey_;
  if (absl::Status s = ud_qp_->Connect(ud); !s.ok()) return s;
  for (uint32_t w = 0; w < c.workers; ++w) {
    if (c.request_uses_slots()) {
      request_qps_.emplace_back();
      const auto type =
          c.request_verb == RequestVerb::kRcWrite ? transport::QpType::kRc : transport::QpType::kUc;
      if (absl::Status s = make_qp(type, 1, &request_qps_.back()); !s.ok()) return s;
    }
    if (c.response_uses_slots()) {
      response_qps_.emplace_back();
      const auto type = c.response_verb == ResponseVerb::kRcWrite ? transport::QpType::kRc
                                                                  : transport::QpType::kUc;
      if (absl::Status s = make_qp(type, 1, &response_qps_.back()); !s.ok()) return s;
    }
  }
  auto region = [&](uint64_t bytes, uint32_t access, std::unique_ptr<transport::SharedMemory>* mem,
                    std::unique_ptr<transport::MemoryRegion>* mr) -> absl::Status {
    if (absl::Status s = Take(Allocate(bytes), mem); !s.ok()) return s;
    return Take(pd_->RegisterMemory((*mem)->data(), (*mem)->size(), access), mr);
  };
  if (absl::Status s =
          region(slot_count * c.slot_bytes, transport::kLocalWrite, &staging_, &staging_mr_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = region(uint64_t{receive_count_} * receive_bytes_, transport::kLocalWrite,
                              &receives_, &receives_mr_);
      !s.ok()) {
    return s;
  }
  if (c.response_uses_slots()) {
    if (absl::Status s =
            region(slot_count * c.response_slot_bytes(),
                   transport::kLocalWrite | transport::kRemoteWrite, &responses_, &responses_mr_);
        !s.ok()) {
      return s;
    }
  }
  queues_.resize(1 + request_qps_.size());
  for (size_t q = 0; q < queues_.size(); ++q) {
    queues_[q].qp = q == 0 ? ud_qp_.get() : request_qps_[q - 1].get();
    queues_[q].depth = c.sq_depth;
    queues_[q].unsig_batch = c.unsig_batch;
    queues_[q].table_slot = static_cast<uint16_t>(q);
  }
  if (c.large_values()) {
    if (absl::Status s = CreateLargeValueResources(); !s.ok()) return s;
  }
  slots_.resize(slot_count);
  next_seq_.assign(uint64_t{options_.clients} * c.workers, 1);
  if (c.response_uses_slots()) delivered_.resize(slot_count * c.response_slot_bytes());
  completions_.resize(std::max<uint32_t>(c.sq_depth, 64));
  recv_wrs_.resize(receive_count_);
  recv_sges_.resize(receive_count_);
  to_repost_.reserve(receive_count_);
  for (uint32_t i = 0; i < receive_count_; ++i) to_repost_.push_back(i);
  RepostReceives();
  return absl::OkStatus();
}

uint32_t Client::WorkerOf(uint64_t keyhash) const {
  return mica::PartitionOf(keyhash, config_.workers);
}

bool Client::CanSubmit(uint32_t client, uint64_t keyhash, uint64_t value_bytes) const {
  const uint32_t worker = WorkerOf(keyhash);
  const uint64_t seq = next_seq_[uint64_t{client} * config_.workers + worker];
  const Outstanding& o =
      slots_[SlotIndex(client, worker, static_cast<uint32_t>(seq % config_.window))];
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
  const auto slot = static_cast<uint32_t>(r.seq % config_.window);
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
  o.deadline = (r.attempt == 0 ? r.submitted : Clock::now()) + TimeoutFor(1);
  ++outstanding_;
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
  if (!queue.broken && !queue.HasRoom()) Reap();
  if (!queue.broken && !queue.HasRoom()) {
    if (!wait_for_room) return absl::ResourceExhaustedError("the request send queue is full");
    const Clock::time_point give_up =
        Clock::now() + absl::ToChronoNanoseconds(options_.send_queue_timeout);
    while (!queue.broken && !queue.HasRoom()) {
      Reap();
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

Client::Accepted Client::Accept(const ParsedResponse& response, Result* out) {
  const ResponseHeader& h = response.header;
  const uint32_t client = h.client_id - first_client_id_;  // wraps for foreign ids
  if (client >= options_.clients || h.worker >= config_.workers ||
      h.value_bytes > config_.slot_value_bytes()) {
    return Accepted::kStray;
  }
  const auto slot = static_cast<uint32_t>(h.seq % config_.window);
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
  if (!o.handed_over) SampleRoundTrip(SincePoll(o.submitted));
  if ((h.flags & kResponseOutOfLine) != 0) {
    return DeferOutOfLine(o, h, response.value) ? Accepted::kDeferred : Accepted::kStray;
  }
  if (h.flags != 0) return Accepted::kStray;
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
  if (o.read_state != ReadState::kNone) --deferred_;
  o.read_state = ReadState::kNone;
  ReleaseLanding(o);
  --outstanding_;
  ++stats_.completed;
}

void Client::PollUdResponses(absl::Span<Result> out, size_t* n) {
  const size_t want = std::min(out.size() - *n, completions_.size());
  const size_t got = recv_cq_->Poll(absl::MakeSpan(completions_.data(), want));
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
  const uint32_t bytes = config_.response_slot_bytes();
  for (uint64_t i = 0; i < slots_.size() && *n < out.size(); ++i) {
    Outstanding& o = slots_[i];
    if (!o.active) continue;
    // The server writes [worker][client][window] response slots.
    const uint64_t at =
        ((uint64_t{o.worker} * options_.clients + o.client) * config_.window + o.slot) * bytes;
    uint8_t* slot = responses_->data() + at;
    std::atomic_ref<uint64_t> marker(*reinterpret_cast<uint64_t*>(slot + bytes - sizeof(uint64_t)));
    const uint64_t seen = marker.load(std::memory_order_acquire);
    if (seen == 0) continue;
    if (SeqOfMarker(seen) != o.seq) {
      marker.store(0, std::memory_order_relaxed);
      ++stats_.stray;  // a late answer to this slot's previous request
      continue;
    }
    // Copy first, then check the copy: what is delivered is what was checked, and no late
    // duplicate landing in the slot can change it afterwards.
    uint32_t value_bytes;
    std::memcpy(&value_bytes,
                slot + bytes - kResponseHeaderBytes + offsetof(ResponseTrailer, value_bytes),
                sizeof(value_bytes));
    ParsedResponse response;
    uint8_t* copy = delivered_.data() + i * bytes;
    const uint64_t length = uint64_t{Pad8(value_bytes)} + kResponseHeaderBytes;
    if (length > bytes) {
      ++stats_.torn;  // still landing, or torn: looked at again on the next Poll
      continue;
    }
    std::memcpy(copy + bytes - length, slot + bytes - length, length);
    if (!ParseResponse(copy + bytes - length, static_cast<uint32_t>(length), welcome_.secret,
                       &response)) {
      ++stats_.torn;
      continue;
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
  }
  return poll_now_;
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

void Client::SampleRoundTrip(std::chrono::nanoseconds rtt) {
  const auto sample = static_cast<double>(rtt.count());
  if (srtt_ns_ == 0) {
    srtt_ns_ = sample;
    rttvar_ns_ = sample / 2;
    return;
  }
  rttvar_ns_ += kRttVarGain * (std::abs(srtt_ns_ - sample) - rttvar_ns_);
  srtt_ns_ += kRttGain * (sample - srtt_ns_);
}

std::chrono::nanoseconds Client::TimeoutFor(uint32_t sends) const {
  const std::chrono::nanoseconds initial = absl::ToChronoNanoseconds(options_.retry_timeout);
  if (!options_.adaptive_retry) return initial;
  const std::chrono::nanoseconds floor = absl::ToChronoNanoseconds(options_.min_retry_timeout);
  const std::chrono::nanoseconds ceiling = absl::ToChronoNanoseconds(options_.max_retry_timeout);
  std::chrono::nanoseconds base =
      srtt_ns_ == 0
          ? initial
          : std::chrono::nanoseconds(static_cast<int64_t>(srtt_ns_ + kRttVarWeight * rttvar_ns_));
  base = std::clamp(base, floor, std::max(floor, ceiling));
  const uint32_t shift = std::min(sends > 0 ? sends - 1 : 0, kMaxBackoffShift);
  return std::min(base * (int64_t{1} << shift), std::max(base, ceiling));
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
  Clock::time_point next = now + TimeoutFor(1);
  for (Outstanding& o : slots_) {
    if (!o.active) continue;
    // Answered out of line: its value is being read (AdvanceLargeValues owns it); only the
    // request deadline and the server's health still end it here.
    if (o.read_state != ReadState::kNone && health_.ok() && now - o.submitted < deadline) {
      continue;
    }
    if (o.deadline > now && health_.ok() && o.read_state == ReadState::kNone) {
      next = std::min(next, o.deadline);
      continue;
    }
    // A client with members keeps its requests for Follow() when the server is lost.
    const bool lost = !health_.ok() && (options_.members.empty() || followed_);
    if (!health_.ok() && !lost && now - o.submitted < deadline) continue;
    if (lost || o.sends >= options_.max_attempts || o.attempt >= kMaxAttempt ||
        now - o.submitted >= deadline) {
      if (*n == out.size()) return;  // the rest on the next Poll
      Fail(o, Status::kTimedOut, &out[(*n)++]);
      continue;
    }
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
    o.deadline = now + TimeoutFor(o.sends);
    next = std::min(next, o.deadline);
  }
  next_retry_check_ = next;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Follow(absl::Duration timeout) {
  if (options_.members.empty()) {
    return absl::FailedPreconditionError("no members to follow (ClientOptions::members is empty)");
  }
  if (health_.ok()) {
    // Its session could still execute a request the follower resends: never applied twice only
    // if the old session is gone.
    return absl::FailedPreconditionError(
        "the server is still there (health() is OK): Follow() is for a lost server");
  }
  if (followed_) {
    return absl::FailedPreconditionError(
        "this client followed (or tried to) already: use the follower; its requests went there");
  }
  const absl::Time give_up = absl::Now() + timeout;
  std::vector<std::string> refusals;
  while (true) {
    refusals.clear();
    for (const std::string& member : options_.members) {
      ClientOptions options = options_;
      options.server = member;
      // A dead member refuses or never answers: it must not take the whole timeout (rounds
      // over the members repeat until then).
      options.connect_timeout = std::min(options_.connect_timeout, kFollowConnectTimeout);
      std::unique_ptr<Client> follower(new Client(options));
      follower->resume_ = Resumption{first_client_id_, welcome_.secret};
      absl::Status s = follower->Handshake();
      if (s.ok() && !follower->welcome_.takes_writes) {
        s = absl::FailedPreconditionError("a backup, not (yet) promoted");
      }
      if (s.ok() && !follower->welcome_.resumed) {
        // Only a promoted backup holds the lost session's outcomes (an unreplicated server, a
        // primary that still runs the old session, a restarted one: re-applied, or acknowledged
        // before its backups hold it).
        s = absl::FailedPreconditionError("not a promoted backup of the lost primary");
      }
      if (s.ok() && Encode(follower->config_) != Encode(config_)) {
        // Every request fits the follower exactly as it fit here (slots, landing buffers).
        s = absl::FailedPreconditionError("its configuration differs from the lost server's");
      }
      if (s.ok()) {
        // A follower that took some of the requests and failed is not retried, elsewhere or
        // here: its session may execute them, and the outcomes it took over now carry its
        // secret. What is left ends as TIMED_OUT (outcome unknown).
        followed_ = true;
        if (absl::Status handed = HandOver(*follower); !handed.ok()) return handed;
        LOG(INFO) << "followed the primary to " << member << " with " << follower->outstanding_
                  << " requests outstanding";
        return follower;
      }
      refusals.push_back(absl::StrCat(member, ": ", s.message()));
    }
    if (absl::Now() >= give_up) break;
    // Waiting for a promotion (an operator's, or an automatic one) to happen.
    absl::SleepFor(kFollowRetryInterval);
  }
  return absl::UnavailableError(absl::StrCat("no member took writes within ",
                                             absl::FormatDuration(timeout), ": ",
                                             absl::StrJoin(refusals, "; ")));
}

absl::Status Client::HandOver(Client& follower) {
  follower.next_seq_ = next_seq_;  // new requests continue the sequence numbers
  const RequestLimits limits{config_.max_key_bytes, config_.value_limit(),
                             config_.large_values() ? config_.landing_buffers : 0};
  // Resent in sequence order per slot (one per slot is outstanding), each as a new attempt: the
  // new primary replays the outcome of one the old primary executed (attempt > 0 is never
  // taken for a duplicate landing of a send it has not seen).
  auto parsed = std::make_unique<ParsedRequest>();  // large (a key copy): off the stack, once
  for (Outstanding& o : slots_) {
    if (!o.active) continue;
    Status status = Status::kOk;
    if (ParseRequest(StagedBytes(o), o.length, limits, welcome_.secret, parsed.get(), &status) !=
            Parse::kRequest ||
        status != Status::kOk) {
      return absl::InternalError("a staged request does not parse: the client's own bug");
    }
    const RequestHeader& h = parsed->header;
    // One sent at kMaxAttempt goes with that number again: the follower's session has seen no
    // attempt of it, so it is still a new one there (and its next retransmission ends it).
    const uint32_t attempt = std::min(o.attempt + 1, kMaxAttempt);
    if (absl::Status s =
            follower.Stage(Staged{o.client, o.op, parsed->key(), o.keyhash, parsed->value,
                                  h.expected_version, o.tag, o.seq, attempt, o.submitted});
        !s.ok()) {
      return s;
    }
  }
  // Handed over: this client forgets them (nothing of its session may answer them now).
  for (Outstanding& o : slots_) {
    if (o.active) Forget(o);
  }
  // A post that fails leaves them to the follower's retransmission, as any failed post.
  if (absl::Status s = follower.Flush(); !s.ok()) LOG(WARNING) << "follow: " << s;
  return absl::OkStatus();
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

absl::StatusOr<Result> Client::RunOne(Op op, std::string_view key, std::string_view value,
                                      uint64_t expected_version) {
  if (outstanding_ != 0) {
    return absl::FailedPreconditionError("synchronous calls need no requests outstanding");
  }
  if (absl::Status s = Submit(0, op, key, value, expected_version, kSyncTag); !s.ok()) return s;
  Result result;
  while (true) {
    if (Poll(absl::MakeSpan(&result, 1)) == 1 && result.tag == kSyncTag) return result;
  }
}

template <typename OnResult>
absl::Status Client::RunMany(Op op, absl::Span<const KeyValue> items, OnResult&& deliver) {
  if (outstanding_ != 0) {
    return absl::FailedPreconditionError("batched calls need no requests outstanding");
  }
  const bool was_batching = std::exchange(batching_, true);
  std::vector<Result> results(std::max<size_t>(items.size(), 1));
  size_t next = 0, done = 0;
  // Bounds a wait for a slot that never frees (a stuck QP with nothing outstanding): measured
  // from the last progress, not from the call's start (a long batch is not late).
  const auto patience = absl::ToChronoNanoseconds(options_.request_deadline);
  Clock::time_point give_up = Clock::now() + patience;
  while (done < items.size()) {
    if (outstanding_ == 0 && Clock::now() > give_up) {
      for (; next < items.size(); ++next, ++done) {
        deliver(next, absl::DeadlineExceededError("no request slot freed up in time"));
      }
      break;
    }
    // Stage what the windows hold: it goes out at Poll, one doorbell per worker QP.
    for (; next < items.size(); ++next) {
      const KeyValue& item = items[next];
      // A request no server could take fails now (Submit's other kResourceExhausted means
      // "later", and NO_MEMORY is one too).
      if (absl::Status s = CheckRequest(op, item.key, item.value); !s.ok()) {
        deliver(next, s);
        ++done;
        continue;
      }
      if (!CanSubmit(0, mica::KeyHash(item.key), item.value.size())) break;
      if (absl::Status s = Submit(0, op, item.key, item.value, 0, next); !s.ok()) {
        if (absl::IsResourceExhausted(s)) break;  // the slot's buffer is still being read
        deliver(next, s);
        ++done;
      }
    }
    const size_t got = Poll(absl::MakeSpan(results));
    for (size_t i = 0; i < got; ++i) {
      deliver(results[i].tag, results[i]);
      ++done;
    }
    if (got > 0) give_up = Clock::now() + patience;
  }
  batching_ = was_batching;
  return absl::OkStatus();
}

std::vector<absl::StatusOr<Value>> Client::MultiGet(absl::Span<const std::string_view> keys) {
  std::vector<KeyValue> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) items[i].key = keys[i];
  std::vector<absl::StatusOr<Value>> out(keys.size());
  const absl::Status run = RunMany(Op::kGet, items, [&](uint64_t i, const auto& r) {
    if constexpr (std::is_same_v<std::decay_t<decltype(r)>, absl::Status>) {
      out[i] = r;
    } else if (absl::Status error = ResultError(r); !error.ok()) {
      out[i] = error;
    } else {
      out[i] = Value{std::string(r.value), r.version};
    }
  });
  if (!run.ok()) out.assign(keys.size(), run);
  return out;
}

std::vector<absl::StatusOr<uint64_t>> Client::MultiPut(absl::Span<const KeyValue> items) {
  std::vector<absl::StatusOr<uint64_t>> out(items.size());
  const absl::Status run = RunMany(Op::kPut, items, [&](uint64_t i, const auto& r) {
    if constexpr (std::is_same_v<std::decay_t<decltype(r)>, absl::Status>) {
      out[i] = r;
    } else if (absl::Status error = ResultError(r); !error.ok()) {
      out[i] = error;
    } else {
      out[i] = r.version;
    }
  });
  if (!run.ok()) out.assign(items.size(), run);
  return out;
}

absl::Status ResultError(const Result& r) {
  const std::string name(StatusName(r.status));
  switch (r.status) {
    case Status::kOk:
      return absl::OkStatus();
    case Status::kNotFound:
      return absl::NotFoundError(name + ": no such key");
    case Status::kCasFailed:
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: the key's current version is %d", name, r.version));
    case Status::kExists:
      return absl::AlreadyExistsError(
          absl::StrFormat("%s: the key is present, at version %d", name, r.version));
    case Status::kNoMemory:
      return absl::ResourceExhaustedError(
          name +
          (r.op == Op::kGet
               ? ": the value is longer than the server's landing buffers can hold for a copy "
                 "(its --landing_value_bytes)"
               : ": the worker has no room for the item (cache mode: it is longer than the "
                 "whole log, --mica_log_bytes; store mode: the slab pool, --mica_pool_bytes, or "
                 "the index's extra buckets are full); nothing was stored or evicted"));
    case Status::kInternal:
      return absl::InternalError(
          name +
          ": the server could not serve it through an inconsistency of its own (e.g. an item in "
          "its log that fails its checksum), not the request's fault: see the server's log");
    case Status::kBackupBusy:
      return absl::UnavailableError(
          name +
          ": the backup could not read a whole copy while its primary's writes landed "
          "(or its primary died mid-batch): ask again, or ask the primary");
    case Status::kNotPrimary:
      return absl::FailedPreconditionError(name +
                                           ": the server is a backup; writes go to the primary");
    case Status::kKeyTooLong:
      return absl::InvalidArgumentError(name +
                                        ": the key is empty or longer than the server takes");
    case Status::kValueTooLong:
      return absl::OutOfRangeError(name + ": the value is longer than the server takes");
    case Status::kBufferTooSmall:
      return absl::ResourceExhaustedError(name + ": the value does not fit a response");
    case Status::kInvalidOp:
      return absl::InvalidArgumentError(name + ": the server does not know this operation");
    case Status::kBadRequest:
      return absl::InvalidArgumentError(name + ": the server refused the request's fields");
    case Status::kWrongWorker:
      return absl::FailedPreconditionError(
          name + ": the key belongs to another worker (client and server disagree on routing)");
    case Status::kTimedOut:
      return absl::DeadlineExceededError(name + ": no response through every retransmission");
    case Status::kSendFailed:
      return absl::UnavailableError(name + ": the request could not be sent (its QP is in error)");
  }
  return absl::InternalError(
      absl::StrFormat("unknown status %d from the server", static_cast<int>(r.status)));
}

absl::StatusOr<Value> Client::Get(std::string_view key) {
  absl::StatusOr<Result> r = RunOne(Op::kGet, key, {}, 0);
  if (!r.ok()) return r.status();
  if (absl::Status error = ResultError(*r); !error.ok()) return error;
  return Value{std::string(r->value), r->version};
}

namespace {
absl::StatusOr<uint64_t> VersionOf(const absl::StatusOr<Result>& r) {
  if (!r.ok()) return r.status();
  if (absl::Status error = ResultError(*r); !error.ok()) return error;
  return r->version;
}
}  // namespace

absl::StatusOr<uint64_t> Client::Put(std::string_view key, std::string_view value) {
  return VersionOf(RunOne(Op::kPut, key, value, 0));
}

absl::StatusOr<uint64_t> Client::Insert(std::string_view key, std::string_view value) {
  return VersionOf(RunOne(Op::kInsert, key, value, 0));
}

absl::StatusOr<uint64_t> Client::Delete(std::string_view key) {
  return VersionOf(RunOne(Op::kDelete, key, {}, 0));
}

absl::StatusOr<uint64_t> Client::Cas(std::string_view key, uint64_t expected_version,
                                     std::string_view value) {
  return VersionOf(RunOne(Op::kCas, key, value, expected_version));
}

absl::Status Client::SendRaw(uint32_t client, uint32_t worker, uint32_t slot,
                             absl::Span<const uint8_t> bytes) {
  if (client >= options_.clients || worker >= config_.workers || slot >= config_.window ||
      bytes.size() > config_.slot_bytes) {
    return absl::InvalidArgumentError("SendRaw: no such slot, or more bytes than a slot holds");
  }
  const uint64_t index = SlotIndex(client, worker, slot);
  if (slots_[index].active) return absl::FailedPreconditionError("SendRaw: slot in use");
  Outstanding& o = slots_[index];
  if (!BufferFree(o)) return absl::FailedPreconditionError("SendRaw: slot buffer in flight");
  std::memcpy(staging_->data() + index * config_.slot_bytes, bytes.data(), bytes.size());
  o.client = client;
  o.worker = worker;
  o.slot = slot;
  o.queue = config_.request_uses_slots() ? 1 + worker : 0;
  o.large_body = false;
  o.buffer_in_flight = false;
  o.sends = 0;  // sent as is: no attempt number is rewritten into raw bytes
  o.length = static_cast<uint32_t>(bytes.size());
  if (absl::Status s = Send(o, /*wait_for_room=*/true); !s.ok()) return s;
  return Flush();
}

void Client::BreakQpsForTest() {
  ud_qp_->SetError();
  for (auto& qp : request_qps_) qp->SetError();
}

ClientStats Client::stats() const {
  ClientStats s = stats_;
  s.retry_timeout = absl::FromChrono(TimeoutFor(1));
  s.fabric.Add(ud_qp_->counters());
  for (const auto& qp : request_qps_) s.fabric.Add(qp->counters());
  for (const auto& qp : large_qps_) s.fabric.Add(qp->counters());  // WRITE_WITH_IMMs and READs
  s.fabric.Add(send_cq_->counters());
  s.fabric.Add(recv_cq_->counters());
  return s;
}

}  // namespace herd
