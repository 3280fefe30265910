#include "transport/cm_channel.h"

#include <poll.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace transport {
namespace {

// Waiting for a message (a client's Receive) or for anything (the server's Wait) polls in slices:
// CQs here have no completion channel. The control plane is not a hot path; these keep a join
// within a few milliseconds while costing an idle server ~1,000 cheap wake-ups a second.
constexpr absl::Duration kReceiveSlice = absl::Microseconds(100);
constexpr absl::Duration kWaitSlice = absl::Milliseconds(1);
// How long a closed connection is kept for its last reply (an error message) to complete.
constexpr absl::Duration kCloseLinger = absl::Seconds(1);
constexpr uint64_t kReceiveTag = uint64_t{1} << 32;
constexpr uint64_t kSendTag = uint64_t{2} << 32;
constexpr uint32_t kCompletionBatch = 8;

}  // namespace

// Declared so that destruction (reverse order) disconnects first, then takes the QP before the
// memory, CQ and PD it uses.
struct CmChannel::State {
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<SharedMemory> memory;  // [receive slots][send slots] x kCmMaxMessageBytes
  std::unique_ptr<MemoryRegion> mr;
  std::unique_ptr<QueuePair> qp;
  std::unique_ptr<CmConnection> connection;
  bool send_busy[kCmSendSlots] = {};
  // Received messages not yet taken, in arrival order: (receive slot, bytes). A slot is posted
  // again only once its message is taken, so a peer can have at most kCmReceiveSlots messages
  // here and then waits in RNR: however much it sends, this side holds no more.
  std::deque<std::pair<uint32_t, uint32_t>> ready;
  absl::Status broken;  // the first failure; the link is unusable after it

  uint8_t* slot(uint32_t index) const {
    return memory->data() + uint64_t{index} * kCmMaxMessageBytes;
  }
};

absl::Status CmChannel::CreateResources(Device& device) {
  if (device.name() == "shm") {
    return absl::UnimplementedError(
        "RDMA-CM joins need a verbs device (--fabric=verbs --device=...); the shm fabric joins "
        "over TCP (--connect=tcp)");
  }
  state_ = std::make_unique<State>();
  State& s = *state_;
  absl::StatusOr<std::unique_ptr<ProtectionDomain>> pd = device.AllocatePd();
  if (!pd.ok()) return pd.status();
  s.pd = *std::move(pd);
  absl::StatusOr<std::unique_ptr<CompletionQueue>> cq =
      device.CreateCq(kCmReceiveSlots + kCmSendSlots);
  if (!cq.ok()) return cq.status();
  s.cq = *std::move(cq);
  absl::StatusOr<SharedMemory> memory = SharedMemory::Allocate(
      uint64_t{kCmReceiveSlots + kCmSendSlots} * kCmMaxMessageBytes, "herd-cm-control");
  if (!memory.ok()) return memory.status();
  s.memory = std::make_unique<SharedMemory>(*std::move(memory));
  absl::StatusOr<std::unique_ptr<MemoryRegion>> mr =
      s.pd->RegisterMemory(s.memory->data(), s.memory->size(), kLocalWrite);
  if (!mr.ok()) return mr.status();
  s.mr = *std::move(mr);
  QpConfig config;
  config.type = QpType::kRc;
  config.send_cq = s.cq.get();
  config.recv_cq = s.cq.get();
  config.max_send_wr = kCmSendSlots;
  config.max_recv_wr = kCmReceiveSlots;
  config.max_inline_data = 0;
  absl::StatusOr<std::unique_ptr<QueuePair>> qp = s.pd->CreateQp(config);
  if (!qp.ok()) return qp.status();
  s.qp = *std::move(qp);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CmChannel>> CmChannel::Connect(Device& device,
                                                              std::string_view host_port,
                                                              absl::Duration timeout) {
  std::string host;
  uint16_t port = 0;
  if (absl::Status s = ParseCmAddress(host_port, &host, &port); !s.ok()) return s;
  std::unique_ptr<CmChannel> channel(new CmChannel());
  if (absl::Status s = channel->CreateResources(device); !s.ok()) return s;
  State& s = *channel->state_;
  absl::StatusOr<std::unique_ptr<CmConnection>> connection =
      CmConnect(device, *s.qp, host, port, timeout);
  if (!connection.ok()) return connection.status();
  s.connection = *std::move(connection);
  channel->peer_ = std::string(host_port);
  for (uint32_t i = 0; i < kCmReceiveSlots; ++i) {
    if (absl::Status st = channel->PostReceive(i); !st.ok()) return st;
  }
  return channel;
}

absl::StatusOr<std::unique_ptr<CmChannel>> CmChannel::Accept(Device& device, CmRequest& request) {
  std::unique_ptr<CmChannel> channel(new CmChannel());
  channel->peer_ = request.peer();
  if (absl::Status s = channel->CreateResources(device); !s.ok()) return s;
  State& s = *channel->state_;
  absl::StatusOr<std::unique_ptr<CmConnection>> connection = request.Accept(device, *s.qp);
  if (!connection.ok()) return connection.status();
  s.connection = *std::move(connection);
  // A message that arrives before these are posted waits at the sender (RNR retries).
  for (uint32_t i = 0; i < kCmReceiveSlots; ++i) {
    if (absl::Status st = channel->PostReceive(i); !st.ok()) return st;
  }
  return channel;
}

CmChannel::~CmChannel() = default;

absl::Status CmChannel::PostReceive(uint32_t slot) {
  State& s = *state_;
  Sge sge{reinterpret_cast<uint64_t>(s.slot(slot)), kCmMaxMessageBytes, s.mr->lkey()};
  RecvWr wr;
  wr.wr_id = kReceiveTag | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  RecvWr* bad = nullptr;
  return s.qp->PostRecv(&wr, &bad);
}

void CmChannel::Reap() const {
  State& s = *state_;
  Completion completions[kCompletionBatch];
  for (;;) {
    const size_t n = s.cq->Poll(absl::MakeSpan(completions));
    for (size_t i = 0; i < n; ++i) {
      const Completion& c = completions[i];
      const uint32_t slot = static_cast<uint32_t>(c.wr_id);
      if (c.status != CompletionStatus::kSuccess) {
        if (s.broken.ok()) {
          s.broken = absl::UnavailableError(
              absl::StrFormat("RDMA-CM control connection with %s failed (completion status %d)",
                              peer_, static_cast<int>(c.status)));
        }
        continue;
      }
      if ((c.wr_id & kSendTag) != 0) {
        if (slot < kCmSendSlots) s.send_busy[slot] = false;
        continue;
      }
      if (slot >= kCmReceiveSlots || !s.broken.ok()) continue;
      const uint8_t* bytes = s.slot(slot);
      uint32_t magic = 0;
      uint16_t zero = 0;
      if (c.byte_len >= kCmHeaderBytes) {
        std::memcpy(&magic, bytes, 4);
        std::memcpy(&zero, bytes + 6, 2);
      }
      if (c.byte_len < kCmHeaderBytes || magic != kCmMagic || zero != 0) {
        s.broken = absl::DataLossError(absl::StrFormat(
            "a %d-byte RDMA-CM control message from %s is not a herd message (magic 0x%08x)",
            c.byte_len, peer_, magic));
        continue;
      }
      s.ready.emplace_back(slot, c.byte_len);
    }
    if (n < kCompletionBatch) return;
  }
}

absl::Status CmChannel::Send(uint16_t type, const std::vector<uint8_t>& payload) {
  State& s = *state_;
  Reap();
  if (!s.broken.ok()) return s.broken;
  if (payload.size() > kCmMaxMessageBytes - kCmHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a control message of %d bytes, past the RDMA-CM limit of %d",
                        payload.size(), kCmMaxMessageBytes - kCmHeaderBytes));
  }
  uint32_t slot = 0;
  while (slot < kCmSendSlots && s.send_busy[slot]) ++slot;
  if (slot == kCmSendSlots) {
    return absl::UnavailableError(absl::StrFormat(
        "%s takes no control messages (%d sends still in flight)", peer_, kCmSendSlots));
  }
  uint8_t* bytes = s.slot(kCmReceiveSlots + slot);
  const uint16_t zero = 0;
  std::memcpy(bytes, &kCmMagic, 4);
  std::memcpy(bytes + 4, &type, 2);
  std::memcpy(bytes + 6, &zero, 2);
  if (!payload.empty()) std::memcpy(bytes + kCmHeaderBytes, payload.data(), payload.size());
  Sge sge{reinterpret_cast<uint64_t>(bytes), static_cast<uint32_t>(kCmHeaderBytes + payload.size()),
          s.mr->lkey()};
  SendWr wr;
  wr.wr_id = kSendTag | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = Opcode::kSend;
  wr.flags = kSignaled;
  SendWr* bad = nullptr;
  if (absl::Status st = s.qp->PostSend(&wr, &bad); !st.ok()) return st;
  s.send_busy[slot] = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> CmChannel::TryReceive(control::Message* message) {
  State& s = *state_;
  // Disconnected before reaping: a message that arrived before the peer's DREQ is delivered
  // (a server's last reply and then its disconnect arrive microseconds apart).
  const bool gone = s.connection->Disconnected();
  Reap();
  if (!s.ready.empty()) {
    const auto [slot, length] = s.ready.front();
    s.ready.pop_front();
    const uint8_t* bytes = s.slot(slot);
    message->type = 0;
    std::memcpy(&message->type, bytes + 4, 2);
    message->payload.assign(bytes + kCmHeaderBytes, bytes + length);
    // The bytes are copied out: the slot can take the next message.
    if (absl::Status st = PostReceive(slot); !st.ok() && s.broken.ok()) s.broken = st;
    return true;
  }
  if (!s.broken.ok()) return s.broken;
  if (gone) return absl::UnavailableError(absl::StrFormat("%s disconnected", peer_));
  return false;
}

bool CmChannel::Disconnected() const {
  return state_->broken.ok() && state_->connection->Disconnected();
}

absl::StatusOr<control::Message> CmChannel::Receive(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    control::Message message;
    absl::StatusOr<bool> got = TryReceive(&message);
    if (!got.ok()) return got.status();
    if (*got) return message;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat("no control message from %s within %s",
                                                         peer_, absl::FormatDuration(timeout)));
    }
    absl::SleepFor(kReceiveSlice);
  }
}

bool CmChannel::PeerClosed() const {
  const bool gone = state_->connection->Disconnected();
  Reap();
  return gone || !state_->broken.ok();
}

bool CmChannel::SendsDone() const {
  Reap();
  if (!state_->broken.ok()) return true;  // nothing more will complete
  return std::none_of(std::begin(state_->send_busy), std::end(state_->send_busy),
                      [](bool busy) { return busy; });
}

absl::StatusOr<std::unique_ptr<CmHandshakes>> CmHandshakes::Create(
    Device& device, std::string_view address, uint16_t port, control::PendingOptions options) {
  if (device.name() == "shm") {
    return absl::UnimplementedError(
        "RDMA-CM joins need a verbs device (--fabric=verbs --device=...); the shm fabric joins "
        "over TCP (--connect=tcp)");
  }
  if (options.max_pending == 0) {
    return absl::InvalidArgumentError("RDMA-CM joins: max_pending must be at least 1");
  }
  if (options.first_message_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("RDMA-CM joins: first_message_timeout must be positive");
  }
  absl::StatusOr<std::unique_ptr<CmListener>> listener = CmListener::Listen(address, port);
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<CmHandshakes>(new CmHandshakes(device, *std::move(listener), options));
}

CmHandshakes::~CmHandshakes() = default;

void CmHandshakes::Drop(uint64_t id, control::HandshakeEvent::Kind kind, absl::Status status,
                        std::vector<control::HandshakeEvent>* events) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  control::HandshakeEvent event;
  event.id = id;
  event.kind = kind;
  event.status = std::move(status);
  event.peer = it->second.channel->peer_name();
  events->push_back(std::move(event));
  pending_.erase(it);
}

void CmHandshakes::ReapClosing(bool all) {
  const absl::Time now = absl::Now();
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (all || it->first <= now || it->second->SendsDone()) {
      it = closing_.erase(it);
    } else {
      ++it;
    }
  }
}

bool CmHandshakes::Step(std::vector<control::HandshakeEvent>* events) {
  using Kind = control::HandshakeEvent::Kind;
  ReapClosing(false);
  bool progress = false;
  for (uint32_t accepted = 0; accepted < kCmAcceptsPerStep; ++accepted) {
    absl::StatusOr<std::unique_ptr<CmRequest>> request = listener_->NextRequest();
    if (!request.ok()) {
      LOG_EVERY_N(WARNING, 100) << "RDMA-CM listener: " << request.status();
      break;
    }
    if (*request == nullptr) break;
    progress = true;
    if (!(*request)->app_data().empty()) {
      if (other_request_) {
        other_request_(*std::move(request));
      } else {
        LOG_EVERY_N(WARNING, 100) << "RDMA-CM: refusing " << (*request)->peer()
                                  << ": its request carries bytes no control channel sends";
      }
      continue;  // destroying an unanswered request rejects it
    }
    const uint64_t id = next_id_++;
    absl::StatusOr<std::unique_ptr<CmChannel>> channel = CmChannel::Accept(device_, **request);
    if (!channel.ok()) {
      control::HandshakeEvent event;
      event.id = id;
      event.kind = Kind::kError;
      event.status = channel.status();
      event.peer = (*request)->peer();
      events->push_back(std::move(event));
      continue;  // destroying the request rejects it (when it is still unanswered)
    }
    // Only a join that did get in displaces the oldest (sessions served from the set neither
    // count nor go).
    size_t handshaking = 0;
    auto oldest = pending_.end();
    for (auto p = pending_.begin(); p != pending_.end(); ++p) {
      if (p->second.established) continue;
      if (handshaking++ == 0) oldest = p;
    }
    if (handshaking >= options_.max_pending) {
      Drop(oldest->first, Kind::kEvicted,
           absl::ResourceExhaustedError(absl::StrFormat(
               "evicted: %d handshakes pending, the most allowed", options_.max_pending)),
           events);
    }
    pending_[id] = Pending{*std::move(channel), absl::Now() + options_.first_message_timeout};
  }
  const absl::Time now = absl::Now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    const uint64_t id = it->first;
    Pending& p = (it++)->second;  // Drop may erase the current entry
    control::Message message;
    absl::StatusOr<bool> got = p.channel->TryReceive(&message);
    if (!got.ok()) {
      // A disconnect is a close; a malformed message or a failed link an error.
      const Kind kind = p.channel->Disconnected() ? Kind::kClosed : Kind::kError;
      Drop(id, kind, got.status(), events);
      progress = true;
    } else if (*got) {
      control::HandshakeEvent event;
      event.id = id;
      event.kind = Kind::kMessage;
      event.message = std::move(message);
      event.peer = p.channel->peer_name();
      events->push_back(std::move(event));
      progress = true;
    } else if (p.deadline <= now) {
      Drop(id, Kind::kTimedOut,
           absl::DeadlineExceededError("the handshake's next message did not come in time"),
           events);
      progress = true;
    }
  }
  return progress;
}

void CmHandshakes::Wait(absl::Duration timeout, std::vector<control::HandshakeEvent>* events) {
  events->clear();
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    Step(events);
    if (!events->empty()) return;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return;
    // Sleeps on the listener (a request wakes it) for at most a slice: pending connections'
    // messages arrive in their CQs, which are polled each Step.
    pollfd p{listener_->fd(), POLLIN, 0};
    const timespec slice = absl::ToTimespec(std::min(left, kWaitSlice));
    ppoll(&p, 1, &slice, nullptr);
  }
}

absl::Status CmHandshakes::Send(uint64_t id, uint16_t type, const std::vector<uint8_t>& payload) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return absl::NotFoundError(absl::StrFormat("no pending join %d", id));
  absl::Status sent = it->second.channel->Send(type, payload);
  if (!sent.ok()) pending_.erase(it);
  return sent;
}

absl::Status CmHandshakes::SetDeadline(uint64_t id, absl::Time deadline) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return absl::NotFoundError(absl::StrFormat("no pending join %d", id));
  it->second.deadline = deadline;
  return absl::OkStatus();
}

absl::Status CmHandshakes::Establish(uint64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return absl::NotFoundError(absl::StrFormat("no pending join %d", id));
  it->second.established = true;
  it->second.deadline = absl::InfiniteFuture();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<control::MessageChannel>> CmHandshakes::ReleaseChannel(uint64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return absl::NotFoundError(absl::StrFormat("no pending join %d", id));
  std::unique_ptr<control::MessageChannel> channel = std::move(it->second.channel);
  pending_.erase(it);
  return channel;  // messages it already received stay queued in it
}

void CmHandshakes::Close(uint64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  std::unique_ptr<CmChannel> channel = std::move(it->second.channel);
  pending_.erase(it);
  if (channel->SendsDone()) return;
  // Bounded like the pending set: past it, the oldest closing connection goes at once.
  if (closing_.size() >= options_.max_pending) closing_.pop_front();
  closing_.emplace_back(absl::Now() + kCloseLinger, std::move(channel));
}

absl::StatusOr<std::unique_ptr<control::MessageChannel>> ConnectControl(ConnectMode mode,
                                                                        Device* device,
                                                                        std::string_view host_port,
                                                                        absl::Duration timeout) {
  if (mode == ConnectMode::kCm) {
    if (device == nullptr) return absl::InvalidArgumentError("RDMA-CM joins need a device");
    absl::StatusOr<std::unique_ptr<CmChannel>> channel =
        CmChannel::Connect(*device, host_port, timeout);
    if (!channel.ok()) return channel.status();
    return std::unique_ptr<control::MessageChannel>(*std::move(channel));
  }
  absl::StatusOr<control::Channel> channel = control::Channel::Connect(host_port, timeout);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<control::MessageChannel>(
      std::make_unique<control::Channel>(*std::move(channel)));
}

}  // namespace transport
