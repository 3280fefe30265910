#include "hopscotch/server.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "hopscotch/hash.h"
#include "transport/cm_channel.h"
#include "transport/control/pending_connections.h"

namespace hopscotch {

using transport::control::HandshakeEvent;
using transport::control::Message;

namespace {

// The largest request is a full upsert message; a hello is a few dozen bytes.
constexpr uint32_t kMaxRequestBytes = kMaxUpsertMessageBytes;

std::vector<uint8_t> Text(std::string_view text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  if (options.max_clients == 0) return absl::InvalidArgumentError("max_clients must be >= 1");
  TableOptions table_options;
  table_options.persistence = options.persistence;
  absl::StatusOr<Table> table =
      Table::Open(options.table, /*writable=*/!options.read_only, table_options);
  if (!table.ok()) return table.status();
  std::unique_ptr<Server> server(new Server(options, *std::move(table)));
  if (absl::Status s = server->Open(); !s.ok()) return s;
  return server;
}

absl::Status Server::Open() {
  absl::StatusOr<transport::DeviceResources> opened =
      transport::OpenDeviceResources(options_.device, /*cq_depth=*/1);
  if (!opened.ok()) return opened.status();
  device_ = std::move(opened->device);
  pd_ = std::move(opened->pd);
  cq_ = std::move(opened->cq);
  // Remote READ only: no client can write a byte of the table (the conformance suite checks
  // that a WRITE into a READ-only region fails on both backends).
  absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> mr = pd_->RegisterMemory(
      const_cast<uint8_t*>(table_.data()), table_.file_bytes(), transport::kRemoteRead);
  if (!mr.ok() && options_.read_only && options_.device.name != "shm") {
    // Linux before 6.2 pins even a READ-only MR for writing (FOLL_FORCE), which a read-only
    // SHARED file mapping refuses (EFAULT). A private mapping registers; pinning it copies each
    // page into anonymous memory (the table's size again, pinned).
    LOG(WARNING) << options_.table << ": registering the read-only shared mapping failed ("
                 << mr.status() << "); mapping it private instead, which this kernel copies "
                 << "into pinned memory (" << table_.file_bytes() << " bytes more)";
    TableOptions table_options;
    table_options.persistence = options_.persistence;
    table_options.private_when_read_only = true;
    absl::StatusOr<Table> table = Table::Open(options_.table, /*writable=*/false, table_options);
    if (!table.ok()) return table.status();
    table_ = *std::move(table);
    mr = pd_->RegisterMemory(const_cast<uint8_t*>(table_.data()), table_.file_bytes(),
                             transport::kRemoteRead);
  }
  if (!mr.ok()) {
    return absl::Status(mr.status().code(), absl::StrFormat("register %s for remote READ: %s",
                                                            options_.table, mr.status().message()));
  }
  mr_ = *std::move(mr);
  transport::control::PendingOptions pending;
  pending.max_pending = options_.max_clients;
  if (options_.connect == transport::ConnectMode::kCm) {
    // A CM handshake pins a PD, CQ, QP and buffers (cm_channel.h): fewer of them at once.
    pending.max_pending = std::min(pending.max_pending, transport::kCmDefaultMaxPending);
  }
  pending.max_payload = kMaxRequestBytes;
  pending.first_message_timeout = kHelloTimeout;
  transport::JoinListenerOptions joins;
  joins.connect = options_.connect;
  joins.address = options_.listen_address;
  joins.port = options_.port;
  joins.pending = pending;
  // Lookup QPs joining by the CM alone (their REQ carries a hop hello) come here.
  joins.on_other_request = [this](std::unique_ptr<transport::CmRequest> request) {
    OnCmLookupRequest(std::move(request));
  };
  absl::StatusOr<transport::JoinListener> listener = transport::JoinListener::Open(*device_, joins);
  if (!listener.ok()) return listener.status();
  connections_ = *std::move(listener);
  return absl::OkStatus();
}

Server::~Server() {
  sessions_.clear();  // QPs before the CQ, PD and device
  cm_lookups_.clear();
  connections_.reset();
}

void Server::Run(const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) Step(absl::Milliseconds(50));
}

void Server::Step(absl::Duration timeout) {
  std::vector<HandshakeEvent> events;
  connections_->Wait(timeout, &events);
  ReapCmLookups();
  for (HandshakeEvent& e : events) {
    if (e.kind != HandshakeEvent::Kind::kMessage) {
      // The set already closed and forgot the connection: the client left (or never joined).
      if (sessions_.erase(e.id) > 0) {
        ++counters_.left;
        VLOG(1) << "client " << e.peer << " left: " << e.status;
      }
      continue;
    }
    const bool joined = sessions_.contains(e.id);
    switch (e.message.type) {
      case kHopHello:
        if (joined) {
          Refuse(e.id, absl::FailedPreconditionError("a second hello on one connection"));
        } else {
          OnHello(e.id, e.message);
        }
        break;
      case kHopUpsert:
        if (!joined) {
          Refuse(e.id, absl::FailedPreconditionError("an upsert before the hello"));
        } else {
          OnUpsert(e.id, e.message);
        }
        break;
      case kHopStatsRequest:
        if (absl::Status s = connections_->Send(e.id, kHopStats, Text(StatsJson()));
            !s.ok() && sessions_.erase(e.id) > 0) {
          ++counters_.left;  // the set closed it
        }
        break;
      default:
        Refuse(e.id, absl::InvalidArgumentError(
                         absl::StrFormat("unknown message type %u", e.message.type)));
    }
  }
}

void Server::Refuse(uint64_t id, const absl::Status& why) {
  ++counters_.refused;
  LOG(WARNING) << "refusing a hop client: " << why;
  (void)connections_->Send(id, kHopError, Text(why.ToString()));
  connections_->Close(id);
  if (sessions_.erase(id) > 0) ++counters_.left;
}

absl::Status Server::CheckRoom() const {
  const size_t joined = sessions_.size() + cm_lookups_.size();
  if (joined >= options_.max_clients) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%u clients joined, the most this server takes (--max_clients)", joined));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<transport::QueuePair>> Server::NewLookupQp() {
  transport::QpConfig config;
  config.type = transport::QpType::kRc;
  config.send_cq = cq_.get();
  config.recv_cq = cq_.get();
  config.max_send_wr = 1;  // the server posts nothing: READs are served by the device alone
  config.max_recv_wr = 1;
  return pd_->CreateQp(config);
}

HopWelcome Server::TableWelcome() const {
  HopWelcome welcome;
  welcome.table_addr = reinterpret_cast<uint64_t>(table_.data());
  welcome.table_rkey = mr_->rkey();
  welcome.table_bytes = table_.file_bytes();
  welcome.home_buckets = table_.home_buckets();
  welcome.hash_seed = table_.seed();
  welcome.shard = table_.sharding().shard;
  welcome.shards = table_.sharding().shards;
  return welcome;
}

void Server::ReapCmLookups() {
  // Lookup QPs joined by the CM leave by disconnecting (or by dying: the kernel disconnects).
  // One that never sends the handshake's last step holds a QP and a client slot until its
  // deadline, like a control connection that never says hello.
  const absl::Time now = absl::Now();
  for (auto it = cm_lookups_.begin(); it != cm_lookups_.end();) {
    if (it->cm->Disconnected()) {
      VLOG(1) << "client " << it->cm->peer() << " left";
      ++counters_.left;
      it = cm_lookups_.erase(it);
    } else if (!it->cm->Established() && now > it->deadline) {
      LOG(WARNING) << "dropping an RDMA-CM lookup join from " << it->cm->peer()
                   << ": its handshake did not finish in " << kHelloTimeout;
      ++counters_.refused;
      it = cm_lookups_.erase(it);
    } else {
      ++it;
    }
  }
}

void Server::OnCmLookupRequest(std::unique_ptr<transport::CmRequest> request) {
  absl::Status s = DecodeCmHello(request->app_data());
  if (s.ok()) {
    ReapCmLookups();  // room a departed client left counts now, not after the next Wait
    // Half-open joins are capped as control handshakes are: the oldest makes way.
    size_t half_open = 0;
    auto oldest = cm_lookups_.end();
    for (auto it = cm_lookups_.begin(); it != cm_lookups_.end(); ++it) {
      if (it->cm->Established()) continue;
      if (half_open++ == 0) oldest = it;
    }
    if (half_open >= transport::kCmDefaultMaxPending) {
      LOG(WARNING) << "evicting the oldest half-open RDMA-CM lookup join (" << half_open
                   << " pending)";
      ++counters_.refused;
      cm_lookups_.erase(oldest);
    }
    s = CheckRoom();
  }
  absl::StatusOr<std::unique_ptr<transport::QueuePair>> qp =
      s.ok() ? NewLookupQp() : absl::StatusOr<std::unique_ptr<transport::QueuePair>>(s);
  absl::StatusOr<std::unique_ptr<transport::CmConnection>> cm =
      qp.ok() ? request->Accept(*device_, **qp, EncodeCmWelcome(TableWelcome()))
              : absl::StatusOr<std::unique_ptr<transport::CmConnection>>(qp.status());
  if (!cm.ok()) {
    // Destroying the request unanswered rejects it (a CM reject carries no reason: the log does).
    ++counters_.refused;
    LOG(WARNING) << "refusing an RDMA-CM lookup join from " << request->peer() << ": "
                 << cm.status();
    return;
  }
  cm_lookups_.push_back(CmLookup{*std::move(qp), *std::move(cm), absl::Now() + kHelloTimeout});
  ++counters_.joins;
}

void Server::OnHello(uint64_t id, const Message& message) {
  absl::StatusOr<HopHello> hello = DecodeHello(message.payload);
  if (!hello.ok()) return Refuse(id, hello.status());
  if (absl::Status s = CheckRoom(); !s.ok()) return Refuse(id, s);
  HopWelcome welcome = TableWelcome();
  std::unique_ptr<transport::QueuePair> lookup_qp;
  if (hello->lookup_qp) {
    absl::StatusOr<std::unique_ptr<transport::QueuePair>> qp = NewLookupQp();
    if (!qp.ok()) return Refuse(id, qp.status());
    transport::ConnectConfig connect;
    connect.remote = hello->qp;
    if (absl::Status s = (*qp)->Connect(connect); !s.ok()) return Refuse(id, s);
    welcome.qp = (*qp)->endpoint();
    lookup_qp = *std::move(qp);
  }
  if (absl::Status s = connections_->Send(id, kHopWelcome, Encode(welcome)); !s.ok()) {
    ++counters_.refused;
    return;  // the set closed the connection
  }
  // Welcomed: the connection stays in the set for the client's whole stay, a session that new
  // connections cannot evict.
  (void)connections_->Establish(id);
  sessions_[id] = Session{std::move(lookup_qp)};
  ++counters_.joins;
}

void Server::OnUpsert(uint64_t id, const Message& message) {
  absl::StatusOr<std::vector<HopUpsert>> upserts = DecodeUpserts(message.payload);
  if (!upserts.ok()) return Refuse(id, upserts.status());
  HopUpserted answer;
  answer.codes.reserve(upserts->size());
  for (const HopUpsert& u : *upserts) {
    absl::Status s;
    if (options_.read_only) {
      s = absl::FailedPreconditionError("read-only server");
    } else if (s = ValidateKey(u.key); s.ok() && !table_.sharding().Holds(u.key)) {
      s = absl::InvalidArgumentError("the key belongs to another shard");
    }
    // Applied before the answer: once acknowledged, the insert is in the file's pages (it
    // survives kill -9 of this process; table.h says what a power failure needs on top).
    if (s.ok()) s = table_.Insert(u.key, u.value);
    if (s.ok()) {
      ++counters_.upserts;
    } else {
      ++counters_.upserts_refused;
    }
    answer.codes.push_back(static_cast<uint32_t>(s.code()));
  }
  if (!connections_->Send(id, kHopUpserted, Encode(answer)).ok() && sessions_.erase(id) > 0) {
    ++counters_.left;
  }
}

std::string Server::StatsJson() const {
  const TableStats& t = table_.stats();
  return absl::StrFormat(
      "{\"uptime_s\":%.3f,\"home_buckets\":%u,\"items\":%u,\"shard\":%u,"
      "\"shards\":%u,\"map_sync\":%s,\"read_only\":%s,\"clients\":%u,\"joins\":%u,"
      "\"refused\":%u,\"left\":%u,\"upserts\":%u,\"upserts_refused\":%u,\"inserts\":%u,"
      "\"updates\":%u,\"updates_in_place\":%u,\"moves\":%u,\"fabric\":%s}",
      absl::ToDoubleSeconds(absl::Now() - started_), table_.home_buckets(), table_.items(),
      table_.sharding().shard, table_.sharding().shards, table_.map_sync() ? "true" : "false",
      options_.read_only ? "true" : "false", clients(), counters_.joins, counters_.refused,
      counters_.left, counters_.upserts, counters_.upserts_refused, t.inserts, t.updates,
      t.updates_in_place, t.moves, device_->counters().ToJson());
}

}  // namespace hopscotch
