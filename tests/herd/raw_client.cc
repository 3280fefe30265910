#include "tests/herd/raw_client.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "mica/keyhash.h"
#include "util/take.h"

namespace herd::testing {
namespace {

using util::Take;

constexpr uint32_t kReceiveBuffers = 64;
constexpr uint32_t kMaxMessageBytes = 4096;  // the shm fabric's default MTU: the largest UD SEND
constexpr uint32_t kQpDepth = 64;

absl::StatusOr<std::unique_ptr<transport::SharedMemory>> Allocate(uint64_t bytes) {
  absl::StatusOr<transport::SharedMemory> memory = transport::SharedMemory::Allocate(bytes);
  if (!memory.ok()) return memory.status();
  return std::make_unique<transport::SharedMemory>(*std::move(memory));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RawClient>> RawClient::Connect(const RawClientOptions& options) {
  std::unique_ptr<RawClient> client(new RawClient(options));
  if (absl::Status s = client->Handshake(); !s.ok()) return s;
  return client;
}

RawClient::~RawClient() {
  // QPs and AHs before the PD, the PD before the device (the fabric CHECKs the order).
  request_qps_.clear();
  response_qps_.clear();
  large_qps_.clear();
  ud_qp_.reset();
  worker_ahs_.clear();
  extra_ahs_.clear();
  buffer_mr_.reset();
  receives_mr_.reset();
  responses_mr_.reset();
  pd_.reset();
  send_cq_.reset();
  recv_cq_.reset();
  device_.reset();
}

absl::Status RawClient::Handshake() {
  transport::DeviceOptions device;
  device.fabric = options_.fabric;
  device.faults.delay_us = options_.delay_us;
  if (absl::Status s = Take(transport::OpenDevice(device), &device_); !s.ok()) return s;
  if (absl::Status s =
          Take(transport::control::Channel::Connect(options_.server, options_.timeout), &channel_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = channel_.Send(kHello, herd::Encode(Hello{options_.clients})); !s.ok()) {
    return s;
  }
  absl::StatusOr<transport::control::Message> reply =
      Expect(channel_, kServerConfig, options_.timeout);
  if (!reply.ok()) return reply.status();
  if (absl::Status s = Take(DecodeConfig(reply->payload), &config_); !s.ok()) return s;
  const Config& c = config_;

  if (absl::Status s = Take(device_->AllocatePd(), &pd_); !s.ok()) return s;
  if (absl::Status s = Take(device_->CreateCq(4 * kQpDepth * (c.workers + 1)), &send_cq_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Take(device_->CreateCq(kReceiveBuffers + 1), &recv_cq_); !s.ok()) return s;
  auto make_qp = [&](transport::QpType type, uint32_t receives,
                     std::unique_ptr<transport::QueuePair>* out) {
    transport::QpConfig qc;
    qc.type = type;
    qc.send_cq = send_cq_.get();
    qc.recv_cq = recv_cq_.get();
    qc.max_send_wr = kQpDepth;
    qc.max_recv_wr = receives;
    qc.max_inline_data = 0;
    return Take(pd_->CreateQp(qc), out);
  };
  if (absl::Status s = make_qp(transport::QpType::kUd, kReceiveBuffers, &ud_qp_); !s.ok()) {
    return s;
  }
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
    if (c.large_values()) {
      // As herd's client: RC, for WRITE_WITH_IMM and READ; it receives nothing.
      large_qps_.emplace_back();
      if (absl::Status s = make_qp(transport::QpType::kRc, 1, &large_qps_.back()); !s.ok()) {
        return s;
      }
    }
  }
  if (absl::Status s = Take(Allocate(options_.buffer_bytes), &buffer_); !s.ok()) return s;
  if (absl::Status s =
          Take(pd_->RegisterMemory(buffer_->data(), buffer_->size(), transport::kLocalWrite),
               &buffer_mr_);
      !s.ok()) {
    return s;
  }
  const uint64_t receive_bytes =
      uint64_t{kReceiveBuffers} * (transport::kGrhBytes + kMaxMessageBytes);
  if (absl::Status s = Take(Allocate(receive_bytes), &receives_); !s.ok()) return s;
  if (absl::Status s =
          Take(pd_->RegisterMemory(receives_->data(), receives_->size(), transport::kLocalWrite),
               &receives_mr_);
      !s.ok()) {
    return s;
  }
  for (uint32_t i = 0; i < kReceiveBuffers; ++i) RepostReceive(i);
  Join join;
  join.ud = ud_qp_->endpoint();
  join.ud_qkey = ud_qkey_;
  for (auto& qp : request_qps_) join.request_qps.push_back(qp->endpoint());
  for (auto& qp : response_qps_) join.response_qps.push_back(qp->endpoint());
  for (auto& qp : large_qps_) join.large_qps.push_back(qp->endpoint());
  if (c.response_uses_slots()) {
    const uint64_t bytes =
        uint64_t{options_.clients} * c.workers * c.window * c.response_slot_bytes();
    if (absl::Status s = Take(Allocate(bytes), &responses_); !s.ok()) return s;
    if (absl::Status s = Take(pd_->RegisterMemory(responses_->data(), responses_->size(),
                                                  transport::kLocalWrite | transport::kRemoteWrite),
                              &responses_mr_);
        !s.ok()) {
      return s;
    }
    join.response_region_addr = reinterpret_cast<uint64_t>(responses_->data());
    join.response_region_rkey = responses_mr_->rkey();
  }
  if (options_.tamper) options_.tamper(join);
  if (absl::Status s = channel_.Send(kJoin, herd::Encode(join)); !s.ok()) return s;
  reply = Expect(channel_, kWelcome, options_.timeout);
  if (!reply.ok()) return reply.status();
  if (absl::Status s =
          Take(DecodeWelcome(reply->payload, c.workers, c.ud_qps_per_worker), &welcome_);
      !s.ok()) {
    return s;
  }
  for (uint32_t w = 0; w < c.workers; ++w) {
    transport::ConnectConfig connect;
    if (!request_qps_.empty()) {
      connect.remote = welcome_.request_qps.at(w);
      if (absl::Status s = request_qps_[w]->Connect(connect); !s.ok()) return s;
    }
    if (!response_qps_.empty()) {
      connect.remote = welcome_.response_qps.at(w);
      if (absl::Status s = response_qps_[w]->Connect(connect); !s.ok()) return s;
    }
    if (!large_qps_.empty()) {
      connect.remote = welcome_.large_qps.at(w);
      if (absl::Status s = large_qps_[w]->Connect(connect); !s.ok()) return s;
    }
    std::unique_ptr<transport::AddressHandle> ah;
    const transport::QpEndpoint& to = welcome_.worker_ud.at(w);
    if (absl::Status s = Take(pd_->CreateAddressHandle({to.lid, to.gid}), &ah); !s.ok()) return s;
    worker_ahs_.push_back(std::move(ah));
  }
  return absl::OkStatus();
}

void RawClient::RepostReceive(uint64_t buffer) {
  const uint32_t bytes = transport::kGrhBytes + kMaxMessageBytes;
  transport::Sge sge{reinterpret_cast<uint64_t>(receives_->data() + buffer * bytes), bytes,
                     receives_mr_->lkey()};
  transport::RecvWr wr;
  wr.wr_id = buffer;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  transport::RecvWr* bad = nullptr;
  (void)ud_qp_->PostRecv(&wr, &bad);
}

uint32_t RawClient::WorkerOf(std::string_view key) const {
  return mica::PartitionOf(mica::KeyHash(key), config_.workers);
}

uint64_t RawClient::SlotAddress(uint32_t client, uint32_t worker, uint32_t slot) const {
  return welcome_.region_addr + config_.SlotOffset(worker, client, slot);
}

uint64_t RawClient::LandingAddress(uint32_t worker, uint64_t buffer) const {
  return welcome_.landing_addr +
         (uint64_t{worker} * config_.landing_buffers + buffer) * config_.landing_bytes();
}

transport::QueuePair* RawClient::LargeQp(uint32_t worker) const {
  return worker < large_qps_.size() ? large_qps_[worker].get() : nullptr;
}

absl::StatusOr<transport::CompletionStatus> RawClient::PostAndWait(
    transport::QueuePair& qp, transport::SendWr& wr, absl::Span<const uint8_t> bytes) {
  if (bytes.size() > buffer_->size()) return absl::InvalidArgumentError("message too large");
  std::memcpy(buffer_->data(), bytes.data(), bytes.size());
  return PostAndWait(qp, wr, bytes.size());
}

absl::StatusOr<transport::CompletionStatus> RawClient::PostAndWait(transport::QueuePair& qp,
                                                                   transport::SendWr& wr,
                                                                   uint64_t length) {
  if (length > buffer_->size()) return absl::InvalidArgumentError("message too large");
  transport::Sge sge{reinterpret_cast<uint64_t>(buffer_->data()), static_cast<uint32_t>(length),
                     buffer_mr_->lkey()};
  wr.wr_id = next_wr_id_++;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.flags = transport::kSignaled;
  transport::SendWr* bad = nullptr;
  if (absl::Status s = qp.PostSend(&wr, &bad); !s.ok()) return s;
  // The buffer is read when the WR executes (asynchronous fabric): wait for its completion.
  const absl::Time give_up = absl::Now() + options_.timeout;
  transport::Completion completion;
  while (absl::Now() < give_up) {
    if (send_cq_->Poll(absl::MakeSpan(&completion, 1)) == 1 && completion.wr_id == wr.wr_id) {
      return completion.status;
    }
  }
  return absl::DeadlineExceededError("no completion for the WR");
}

absl::StatusOr<transport::CompletionStatus> RawClient::Write(uint32_t worker, uint64_t remote_addr,
                                                             uint32_t rkey,
                                                             absl::Span<const uint8_t> bytes) {
  if (worker >= request_qps_.size()) return absl::InvalidArgumentError("no request QP");
  return WriteThrough(*request_qps_[worker], remote_addr, rkey, bytes);
}

absl::StatusOr<transport::CompletionStatus> RawClient::WriteThrough(
    transport::QueuePair& qp, uint64_t remote_addr, uint32_t rkey,
    absl::Span<const uint8_t> bytes) {
  transport::SendWr wr;
  wr.opcode = transport::Opcode::kWrite;
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  return PostAndWait(qp, wr, bytes);
}

absl::StatusOr<transport::CompletionStatus> RawClient::WriteWithImm(
    uint32_t worker, uint64_t remote_addr, uint32_t rkey, uint32_t imm,
    absl::Span<const uint8_t> bytes) {
  transport::QueuePair* qp = LargeQp(worker);
  if (qp == nullptr) return absl::InvalidArgumentError("no large-value QP");
  return WriteWithImmThrough(*qp, remote_addr, rkey, imm, bytes);
}

absl::StatusOr<transport::CompletionStatus> RawClient::WriteWithImmThrough(
    transport::QueuePair& qp, uint64_t remote_addr, uint32_t rkey, uint32_t imm,
    absl::Span<const uint8_t> bytes) {
  transport::SendWr wr;
  wr.opcode = transport::Opcode::kWriteWithImm;
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  wr.imm_data = imm;
  return PostAndWait(qp, wr, bytes);
}

absl::StatusOr<transport::CompletionStatus> RawClient::WriteLarge(uint32_t worker,
                                                                  uint64_t remote_addr,
                                                                  uint32_t rkey,
                                                                  absl::Span<const uint8_t> bytes) {
  transport::QueuePair* qp = LargeQp(worker);
  if (qp == nullptr) return absl::InvalidArgumentError("no large-value QP");
  return WriteThrough(*qp, remote_addr, rkey, bytes);
}

absl::StatusOr<RawClient::ReadResult> RawClient::Read(uint32_t worker, uint64_t remote_addr,
                                                      uint32_t rkey, uint32_t length) {
  transport::QueuePair* qp = LargeQp(worker);
  if (qp == nullptr) return absl::InvalidArgumentError("no large-value QP");
  return ReadThrough(*qp, remote_addr, rkey, length);
}

absl::StatusOr<RawClient::ReadResult> RawClient::ReadThrough(transport::QueuePair& qp,
                                                             uint64_t remote_addr, uint32_t rkey,
                                                             uint32_t length) {
  transport::SendWr wr;
  wr.opcode = transport::Opcode::kRead;
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  absl::StatusOr<transport::CompletionStatus> status = PostAndWait(qp, wr, length);
  if (!status.ok()) return status.status();
  ReadResult out;
  out.status = *status;
  if (out.status == transport::CompletionStatus::kSuccess) {
    out.bytes.assign(reinterpret_cast<const char*>(buffer_->data()), length);
  }
  return out;
}

absl::StatusOr<transport::CompletionStatus> RawClient::SendUd(const transport::QpEndpoint& to,
                                                              uint32_t qkey,
                                                              absl::Span<const uint8_t> bytes,
                                                              std::optional<uint32_t> imm) {
  // One address handle per destination GID, kept for the client's life.
  const transport::AddressHandle* ah = nullptr;
  for (uint32_t w = 0; w < config_.workers && ah == nullptr; ++w) {
    if (welcome_.worker_ud[w].gid == to.gid) ah = worker_ahs_[w].get();
  }
  if (ah == nullptr) {
    std::unique_ptr<transport::AddressHandle> made;
    if (absl::Status s = Take(pd_->CreateAddressHandle({to.lid, to.gid}), &made); !s.ok()) {
      return s;
    }
    ah = made.get();
    extra_ahs_.push_back(std::move(made));
  }
  transport::SendWr wr;
  wr.opcode = imm.has_value() ? transport::Opcode::kSendWithImm : transport::Opcode::kSend;
  wr.imm_data = imm.value_or(0);
  wr.ah = ah;
  wr.remote_qpn = to.qp_num;
  wr.remote_qkey = qkey;
  return PostAndWait(*ud_qp_, wr, bytes);
}

std::vector<uint8_t> RawClient::Encode(const Request& r) const {
  RequestHeader header{};
  header.keyhash = mica::KeyHash(r.key);
  header.expected_version = r.expected_version;
  header.value_bytes = static_cast<uint32_t>(r.value.size());
  header.key_bytes = static_cast<uint16_t>(r.key.size());
  header.op = static_cast<uint8_t>(r.op);
  header.attempt = r.attempt;
  header.seq = r.seq;
  // Room for the copy-to-landing word, trimmed below when it is not asked for.
  std::vector<uint8_t> bytes(RequestBytes(r.op, header.key_bytes, header.value_bytes) +
                             kRequestExtensionBytes);
  const uint64_t secret = r.secret != 0 ? r.secret : welcome_.secret;
  uint32_t length = EncodeRequest(header, r.key, r.value, secret, bytes.data());
  if (r.copy_to_landing >= 0) {
    length = SetRequestCopyToLanding(static_cast<uint32_t>(r.copy_to_landing), secret, bytes.data(),
                                     length);
  }
  bytes.resize(length);
  return bytes;
}

absl::StatusOr<transport::CompletionStatus> RawClient::Send(const Request& request) {
  const std::vector<uint8_t> bytes = Encode(request);
  sent_.emplace(welcome_.first_client_id + request.client, request.seq);
  if (request.landing >= 0) {
    const auto landing = static_cast<uint32_t>(request.landing);
    return WriteWithImm(
        request.worker, LandingAddress(request.worker, landing), welcome_.landing_rkey,
        LandingImmediate(welcome_.first_client_id + request.client, landing), bytes);
  }
  if (!config_.request_uses_slots()) {
    return SendUd(welcome_.worker_ud[request.worker], kQkey, bytes,
                  request.client_id >= 0 ? static_cast<uint32_t>(request.client_id)
                                         : welcome_.first_client_id + request.client);
  }
  const auto slot = static_cast<uint32_t>(request.seq % config_.window);
  const uint64_t end = SlotAddress(request.client, request.worker, slot) + config_.slot_bytes;
  return Write(request.worker, end - bytes.size(), welcome_.region_rkey, bytes);
}

absl::StatusOr<RawResponse> RawClient::Receive(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  transport::Completion c;
  while (recv_cq_->Poll(absl::MakeSpan(&c, 1)) == 0) {
    if (absl::Now() > give_up) return absl::DeadlineExceededError("no UD message");
  }
  const uint32_t bytes = transport::kGrhBytes + kMaxMessageBytes;
  const uint8_t* message = receives_->data() + c.wr_id * bytes + transport::kGrhBytes;
  RawResponse out;
  out.src_qp = c.src_qp;
  ParsedResponse parsed;
  const bool ok = c.status == transport::CompletionStatus::kSuccess && c.has_imm &&
                  c.byte_len >= transport::kGrhBytes &&
                  ParseResponse(message, c.byte_len - transport::kGrhBytes, 0, &parsed);
  if (ok) {
    out.header = parsed.header;
    out.header.client_id = c.imm_data;  // a UD response names its client in the immediate
    out.value.assign(reinterpret_cast<const char*>(parsed.value), parsed.header.value_bytes);
  }
  RepostReceive(c.wr_id);
  if (!ok) return absl::DataLossError("a UD message that is no response");
  return out;
}

absl::StatusOr<RawResponse> RawClient::Call(const Request& request, absl::Duration timeout) {
  // Retransmitted (next attempt) until answered, as herd's client does: a session's first
  // request can reach the worker before the server published its route, and is dropped then.
  constexpr absl::Duration kRetransmitAfter = absl::Milliseconds(100);
  // Answers go to the slot's (or the sending QP's) owner, whatever id the request named.
  const uint32_t client_id = welcome_.first_client_id + request.client;
  const absl::Time give_up = absl::Now() + timeout;
  Request send = request;
  while (absl::Now() < give_up) {
    absl::StatusOr<transport::CompletionStatus> sent = Send(send);
    if (!sent.ok()) return sent.status();
    if (*sent != transport::CompletionStatus::kSuccess) {
      return absl::InternalError(
          absl::StrFormat("the request's WR completed with %s", transport::ToString(*sent)));
    }
    const absl::Time retransmit = std::min(give_up, absl::Now() + kRetransmitAfter);
    while (absl::Now() < retransmit) {
      absl::StatusOr<RawResponse> r = Receive(retransmit - absl::Now());
      if (!r.ok()) continue;
      if (r->header.seq == request.seq && r->header.client_id == client_id) return r;
      if (!sent_.contains({r->header.client_id, r->header.seq})) ++unexpected_responses_;
    }
    ++send.attempt;
  }
  return absl::DeadlineExceededError("no answer through every retransmission");
}

absl::StatusOr<std::unique_ptr<transport::QueuePair>> RawClient::NewConnectedQp(
    transport::QpType type, const transport::QpEndpoint& remote) {
  transport::QpConfig qc;
  qc.type = type;
  qc.send_cq = send_cq_.get();
  qc.recv_cq = recv_cq_.get();
  qc.max_send_wr = kQpDepth;
  qc.max_recv_wr = 1;
  qc.max_inline_data = 0;
  std::unique_ptr<transport::QueuePair> qp;
  if (absl::Status s = Take(pd_->CreateQp(qc), &qp); !s.ok()) return s;
  transport::ConnectConfig connect;
  connect.remote = remote;
  if (absl::Status s = qp->Connect(connect); !s.ok()) return s;
  return qp;
}

}  // namespace herd::testing
