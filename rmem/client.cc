#include "rmem/client.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "transport/control/channel.h"
#include "util/take.h"

namespace rmem {

namespace {

// wr_id's high word: what a completion is for (the low word: a receive's reply slot).
constexpr uint64_t kCommandWr = uint64_t{1} << 32;
constexpr uint64_t kReplyWr = uint64_t{2} << 32;
constexpr uint64_t kDataWr = uint64_t{3} << 32;
// One READ or WRITE carries at most this much (an SGE's length is 32 bits).
constexpr uint64_t kMaxTransferBytes = uint64_t{1} << 30;
// How often (in empty polls) Await looks at the clock and the control connection.
constexpr uint32_t kPollsPerCheck = 1024;
constexpr uint32_t kCqDepth = kMaxChainedWrites + 2 * kCommandSlots + 8;

bool TakesOps(CommandKind kind) {
  return kind == CommandKind::kQueue || kind == CommandKind::kTxnGo;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.staging_bytes == 0) return absl::InvalidArgumentError("staging_bytes must be > 0");
  std::unique_ptr<Client> client(new Client(options));
  if (absl::Status s = client->Open(); !s.ok()) return s;
  if (absl::Status s = client->Join(); !s.ok()) return s;
  return client;
}

Client::~Client() {
  qp_.reset();  // before the CQ and the MRs it may still write into
  locals_.clear();
}

absl::Status Client::Open() {
  // The server's pool may be a file on disk (rmem_server --path), which no seal keeps from
  // shrinking: a client trusts its server with that, as with the data it serves.
  transport::DeviceOptions device = options_.device;
  device.shm_map_unsealed_regions = true;
  absl::StatusOr<transport::DeviceResources> opened =
      transport::OpenDeviceResources(device, kCqDepth);
  if (!opened.ok()) return opened.status();
  device_ = std::move(opened->device);
  pd_ = std::move(opened->pd);
  cq_ = std::move(opened->cq);
  const uint64_t bytes =
      kCommandBytes + uint64_t{kCommandSlots} * kReplyBytes + options_.staging_bytes;
  absl::StatusOr<transport::SharedMemory> memory =
      transport::SharedMemory::Allocate(bytes, "rmem-client");
  if (!memory.ok()) return memory.status();
  buffers_ = std::make_unique<transport::SharedMemory>(*std::move(memory));
  if (absl::Status s = util::Take(
          pd_->RegisterMemory(buffers_->data(), buffers_->size(), transport::kLocalWrite),
          &buffers_mr_);
      !s.ok()) {
    return s;
  }
  transport::QpConfig config;
  config.type = transport::QpType::kRc;
  config.send_cq = cq_.get();
  config.recv_cq = cq_.get();
  config.max_send_wr = kMaxChainedWrites + 1;  // the WRITEs chained before a command, and it
  config.max_recv_wr = kCommandSlots;
  return util::Take(pd_->CreateQp(config), &qp_);
}

absl::Status Client::Join() {
  absl::StatusOr<transport::control::Channel> channel =
      transport::control::Channel::Connect(options_.server, options_.timeout);
  if (!channel.ok()) return channel.status();
  control_ = std::make_unique<transport::control::Channel>(*std::move(channel));
  RmemHello hello;
  hello.qp = qp_->endpoint();
  hello.resume = options_.resume;
  if (absl::Status s = control_->Send(kRmemHello, Encode(hello)); !s.ok()) return s;
  absl::StatusOr<transport::control::Message> m = control_->Receive(options_.timeout);
  if (!m.ok()) return m.status();
  if (m->type == kRmemError) return DecodeError(m->payload);
  if (m->type != kRmemWelcome) {
    return absl::DataLossError(
        absl::StrFormat("rmem_server sent message type %u, expected %u", m->type, kRmemWelcome));
  }
  absl::StatusOr<RmemWelcome> welcome = DecodeWelcome(m->payload);
  if (!welcome.ok()) return welcome.status();
  transport::ConnectConfig connect;
  connect.remote = welcome->qp;
  if (absl::Status s = qp_->Connect(connect); !s.ok()) return s;
  for (uint32_t i = 0; i < kCommandSlots; ++i) {
    if (absl::Status s = PostReceive(i); !s.ok()) return s;
  }
  credential_ = welcome->credential;
  resumed_ = welcome->resumed;
  last_txn_ = welcome->last_txn;
  max_ops_ = welcome->max_ops;
  pool_bytes_ = welcome->pool_bytes;
  return absl::OkStatus();
}

absl::Status Client::PostReceive(uint32_t slot) {
  uint8_t* reply = buffers_->data() + kCommandBytes + uint64_t{slot} * kReplyBytes;
  transport::Sge sge{reinterpret_cast<uint64_t>(reply), kReplyBytes, buffers_mr_->lkey()};
  transport::RecvWr wr;
  wr.wr_id = kReplyWr | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  transport::RecvWr* bad = nullptr;
  return qp_->PostRecv(&wr, &bad);
}

absl::Status Client::Broken(absl::Status why) {
  if (broken_.ok()) broken_ = why;
  return why;
}

absl::Status Client::Await(size_t want, absl::Time deadline,
                           std::vector<transport::Completion>* got) {
  std::array<transport::Completion, 8> batch;
  uint32_t empty = 0;
  while (got->size() < want) {
    const size_t n = cq_->Poll(absl::MakeSpan(batch));
    for (size_t i = 0; i < n; ++i) {
      if (batch[i].status != transport::CompletionStatus::kSuccess) {
        return Broken(absl::UnavailableError(absl::StrFormat(
            "a work request to rmem_server failed (completion status %d): the connection is "
            "lost; reconnect (ClientOptions::resume) to go on",
            static_cast<int>(batch[i].status))));
      }
      got->push_back(batch[i]);
      if ((batch[i].wr_id >> 32) == (kCommandWr >> 32) && on_txn_sent_ &&
          static_cast<CommandKind>(
              reinterpret_cast<const CommandHeader*>(buffers_->data())->kind) ==
              CommandKind::kTxnGo) {
        on_txn_sent_();
      }
    }
    if (n > 0 || ++empty % kPollsPerCheck != 0) continue;
    if (absl::Now() > deadline) {
      return Broken(absl::DeadlineExceededError(
          "rmem_server did not answer in time; reconnect (ClientOptions::resume) to go on"));
    }
    if (control_->PeerClosed()) {
      return Broken(absl::UnavailableError(
          "rmem_server closed the connection; reconnect (ClientOptions::resume) to go on"));
    }
  }
  return absl::OkStatus();
}

uint32_t Client::LkeyOf(const void* p, uint64_t bytes) const {
  const auto* at = static_cast<const uint8_t*>(p);
  for (const Local& l : locals_) {
    const uint8_t* begin = l.memory->data();
    if (at >= begin && at <= begin + l.memory->size() &&
        bytes <= static_cast<uint64_t>(begin + l.memory->size() - at)) {
      return l.mr->lkey();
    }
  }
  return 0;
}

absl::StatusOr<uint8_t*> Client::AllocateLocal(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocateLocal of 0 bytes");
  absl::StatusOr<transport::SharedMemory> memory =
      transport::SharedMemory::Allocate(bytes, "rmem-local");
  if (!memory.ok()) return memory.status();
  Local l;
  l.memory = std::make_unique<transport::SharedMemory>(*std::move(memory));
  if (absl::Status s = util::Take(
          pd_->RegisterMemory(l.memory->data(), l.memory->size(), transport::kLocalWrite), &l.mr);
      !s.ok()) {
    return s;
  }
  uint8_t* data = l.memory->data();
  locals_.push_back(std::move(l));
  return data;
}

absl::Status Client::ChainWrites(absl::Span<const ChainedWrite> writes, size_t extra) {
  wrs_.assign(writes.size() + extra, transport::SendWr{});
  sges_.assign(writes.size() + extra, transport::Sge{});
  for (size_t i = 0; i < writes.size(); ++i) {
    const ChainedWrite& w = writes[i];
    const uint32_t lkey = LkeyOf(w.local, w.bytes);
    if (lkey == 0 || w.bytes == 0 || w.bytes > kMaxTransferBytes) {
      return absl::InvalidArgumentError(
          "a chained WRITE's memory is not from AllocateLocal (or is empty or too long)");
    }
    if (absl::Status s = CheckRange(w.region, w.offset, w.bytes); !s.ok()) return s;
    sges_[i] =
        transport::Sge{reinterpret_cast<uint64_t>(w.local), static_cast<uint32_t>(w.bytes), lkey};
    transport::SendWr& wr = wrs_[i];
    wr.wr_id = kDataWr;
    wr.opcode = transport::Opcode::kWrite;
    wr.remote_addr = w.region.addr + w.offset;
    wr.rkey = w.region.rkey;
    wr.sg_list = &sges_[i];
    wr.num_sge = 1;
    if (i + 1 < wrs_.size()) wr.next = &wrs_[i + 1];
  }
  return absl::OkStatus();
}

absl::StatusOr<ReplyHeader> Client::Exchange(CommandKind kind, uint64_t a, uint64_t b,
                                             absl::Span<const ChainedWrite> writes) {
  if (!broken_.ok()) return broken_;
  CHECK_LE(writes.size(), kMaxChainedWrites);
  CommandHeader header{};
  header.kind = static_cast<uint16_t>(kind);
  header.ops = TakesOps(kind) ? static_cast<uint16_t>(batch_ops_) : 0;
  header.seq = seq_ + 1;  // seq_ moves only once the command is posted
  header.a = a;
  header.b = b;
  std::memcpy(buffers_->data(), &header, sizeof(header));
  // The WRITEs (unsignaled: an error still completes), then the command: one doorbell.
  if (absl::Status s = ChainWrites(writes, /*extra=*/1); !s.ok()) return s;
  std::vector<transport::SendWr>& wrs = wrs_;
  std::vector<transport::Sge>& sges = sges_;
  transport::SendWr& send = wrs.back();
  sges.back() = transport::Sge{reinterpret_cast<uint64_t>(buffers_->data()),
                               static_cast<uint32_t>(sizeof(header) + header.ops * sizeof(WireOp)),
                               buffers_mr_->lkey()};
  send.wr_id = kCommandWr;
  send.opcode = transport::Opcode::kSend;
  send.flags = transport::kSignaled;
  send.sg_list = &sges.back();
  send.num_sge = 1;
  transport::SendWr* bad = nullptr;
  if (absl::Status s = qp_->PostSend(&wrs[0], &bad); !s.ok()) return Broken(s);
  seq_ = header.seq;
  if (TakesOps(kind)) {
    sent_ops_ += batch_ops_;
    batch_ops_ = 0;
  }
  completions_.clear();
  if (absl::Status s = Await(2, absl::Now() + options_.timeout, &completions_); !s.ok()) return s;
  const transport::Completion* reply = nullptr;
  for (const transport::Completion& c : completions_) {
    if ((c.wr_id >> 32) == (kReplyWr >> 32)) reply = &c;
  }
  if (reply == nullptr) return Broken(absl::DataLossError("no reply among the completions"));
  const uint32_t slot = reply->wr_id & 0xffffffff;
  absl::Status refusal;
  absl::StatusOr<ReplyHeader> h = DecodeReply(
      buffers_->data() + kCommandBytes + uint64_t{slot} * kReplyBytes, reply->byte_len, &refusal);
  if (absl::Status s = PostReceive(slot); !s.ok()) return Broken(s);
  if (!h.ok()) return Broken(h.status());
  if (h->seq != header.seq || h->kind != header.kind) {
    return Broken(absl::DataLossError(absl::StrFormat(
        "a reply to command %u (kind %u) for command %u", h->seq, h->kind, header.seq)));
  }
  if (!refusal.ok()) {
    // The server discarded the open transaction.
    sent_ops_ = 0;
    batch_ops_ = 0;
    return refusal;
  }
  return *h;
}

absl::StatusOr<RemoteRegion> Client::Alloc(uint64_t bytes, uint64_t tag) {
  absl::StatusOr<ReplyHeader> h = Exchange(CommandKind::kAlloc, bytes, tag);
  if (!h.ok()) return h.status();
  return RemoteRegion{h->c, h->a, h->d, h->b};
}

absl::Status Client::Queue(const WireOp& op) {
  if (!broken_.ok()) return broken_;
  if (batch_ops_ == kMaxOpsPerCommand) {
    if (absl::StatusOr<ReplyHeader> h = Exchange(CommandKind::kQueue, 0, 0); !h.ok()) {
      return h.status();
    }
  }
  std::memcpy(buffers_->data() + sizeof(CommandHeader) + batch_ops_ * sizeof(WireOp), &op,
              sizeof(op));
  ++batch_ops_;
  return absl::OkStatus();
}

absl::Status Client::Free(const RemoteRegion& region) {
  WireOp op{};
  op.kind = static_cast<uint32_t>(WireOpKind::kFree);
  op.src_tag = region.tag;
  return Queue(op);
}

absl::Status Client::Cp(const RemoteRegion& dst, uint64_t dst_offset, const RemoteRegion& src,
                        uint64_t src_offset, uint64_t bytes) {
  WireOp op{};
  op.kind = static_cast<uint32_t>(WireOpKind::kCopy);
  op.src_tag = src.tag;
  op.src_offset = src_offset;
  op.dst_tag = dst.tag;
  op.dst_offset = dst_offset;
  op.bytes = bytes;
  return Queue(op);
}

absl::StatusOr<TxnResult> Client::Go(uint64_t txn_id, absl::Span<const ChainedWrite> writes) {
  const uint64_t posted = seq_;
  absl::StatusOr<ReplyHeader> h = Exchange(CommandKind::kTxnGo, txn_id, 0, writes);
  if (seq_ == posted) return h.status();  // refused here, before anything was sent
  sent_ops_ = 0;  // the transaction is over (or its fate is the server's to tell)
  batch_ops_ = 0;
  if (h.ok() || broken_.ok()) last_txn_ = std::max(last_txn_, txn_id);  // answered
  if (!h.ok()) return h.status();
  return TxnResult{txn_id, h->a, h->d, h->e != 0};
}

absl::StatusOr<TxnResult> Client::TxnGo() { return Go(last_txn_ + 1, {}); }

absl::StatusOr<TxnResult> Client::RetryTxnGo(uint64_t txn_id) {
  if (queued() != 0) {
    return absl::FailedPreconditionError("RetryTxnGo with ops queued: TxnGo them first");
  }
  return Go(txn_id, {});
}

absl::StatusOr<TxnResult> Client::WriteAndCommit(absl::Span<const ChainedWrite> writes) {
  // All but the last kMaxChainedWrites go first: a doorbell per group of kMaxChainedWrites,
  // awaited by its signaled last WRITE (the send queue holds no more).
  if (!broken_.ok()) return broken_;
  while (writes.size() > kMaxChainedWrites) {
    const size_t n = std::min<size_t>(writes.size() - kMaxChainedWrites, kMaxChainedWrites);
    if (absl::Status s = ChainWrites(writes.subspan(0, n), /*extra=*/0); !s.ok()) return s;
    wrs_.back().flags = transport::kSignaled;
    transport::SendWr* bad = nullptr;
    if (absl::Status s = qp_->PostSend(&wrs_[0], &bad); !s.ok()) return Broken(s);
    completions_.clear();
    if (absl::Status s = Await(1, absl::Now() + options_.timeout, &completions_); !s.ok()) {
      return s;
    }
    writes.remove_prefix(n);
  }
  return Go(last_txn_ + 1, writes);
}

absl::Status Client::Forget() {
  absl::StatusOr<ReplyHeader> h = Exchange(CommandKind::kForget, 0, 0);
  return h.status();
}

absl::Status Client::CheckRange(const RemoteRegion& region, uint64_t offset, uint64_t bytes) const {
  if (offset > region.bytes || bytes > region.bytes - offset) {
    return absl::OutOfRangeError(absl::StrFormat("[%u, +%u) leaves the region of tag %u (%u bytes)",
                                                 offset, bytes, region.tag, region.bytes));
  }
  return absl::OkStatus();
}

absl::Status Client::Transfer(bool write, const RemoteRegion& region, uint64_t offset,
                              uint8_t* local, uint32_t lkey, uint64_t bytes) {
  if (!broken_.ok()) return broken_;
  while (bytes > 0) {
    const uint64_t n = std::min(bytes, kMaxTransferBytes);
    transport::Sge sge{reinterpret_cast<uint64_t>(local), static_cast<uint32_t>(n), lkey};
    transport::SendWr wr;
    wr.wr_id = kDataWr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = write ? transport::Opcode::kWrite : transport::Opcode::kRead;
    wr.flags = transport::kSignaled;
    wr.remote_addr = region.addr + offset;
    wr.rkey = region.rkey;
    transport::SendWr* bad = nullptr;
    if (absl::Status s = qp_->PostSend(&wr, &bad); !s.ok()) return Broken(s);
    completions_.clear();
    if (absl::Status s = Await(1, absl::Now() + options_.timeout, &completions_); !s.ok()) {
      return s;
    }
    local += n;
    offset += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status Client::Put(const RemoteRegion& region, uint64_t offset, const void* src,
                         uint64_t bytes) {
  if (absl::Status s = CheckRange(region, offset, bytes); !s.ok()) return s;
  auto* from = static_cast<uint8_t*>(const_cast<void*>(src));
  if (const uint32_t lkey = LkeyOf(src, bytes); lkey != 0) {
    return Transfer(true, region, offset, from, lkey, bytes);
  }
  uint8_t* staging = buffers_->data() + kCommandBytes + uint64_t{kCommandSlots} * kReplyBytes;
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(bytes - done, options_.staging_bytes);
    std::memcpy(staging, from + done, n);
    if (absl::Status s = Transfer(true, region, offset + done, staging, buffers_mr_->lkey(), n);
        !s.ok()) {
      return s;
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status Client::Get(const RemoteRegion& region, uint64_t offset, void* dst, uint64_t bytes) {
  if (absl::Status s = CheckRange(region, offset, bytes); !s.ok()) return s;
  auto* to = static_cast<uint8_t*>(dst);
  if (const uint32_t lkey = LkeyOf(dst, bytes); lkey != 0) {
    return Transfer(false, region, offset, to, lkey, bytes);
  }
  uint8_t* staging = buffers_->data() + kCommandBytes + uint64_t{kCommandSlots} * kReplyBytes;
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(bytes - done, options_.staging_bytes);
    if (absl::Status s = Transfer(false, region, offset + done, staging, buffers_mr_->lkey(), n);
        !s.ok()) {
      return s;
    }
    std::memcpy(to + done, staging, n);
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace rmem
