#include "rmem/server.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "transport/control/pending_connections.h"
#include "util/round_up.h"
#include "util/take.h"

namespace rmem {

using transport::control::HandshakeEvent;
using transport::control::Message;

namespace {

// One session's slice of the buffers: its receive buffers, then its reply buffers, rounded to a
// page so that no two sessions' registrations share one.
constexpr uint64_t kPageBytes = 4096;
constexpr uint64_t kSessionBytes =
    util::RoundUp(uint64_t{kCommandSlots} * (kCommandBytes + kReplyBytes), kPageBytes);
// A QP's completions at most in flight: a receive and a reply per command slot.
constexpr uint32_t kCompletionsPerSession = 2 * kCommandSlots;
constexpr size_t kPollBatch = 32;
// The serving loop spins on the CQ while commands came within this window, and otherwise blocks
// in the control set's wait (up to kIdleWait: a command arriving then waits up to that long).
constexpr absl::Duration kSpinWindow = absl::Milliseconds(10);
constexpr absl::Duration kIdleWait = absl::Milliseconds(1);
// While spinning, the control connections are served this often.
constexpr absl::Duration kControlInterval = absl::Milliseconds(1);

// wr_id: the session's generation (a completion of a session that is gone is ignored), its
// slot, whether the WR is a reply (send) and the command slot.
constexpr uint64_t WrId(uint32_t generation, uint32_t slot, bool send, uint32_t command_slot) {
  return uint64_t{generation} << 32 | uint64_t{slot} << 8 | uint64_t{send} << 4 | command_slot;
}
constexpr uint32_t kMaxSlots = 1u << 24;  // what WrId's slot field holds
// TCP keepalive on client connections: a silent peer is gone after about 5 s.
constexpr absl::Duration kKeepaliveIdle = absl::Seconds(2);
constexpr absl::Duration kKeepaliveInterval = absl::Seconds(1);
constexpr int kKeepaliveProbes = 3;

bool FileExists(const std::string& path) {
  struct stat st {};
  return !path.empty() && stat(path.c_str(), &st) == 0;
}

}  // namespace

struct Server::Session {
  uint64_t conn = 0;
  uint32_t slot = 0, generation = 0;
  ClientCredential credential;
  // Destroyed last: everything below lives in it.
  std::unique_ptr<transport::ProtectionDomain> pd;
  std::unique_ptr<transport::MemoryRegion> buffers;  // its slice of Server::buffers_
  std::unique_ptr<transport::QueuePair> qp;
  // The regions it may reach, by tag: each registered in pd (remote READ and WRITE).
  absl::flat_hash_map<uint64_t, std::unique_ptr<transport::MemoryRegion>> regions;
  std::vector<WireOp> queued;  // the open transaction's ops
  uint8_t* command(uint32_t i) const {
    return static_cast<uint8_t*>(buffers->addr()) + uint64_t{i} * kCommandBytes;
  }
  uint8_t* reply(uint32_t i) const {
    return static_cast<uint8_t*>(buffers->addr()) + uint64_t{kCommandSlots} * kCommandBytes +
           uint64_t{i} * kReplyBytes;
  }
};

Server::Server(const ServerOptions& options, Pool pool)
    : options_(options), pool_(std::move(pool)) {}

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  if (options.max_clients == 0 || options.max_clients > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_clients %u: want 1..%u", options.max_clients, kMaxSlots));
  }
  absl::StatusOr<Pool> pool;
  if (FileExists(options.pool.path)) {
    pool = Pool::Open(options.pool.path, options.pool_hook);
    if (pool.ok() && options.pool.pool_bytes != 0 &&
        pool->data_bytes() != options.pool.pool_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s holds a pool of %u bytes, not %u (pass 0 to take the file's, or another file)",
          options.pool.path, pool->data_bytes(), options.pool.pool_bytes));
    }
  } else {
    pool = Pool::Create(options.pool);
  }
  if (!pool.ok()) return pool.status();
  pool->set_step_hook(options.pool_hook);
  std::unique_ptr<Server> server(new Server(options, *std::move(pool)));
  if (absl::Status s = server->Open(); !s.ok()) return s;
  return server;
}

absl::Status Server::Open() {
  if (absl::Status s = util::Take(transport::OpenDevice(options_.device), &device_); !s.ok()) {
    return s;
  }
  // Twice what live sessions can have in flight: room for a dropped session's flushed WRs next
  // to its slot's new session.
  cq_depth_ = 2 * uint64_t{kCompletionsPerSession} * options_.max_clients;
  if (absl::Status s = util::Take(device_->CreateCq(static_cast<uint32_t>(cq_depth_)), &cq_);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<transport::SharedMemory> buffers =
      transport::SharedMemory::Allocate(kSessionBytes * options_.max_clients, "rmem-sessions");
  if (!buffers.ok()) return buffers.status();
  buffers_ = std::make_unique<transport::SharedMemory>(*std::move(buffers));
  slots_.resize(options_.max_clients);
  for (size_t slot = options_.max_clients; slot-- > 0;) {
    free_slots_.push_back(static_cast<uint32_t>(slot));
  }
  transport::JoinListenerOptions joins;
  joins.address = options_.listen_address;
  joins.port = options_.port;
  joins.pending.max_pending = options_.max_clients;
  joins.pending.first_message_timeout = kHelloTimeout;
  // A client whose machine died or was cut off sends no FIN: keepalive ends its session, so its
  // queued ops go and it can resume elsewhere.
  joins.keepalive = transport::Keepalive{kKeepaliveIdle, kKeepaliveInterval, kKeepaliveProbes};
  absl::StatusOr<transport::JoinListener> listener = transport::JoinListener::Open(*device_, joins);
  if (!listener.ok()) return listener.status();
  connections_ = *std::move(listener);
  return absl::OkStatus();
}

Server::~Server() {
  sessions_.clear();
  slots_.clear();  // QPs and MRs, then PDs, before the CQ and the device
  connections_.reset();
}

void Server::Run(const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) Step(absl::Milliseconds(50));
}

void Server::Step(absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  absl::Time last_control = absl::InfinitePast();
  absl::Time now = absl::Now();
  do {
    if (PollCommands() > 0) last_command_ = now;
    now = absl::Now();
    const bool spinning = now - last_command_ < kSpinWindow;
    if (!spinning || now - last_control >= kControlInterval) {
      ServeConnections(spinning ? absl::ZeroDuration() : std::min(kIdleWait, end - now));
      last_control = now = absl::Now();
    }
  } while (now < end);
}

void Server::ServeConnections(absl::Duration wait) {
  std::vector<HandshakeEvent> events;
  connections_->Wait(std::max(wait, absl::ZeroDuration()), &events);
  // A command a client sent before it closed (say a txn_go, then kill -9) is served before its
  // departure is: drain what the CQ holds now (at most its depth, so a stream of new commands
  // cannot hold joins and departures back).
  for (uint64_t drained = 0, n = 0; drained < cq_depth_ && (n = PollCommands()) > 0;) {
    drained += n;
  }
  for (HandshakeEvent& e : events) {
    if (e.kind != HandshakeEvent::Kind::kMessage) {
      Drop(e.id, e.status);  // the set already closed and forgot the connection
      continue;
    }
    if (e.message.type == kRmemHello && !sessions_.contains(e.id)) {
      OnHello(e.id, e.message);
    } else {
      // Commands travel on the QP: anything more on this connection is a protocol violation.
      Refuse(e.id, absl::InvalidArgumentError(absl::StrFormat(
                       "unexpected message type %u on the control connection", e.message.type)));
    }
  }
}

void Server::Refuse(uint64_t conn, const absl::Status& why) {
  ++counters_.refused;
  LOG(WARNING) << "refusing an rmem client: " << why;
  (void)connections_->Send(conn, kRmemError, EncodeError(why));
  connections_->Close(conn);
  Drop(conn, why);
}

void Server::Drop(uint64_t conn, const absl::Status& why) {
  auto it = sessions_.find(conn);
  if (it == sessions_.end()) return;
  const uint32_t slot = it->second;
  sessions_.erase(it);
  Session& s = *slots_[slot];
  VLOG(1) << "client " << s.credential.id << " left: " << why;
  ++counters_.left;
  counters_.ops_discarded += s.queued.size();
  connected_.erase(s.credential.id);
  connections_->Close(conn);
  slots_[slot].reset();
  free_slots_.push_back(slot);
}

absl::StatusOr<std::unique_ptr<Server::Session>> Server::NewSession(uint32_t slot) {
  auto s = std::make_unique<Session>();
  s->slot = slot;
  s->generation = next_generation_++;
  if (absl::Status st = util::Take(device_->AllocatePd(), &s->pd); !st.ok()) return st;
  // A slot's buffers may hold its last session's commands: none of it reaches the next one.
  std::memset(buffers_->data() + slot * kSessionBytes, 0, kSessionBytes);
  if (absl::Status st = util::Take(s->pd->RegisterMemory(buffers_->data() + slot * kSessionBytes,
                                                         kSessionBytes, transport::kLocalWrite),
                                   &s->buffers);
      !st.ok()) {
    return st;
  }
  transport::QpConfig config;
  config.type = transport::QpType::kRc;
  config.send_cq = cq_.get();
  config.recv_cq = cq_.get();
  config.max_send_wr = kCommandSlots;
  config.max_recv_wr = kCommandSlots;
  if (absl::Status st = util::Take(s->pd->CreateQp(config), &s->qp); !st.ok()) return st;
  return s;
}

void Server::OnHello(uint64_t conn, const Message& message) {
  absl::StatusOr<RmemHello> hello = DecodeHello(message.payload);
  if (!hello.ok()) return Refuse(conn, hello.status());
  if (free_slots_.empty()) {
    return Refuse(conn, absl::ResourceExhaustedError(absl::StrFormat(
                            "%u clients joined, the most this server takes (--max_clients)",
                            sessions_.size())));
  }
  const bool resume = hello->resume.id != 0;
  uint64_t last_txn = 0;
  if (resume) {
    // The credential first: without the secret, a peer learns nothing (not even whether the
    // client is connected).
    absl::StatusOr<uint64_t> last = pool_.Authenticate(hello->resume);
    if (!last.ok()) return Refuse(conn, last.status());
    if (connected_.contains(hello->resume.id)) {
      return Refuse(conn, absl::FailedPreconditionError(
                              absl::StrFormat("client %u is connected already", hello->resume.id)));
    }
    last_txn = *last;
  }
  const uint32_t slot = free_slots_.back();
  absl::StatusOr<std::unique_ptr<Session>> session = NewSession(slot);
  if (!session.ok()) return Refuse(conn, session.status());
  Session& s = **session;
  transport::ConnectConfig connect;
  connect.remote = hello->qp;
  // A client keeps a receive posted for every reply it is owed (it has kCommandSlots and one
  // command outstanding). One that does not loses its session at once: with retries, a reply
  // would wait for its receive, on the shm fabric inside this thread's PostSend (every client
  // stalled), on a NIC holding this session's send queue.
  connect.rnr_retry = 0;
  if (absl::Status st = s.qp->Connect(connect); !st.ok()) return Refuse(conn, st);
  for (uint32_t i = 0; i < kCommandSlots; ++i) {
    if (absl::Status st = PostReceive(s, i); !st.ok()) return Refuse(conn, st);
  }
  if (resume) {
    s.credential = hello->resume;
  } else {
    absl::StatusOr<ClientCredential> credential =
        pool_.RegisterClient([this](uint64_t id) { return !connected_.contains(id); });
    if (!credential.ok()) return Refuse(conn, credential.status());
    s.credential = *credential;
  }
  RmemWelcome welcome;
  welcome.qp = s.qp->endpoint();
  welcome.credential = s.credential;
  welcome.resumed = resume;
  welcome.last_txn = last_txn;
  welcome.pool_bytes = pool_.data_bytes();
  welcome.max_ops = pool_.max_ops();
  if (!connections_->Send(conn, kRmemWelcome, Encode(welcome)).ok()) {
    ++counters_.refused;  // the set closed the connection; a new identity stays in the pool
    return;
  }
  (void)connections_->Establish(conn);
  s.conn = conn;
  free_slots_.pop_back();
  connected_.insert(s.credential.id);
  sessions_[conn] = slot;
  slots_[slot] = *std::move(session);
  ++(resume ? counters_.resumes : counters_.joins);
}

absl::Status Server::PostReceive(Session& s, uint32_t i) {
  transport::Sge sge{reinterpret_cast<uint64_t>(s.command(i)), kCommandBytes, s.buffers->lkey()};
  transport::RecvWr wr;
  wr.wr_id = WrId(s.generation, s.slot, /*send=*/false, i);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  transport::RecvWr* bad = nullptr;
  return s.qp->PostRecv(&wr, &bad);
}

size_t Server::PollCommands() {
  std::array<transport::Completion, kPollBatch> completions;
  const size_t n = cq_->Poll(absl::MakeSpan(completions));
  for (size_t i = 0; i < n; ++i) {
    const transport::Completion& c = completions[i];
    const uint32_t slot = static_cast<uint32_t>(c.wr_id >> 8) & (kMaxSlots - 1);
    const uint32_t generation = static_cast<uint32_t>(c.wr_id >> 32);
    const bool send = (c.wr_id >> 4) & 1;
    const uint32_t command_slot = c.wr_id & 0xf;
    if (slot >= slots_.size() || slots_[slot] == nullptr ||
        slots_[slot]->generation != generation) {
      continue;  // a session that is gone (its QP's flushed WRs)
    }
    Session& s = *slots_[slot];
    if (c.status != transport::CompletionStatus::kSuccess) {
      // The client's QP broke (it died, or sent what its QP could not take): it may reconnect.
      Drop(s.conn, absl::UnavailableError(absl::StrFormat("its QP failed (completion status %d)",
                                                          static_cast<int>(c.status))));
      continue;
    }
    if (!send && c.opcode != transport::CompletionOpcode::kRecv) {
      // A WRITE_WITH_IMM (or SEND_WITH_IMM) took a receive: no command was written into its
      // buffer, so there is nothing to serve; a client that does this breaks the protocol.
      Drop(s.conn, absl::InvalidArgumentError("a receive consumed by a message with immediate"));
      continue;
    }
    if (send) {
      // The reply left: its command slot takes the next command.
      if (absl::Status st = PostReceive(s, command_slot); !st.ok()) Drop(s.conn, st);
    } else {
      OnCommand(s, command_slot, c.byte_len);
    }
  }
  return n;
}

void Server::OnCommand(Session& s, uint32_t slot, uint32_t bytes) {
  ReplyHeader reply{};
  if (bytes >= sizeof(CommandHeader)) {
    // Even a refused command's reply names it, so the client can match it.
    CommandHeader raw;
    std::memcpy(&raw, s.command(slot), sizeof(raw));
    reply.kind = raw.kind;
    reply.seq = raw.seq;
  }
  absl::StatusOr<CommandHeader> header = DecodeCommand(s.command(slot), bytes, &s.queued);
  absl::Status status;
  if (!header.ok()) {
    status = header.status();
  } else {
    reply.kind = header->kind;
    reply.seq = header->seq;
    if (s.queued.size() > pool_.max_ops()) {
      status = absl::ResourceExhaustedError(absl::StrFormat(
          "%u ops queued, at most %u per transaction", s.queued.size(), pool_.max_ops()));
    }
    switch (status.ok() ? static_cast<CommandKind>(header->kind) : CommandKind::kQueue) {
      case CommandKind::kAlloc:
        status = Alloc(s, header->a, header->b, &reply);
        break;
      case CommandKind::kQueue:
        reply.a = s.queued.size();
        break;
      case CommandKind::kTxnGo: {
        absl::StatusOr<CommitResult> done = TxnGo(s, header->a);
        status = done.status();
        if (done.ok()) {
          reply.a = done->bytes_copied;
          reply.d = done->freed;
          reply.e = done->duplicate ? 1 : 0;
          ++(done->duplicate ? counters_.duplicates : counters_.commits);
        }
        reply.b = header->a;
        s.queued.clear();  // the transaction is over, applied or not
        break;
      }
      case CommandKind::kForget:
        status = pool_.ForgetClient(s.credential);
        counters_.ops_discarded += s.queued.size();
        s.queued.clear();  // no transaction of a forgotten client can follow
        break;
    }
  }
  if (!status.ok()) {
    ++counters_.commands_refused;
    // A refusal ends the open transaction: its ops are discarded.
    counters_.ops_discarded += s.queued.size();
    s.queued.clear();
  }
  Reply(s, slot, reply, status);
}

absl::Status Server::Alloc(Session& s, uint64_t bytes, uint64_t tag, ReplyHeader* reply) {
  absl::StatusOr<Region> region = pool_.Alloc(bytes, tag);
  if (!region.ok()) return region.status();
  auto& mr = s.regions[tag];
  if (mr == nullptr) {
    // Registered in this client's PD only: no other client's QP can reach it through this MR.
    absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> registered = s.pd->RegisterMemory(
        pool_.data() + region->offset, region->bytes,
        transport::kLocalWrite | transport::kRemoteWrite | transport::kRemoteRead);
    if (!registered.ok()) {
      s.regions.erase(tag);
      // The region stays allocated (tied to its tag): a retried alloc finds it.
      return registered.status();
    }
    mr = *std::move(registered);
  }
  ++counters_.allocs;
  reply->a = reinterpret_cast<uint64_t>(mr->addr());
  reply->b = region->bytes;
  reply->c = tag;
  reply->d = mr->rkey();
  return absl::OkStatus();
}

absl::StatusOr<Txn> Server::Translate(const Session& s, uint64_t txn_id) const {
  Txn txn;
  txn.client_id = s.credential.id;
  txn.txn_id = txn_id;
  txn.ops.reserve(s.queued.size());
  // The region tied to `tag`, if this client may reach it.
  auto owned = [&](uint64_t tag, size_t i) -> absl::StatusOr<Region> {
    std::optional<Region> r = pool_.FindTag(tag);
    if (!s.regions.contains(tag) || !r.has_value()) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "op %u names tag %u: no region of this client's (allocate or be granted it first)", i,
          tag));
    }
    return *r;
  };
  for (size_t i = 0; i < s.queued.size(); ++i) {
    const WireOp& op = s.queued[i];
    absl::StatusOr<Region> src = owned(op.src_tag, i);
    if (!src.ok()) return src.status();
    if (static_cast<WireOpKind>(op.kind) == WireOpKind::kFree) {
      txn.ops.push_back(TxnOp{OpKind::kFree, 0, 0, 0, src->id, src->tag});
      continue;
    }
    absl::StatusOr<Region> dst = owned(op.dst_tag, i);
    if (!dst.ok()) return dst.status();
    // 64-bit and no sum that can wrap: every field is the peer's.
    if (op.bytes == 0 || op.bytes > src->bytes || op.src_offset > src->bytes - op.bytes ||
        op.bytes > dst->bytes || op.dst_offset > dst->bytes - op.bytes) {
      return absl::OutOfRangeError(absl::StrFormat(
          "op %u: a copy of %u bytes from %u of tag %u (%u bytes) to %u of tag %u (%u bytes) "
          "leaves a region",
          i, op.bytes, op.src_offset, op.src_tag, src->bytes, op.dst_offset, op.dst_tag,
          dst->bytes));
    }
    txn.ops.push_back(
        TxnOp{OpKind::kCopy, src->offset + op.src_offset, dst->offset + op.dst_offset, op.bytes});
  }
  return txn;
}

absl::StatusOr<CommitResult> Server::TxnGo(Session& s, uint64_t txn_id) {
  // Ids first (a retry is answered as before, whatever is queued now), then this client's rights.
  if (std::optional<absl::StatusOr<CommitResult>> answer =
          pool_.Answered(s.credential.id, txn_id)) {
    return *std::move(answer);
  }
  absl::StatusOr<Txn> txn = Translate(s, txn_id);
  if (!txn.ok()) {
    pool_.Refuse(s.credential.id, txn_id, txn.status().code());  // a retry gets the same answer
    return txn.status();
  }
  absl::StatusOr<CommitResult> done = pool_.Commit(*txn);
  if (!done.ok() || done->duplicate) return done;
  // Freed regions become unreachable before the reply: their MRs go from every client's PD.
  for (const TxnOp& op : txn->ops) {
    if (op.kind != OpKind::kFree) continue;
    for (auto& [conn, slot] : sessions_) slots_[slot]->regions.erase(op.tag);
  }
  return done;
}

void Server::Reply(Session& s, uint32_t slot, const ReplyHeader& header,
                   const absl::Status& status) {
  const uint32_t length = EncodeReply(header, status, s.reply(slot));
  transport::Sge sge{reinterpret_cast<uint64_t>(s.reply(slot)), length, s.buffers->lkey()};
  transport::SendWr wr;
  wr.wr_id = WrId(s.generation, s.slot, /*send=*/true, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = transport::Opcode::kSend;
  wr.flags = transport::kSignaled;
  transport::SendWr* bad = nullptr;
  if (absl::Status st = s.qp->PostSend(&wr, &bad); !st.ok()) Drop(s.conn, st);
}

std::string Server::StatsJson() const {
  const PoolStats& p = pool_.stats();
  return absl::StrFormat(
      "{\"uptime_s\":%.3f,\"pool_bytes\":%u,\"regions\":%u,\"allocated_bytes\":%u,"
      "\"replayed\":%s,\"clients\":%u,\"joins\":%u,\"resumes\":%u,\"refused\":%u,\"left\":%u,"
      "\"allocs\":%u,\"commits\":%u,\"duplicates\":%u,\"commands_refused\":%u,"
      "\"ops_discarded\":%u,\"fabric\":%s}",
      absl::ToDoubleSeconds(absl::Now() - started_), pool_.data_bytes(), p.regions,
      p.allocated_bytes, p.replayed ? "true" : "false", sessions_.size(), counters_.joins,
      counters_.resumes, counters_.refused, counters_.left, counters_.allocs, counters_.commits,
      counters_.duplicates, counters_.commands_refused, counters_.ops_discarded,
      device_->counters().ToJson());
}

}  // namespace rmem
