#include "herd/server.h"

#include <algorithm>
#include <array>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "herd/join.h"
#include "herd/server_session.h"
#include "mica/partition.h"
#include "transport/cm_channel.h"
#include "transport/control/wire.h"
#include "util/take.h"

namespace herd {
namespace {

using util::Take;

using transport::control::PendingConnections;

// The item the start-up layout line counts capacity in: HERD's 16 B keys and 32 B values.
constexpr uint32_t kDescribedKeyBytes = 16;
constexpr uint32_t kDescribedValueBytes = 32;

// How often the control thread looks for departed clients while waiting for new ones.
constexpr absl::Duration kControlPollInterval = absl::Milliseconds(20);
// A joining client has this long to send each handshake message (its connection waits in the
// pending set meanwhile, blocking nobody).
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);
// Largest handshake message the server reads: a Join is a few endpoints per worker (under
// 100 bytes each, kMaxWorkers of them per list), far below this.
constexpr uint32_t kMaxHandshakeBytes = 256 << 10;
// Completion queue entries per worker beyond its UD queues' signalled sends: error completions
// of session queues (every failed WR completes).
constexpr uint32_t kSendCqSlack = 4096;
// The fence sink's receives (Worker::RequestFence: at most one fence per UD queue per idle
// loop, and the control thread gives them back every pass), each room for a GRH and nothing.
constexpr uint32_t kFenceReceives = 64;
constexpr uint32_t kFenceReceiveBytes = 64;
static_assert(kFenceReceiveBytes >= transport::kGrhBytes);

// Over RDMA-CM a message is one RC SEND of at most kCmMaxMessageBytes: the largest Welcome this
// configuration sends (every endpoint list full) must fit, or no client could ever join.
absl::Status CheckWelcomeFitsCm(const Config& c) {
  Welcome largest;
  largest.worker_ud.resize(c.workers);
  largest.worker_response_qpns.resize(uint64_t{c.workers} * c.ud_qps_per_worker);
  largest.request_qps.resize(c.workers);
  largest.response_qps.resize(c.workers);
  largest.large_qps.resize(c.workers);
  const uint64_t bytes = Encode(largest).size();
  if (bytes + transport::kCmHeaderBytes > transport::kCmMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--connect=cm: a join's welcome for --workers=%d x --ud_qps_per_worker=%d is %d bytes, "
        "past the RDMA-CM message limit of %d; use fewer workers or UD QPs, or --connect=tcp",
        c.workers, c.ud_qps_per_worker, bytes,
        transport::kCmMaxMessageBytes - transport::kCmHeaderBytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  // A TCP port is bound first (before the device and the memory), as a user's first mistake is
  // a port in use; an RDMA-CM listener needs the device and is made in Init.
  std::unique_ptr<transport::control::Listener> listener;
  if (options.connect == transport::ConnectMode::kTcp) {
    absl::StatusOr<transport::control::Listener> tcp =
        transport::control::Listener::Listen(options.listen_address, options.port);
    if (!tcp.ok()) return tcp.status();
    listener = std::make_unique<transport::control::Listener>(*std::move(tcp));
  }
  std::unique_ptr<Server> server(new Server(options, std::move(listener)));
  if (absl::Status s = server->Init(); !s.ok()) return s;
  return server;
}

absl::Status Server::Init() {
  const Config& c = options_.config;
  if (absl::Status s = Take(transport::OpenDevice(options_.device), &device_); !s.ok()) return s;
  if (absl::Status s = Validate(c, device_->port().active_mtu); !s.ok()) return s;
  if (options_.connect == transport::ConnectMode::kCm && device_->name() == "shm") {
    return absl::InvalidArgumentError(
        "--connect=cm: RDMA-CM joins need a verbs device; the shm fabric joins over TCP "
        "(--connect=tcp)");
  }
  if (options_.connect == transport::ConnectMode::kCm) {
    if (absl::Status s = CheckWelcomeFitsCm(c); !s.ok()) return s;
  }
  if (absl::Status s = Take(Topology::Load(), &topology_); !s.ok()) return s;
  if (options_.pin_workers) {
    absl::StatusOr<std::vector<int>> cores = topology_->PickCores(
        c.workers, options_.worker_cores, DeviceNumaNode(options_.device.name));
    if (!cores.ok()) {
      return absl::Status(
          cores.status().code(),
          absl::StrCat("--worker_cores=", options_.worker_cores, ": ", cores.status().message()));
    }
    cores_ = *cores;
  }
  if (absl::Status s = Take(device_->AllocatePd(), &pd_); !s.ok()) return s;
  if (absl::Status s = Take(device_->CreateCq(1), &idle_cq_); !s.ok()) return s;
  absl::StatusOr<transport::SharedMemory> region =
      transport::SharedMemory::Allocate(c.region_bytes(), "herd-requests", options_.region_pages);
  if (!region.ok()) return region.status();
  region_ = std::make_unique<transport::SharedMemory>(*std::move(region));
  // No part of the region is registered here: each session registers its own block, in its own
  // protection domain (BuildSession). Those blocks are the server's only remotely writable
  // memory.
  mica::PartitionConfig store = options_.store;
  store.max_value_bytes = std::min(store.max_value_bytes, c.value_limit());
  // Items a client may READ carry a checksum (mica/remote_item.h): those over the inline limit.
  if (c.large_values()) store.checksum_from_value_bytes = c.inline_limit() + 1;
  // A replicated partition checksums every item: a backup hands out only what it verified whole
  // (mica::Partition::ReadReplica), and the layouts on both sides must agree.
  // And it keeps its clients' mutation outcomes in the region (replication/outcome_table.h),
  // mirrored with the mutations: a client that follows a failover is answered, never applied twice.
  if (options_.replication.role != ReplicationRole::kNone) {
    store.checksum_from_value_bytes = 0;
    store.owner_area_bytes = OutcomeTableBytes(c);
  }
  const uint32_t response_bytes = ResponseBytes(c.slot_value_bytes());
  workers_.resize(c.workers);
  std::vector<WorkerMemory> memories;
  std::vector<std::vector<transport::QueuePair*>> worker_qps;
  for (uint32_t w = 0; w < c.workers; ++w) {
    WorkerResources& r = workers_[w];
    const uint32_t cq_depth = c.ud_qps_per_worker * c.sq_depth + kSendCqSlack;
    if (absl::Status s = Take(device_->CreateCq(cq_depth), &r.send_cq); !s.ok()) return s;
    if (absl::Status s = Take(device_->CreateCq(c.recv_depth + 1), &r.recv_cq); !s.ok()) return s;
    if (c.large_values()) {
      // Every session's large-value QP posts LargeReceiveDepth() receives on it.
      const uint64_t depth = uint64_t{c.max_clients} * LargeReceiveDepth(c) + 1;
      if (absl::Status s = Take(device_->CreateCq(static_cast<uint32_t>(depth)), &r.imm_cq);
          !s.ok()) {
        return s;
      }
    }
    std::vector<transport::QueuePair*> qps;
    for (uint32_t q = 0; q < c.ud_qps_per_worker; ++q) {
      transport::QpConfig qc;
      qc.type = transport::QpType::kUd;
      qc.send_cq = r.send_cq.get();
      qc.recv_cq = r.recv_cq.get();
      qc.max_send_wr = c.sq_depth;
      qc.max_recv_wr = q == 0 && c.request_verb == RequestVerb::kUdSend ? c.recv_depth : 1;
      qc.max_inline_data = c.max_inline;
      std::unique_ptr<transport::QueuePair> qp;
      if (absl::Status s = Take(pd_->CreateQp(qc), &qp); !s.ok()) return s;
      transport::ConnectConfig connect;
      connect.qkey = kQkey;
      if (absl::Status s = qp->Connect(connect); !s.ok()) return s;
      qps.push_back(qp.get());
      r.ud_qps.push_back(std::move(qp));
    }
    absl::StatusOr<transport::SharedMemory> staging = transport::SharedMemory::Allocate(
        uint64_t{c.ud_qps_per_worker} * c.sq_depth * response_bytes, "herd-staging",
        options_.region_pages);
    if (!staging.ok()) return staging.status();
    r.staging = std::make_unique<transport::SharedMemory>(*std::move(staging));
    if (absl::Status s =
            Take(pd_->RegisterMemory(r.staging->data(), r.staging->size(), transport::kLocalWrite),
                 &r.staging_mr);
        !s.ok()) {
      return s;
    }
    WorkerMemory memory;
    memory.region = region_->data();
    memory.staging = r.staging->data();
    memory.staging_lkey = r.staging_mr->lkey();
    memory.imm_cq = r.imm_cq.get();
    if (c.request_verb == RequestVerb::kUdSend) {
      memory.receive_bytes =
          transport::kGrhBytes + std::max(c.slot_bytes, device_->port().active_mtu);
      memory.grh_is_ipv4 = device_->port().grh_is_ipv4;
      absl::StatusOr<transport::SharedMemory> receives = transport::SharedMemory::Allocate(
          uint64_t{c.recv_depth} * memory.receive_bytes, "herd-receives", options_.region_pages);
      if (!receives.ok()) return receives.status();
      r.receives = std::make_unique<transport::SharedMemory>(*std::move(receives));
      if (absl::Status s = Take(
              pd_->RegisterMemory(r.receives->data(), r.receives->size(), transport::kLocalWrite),
              &r.receives_mr);
          !s.ok()) {
        return s;
      }
      memory.receives = r.receives->data();
      memory.receives_lkey = r.receives_mr->lkey();
    }
    if (absl::Status s = Take(mica::Partition::Create(store), &r.partition); !s.ok()) return s;
    if (w == 0) {
      LOG(INFO) << "each worker's partition: "
                << r.partition->layout().Describe(kDescribedKeyBytes, kDescribedValueBytes);
    }
    memories.push_back(memory);
    worker_qps.push_back(std::move(qps));
  }
  // Replication before the workers: a primary's gates and a backup's readers are theirs.
  if (options_.replication.role == ReplicationRole::kPrimary) {
    if (absl::Status s = AttachToBackups(); !s.ok()) return s;
  } else if (options_.replication.role == ReplicationRole::kBackup) {
    if (absl::Status s = PrepareReplica(); !s.ok()) return s;
  }
  for (uint32_t w = 0; w < c.workers; ++w) {
    WorkerResources& r = workers_[w];
    const bool coordinated = options_.replication.coordinated();
    r.worker = std::make_unique<Worker>(w, c, std::move(r.partition), std::move(worker_qps[w]),
                                        r.send_cq.get(), r.recv_cq.get(), memories[w], r.gate.get(),
                                        r.reader.get(), coordinated ? &primary_lease_ : nullptr);
    if (absl::Status s = r.worker->PostInitialReceives(); !s.ok()) return s;
  }
  if (absl::Status s = PrepareFences(); !s.ok()) return s;
  transport::control::PendingOptions pending;
  pending.max_payload = kMaxHandshakeBytes;
  pending.first_message_timeout = kHandshakeTimeout;
  if (options_.connect == transport::ConnectMode::kCm) {
    pending.max_pending = transport::kCmDefaultMaxPending;
    absl::StatusOr<std::unique_ptr<transport::CmHandshakes>> set =
        transport::CmHandshakes::Create(*device_, options_.listen_address, options_.port, pending);
    if (!set.ok()) return set.status();
    pending_ = *std::move(set);
  } else {
    absl::StatusOr<std::unique_ptr<PendingConnections>> set =
        PendingConnections::Create(listener_.get(), pending);
    if (!set.ok()) return set.status();
    pending_ = *std::move(set);
  }
  client_ids_used_.assign(c.max_clients, false);
  ids_awaiting_resume_.assign(c.max_clients, 0);
  queue_slots_used_.assign(c.max_clients, false);
  queue_slot_generation_.assign(c.max_clients, 0);
  if (options_.replication.coordinated()) return JoinCluster();  // once the ports are known
  return absl::OkStatus();
}

Server::Server(const ServerOptions& options, std::unique_ptr<transport::control::Listener> listener)
    : options_(options), listener_(std::move(listener)) {}

Server::~Server() { Stop(); }

absl::Status Server::Start() {
  if (started_) return absl::FailedPreconditionError("the server was already started");
  started_ = true;
  start_time_ = absl::Now();
  for (uint32_t w = 0; w < workers_.size(); ++w) {
    Worker* worker = workers_[w].worker.get();
    const int core = options_.pin_workers ? cores_[w] : -1;
    threads_.emplace_back([this, worker, core] {
      if (core >= 0) {
        if (absl::Status s = topology_->PinCurrentThread(core); !s.ok()) {
          LOG(WARNING) << "worker " << worker->index() << " runs unpinned: " << s;
        }
      }
      worker->Run(stop_);
    });
  }
  control_ = std::thread([this] { ControlLoop(); });
  if (coordinator_ != nullptr) lease_keeper_ = std::thread([this] { KeepPrimaryLease(); });
  if (replication_listener_) replication_thread_ = std::thread([this] { ServeReplication(); });
  return absl::OkStatus();
}

void Server::Stop() {
  if (!started_ || stop_.exchange(true)) return;
  control_.join();  // retires every session first, while the workers still run
  if (lease_keeper_.joinable()) lease_keeper_.join();
  if (replication_thread_.joinable()) replication_thread_.join();  // detaches the primary
  for (std::thread& t : threads_) t.join();
  const ServerStats stats = Stats();
  uint64_t requests = 0;
  for (uint64_t r : stats.requests) requests += r;
  LOG(INFO) << "server stopped: " << requests << " requests, " << stats.bad_requests << " bad, "
            << stats.replays << " replayed, " << stats.dropped << " dropped; fabric "
            << stats.fabric.ToJson();
}

void Server::ControlLoop() {
  std::vector<transport::control::HandshakeEvent> events;
  while (!stop_.load()) {
    // Every unfinished handshake at once, none able to block another or the retirements below.
    pending_->Wait(kControlPollInterval, &events);
    for (transport::control::HandshakeEvent& event : events) OnHandshakeEvent(event);
    for (size_t i = 0; i < sessions_.size();) {
      if (sessions_[i]->channel->PeerClosed()) {
        LOG(INFO) << "clients " << sessions_[i]->first_client << ".."
                  << sessions_[i]->first_client + sessions_[i]->clients - 1 << " ("
                  << sessions_[i]->peer << ") left";
        Retire(*sessions_[i]);
        sessions_.erase(sessions_.begin() + static_cast<ptrdiff_t>(i));
        session_count_.store(static_cast<uint32_t>(sessions_.size()));
      } else {
        ++i;
      }
    }
    BuryRetiredHandles();
    if (coordinator_ != nullptr) {
      Coordinate();
    } else if (options_.replication.role == ReplicationRole::kPrimary) {
      WatchBackups();
    }
  }
  for (auto& session : sessions_) Retire(*session);
  sessions_.clear();
  session_count_.store(0);
}

void Server::OnHandshakeEvent(transport::control::HandshakeEvent& event) {
  if (event.kind != transport::control::HandshakeEvent::Kind::kMessage) {
    // Closed, timed out, malformed or evicted: the set already dropped the connection.
    LOG(WARNING) << "client " << event.peer << " not admitted: " << event.status;
    handshakes_.erase(event.id);
    return;
  }
  if (event.message.type == kStatsRequest && !handshakes_.contains(event.id)) {
    const std::string json = absl::StrFormat(
        "{\"uptime_s\":%.3f,\"config\":%s,\"stats\":%s}",
        absl::ToDoubleSeconds(absl::Now() - start_time_), options_.config.ToJson(),
        StatsJson(Stats(), ServerStats{}, absl::ToDoubleSeconds(absl::Now() - start_time_)));
    (void)pending_->Send(event.id, kStats, transport::control::WireWriter().Bytes(json).Take());
    pending_->Close(event.id);
    return;
  }
  if (event.message.type == kPromoteRequest && !handshakes_.contains(event.id)) {
    absl::StatusOr<std::string> promoted =
        coordinator_ != nullptr ? PromoteCoordinated() : Promote();
    if (promoted.ok()) {
      (void)pending_->Send(event.id, kPromoted,
                           transport::control::WireWriter().Bytes(*promoted).Take());
    } else {
      LOG(WARNING) << "promotion asked by " << event.peer << " refused: " << promoted.status();
      (void)pending_->Send(
          event.id, kError,
          transport::control::WireWriter().Bytes(promoted.status().ToString()).Take());
    }
    pending_->Close(event.id);
    return;
  }
  auto [it, fresh] = handshakes_.try_emplace(event.id);
  Handshake& handshake = it->second;
  const MessageType expected = fresh ? kHello : kJoin;
  absl::Status status;
  if (event.message.type != expected) {
    status = absl::InvalidArgumentError(absl::StrFormat("control message %d where %s was expected",
                                                        event.message.type,
                                                        expected == kHello ? "Hello" : "Join"));
  } else if (fresh) {
    status = OnHello(event.id, event.message, &handshake);
    if (status.ok()) return;  // now awaiting the Join
  } else {
    status = OnJoin(event.id, event.message, handshake, event.peer);
    if (status.ok()) {
      handshakes_.erase(event.id);
      return;
    }
  }
  LOG(WARNING) << "client " << event.peer << " not admitted: " << status;
  (void)pending_->Send(event.id, kError,
                       transport::control::WireWriter().Bytes(status.ToString()).Take());
  pending_->Close(event.id);
  handshakes_.erase(event.id);
}

absl::Status Server::OnHello(uint64_t id, const transport::control::Message& message,
                             Handshake* handshake) {
  const Config& c = options_.config;
  absl::StatusOr<Hello> hello = DecodeHello(message.payload);
  if (!hello.ok()) return hello.status();
  if (hello->clients == 0) {
    return absl::InvalidArgumentError("hello: a connection must host at least 1 client");
  }
  if (hello->clients > c.max_clients) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "hello: %d clients asked for, but --max_clients=%d", hello->clients, c.max_clients));
  }
  handshake->clients = hello->clients;
  if (absl::Status s = pending_->Send(id, kServerConfig, Encode(c)); !s.ok()) return s;
  return pending_->SetDeadline(id, absl::Now() + kHandshakeTimeout);
}

absl::Status Server::OnJoin(uint64_t id, const transport::control::Message& message,
                            const Handshake& handshake, const std::string& peer) {
  const Config& c = options_.config;
  absl::StatusOr<Join> join = DecodeJoin(message.payload, c.workers);
  if (!join.ok()) return join.status();
  if ((join->request_qps.size() == c.workers) != c.request_uses_slots() ||
      (join->response_qps.size() == c.workers) != c.response_uses_slots() ||
      (join->large_qps.size() == c.workers) != c.large_values()) {
    return absl::InvalidArgumentError("join: the QP lists do not match the server's verbs");
  }
  if ((join->ud_qkey & kControlledQkeyBit) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "join: qkey 0x%08x has its top bit set (a controlled qkey, which a sender cannot use)",
        join->ud_qkey));
  }
  // Only a promoted backup holds a lost primary's outcomes; anywhere else a resumption would
  // take over nothing, or (on a primary still running the old session) outcomes its backups may
  // not hold yet. Ignored there; the Welcome says so and the client refuses to follow.
  if (!promoted_.load()) join->resume_session = 0;
  if (join->resume_session != 0 &&
      uint64_t{join->resume_first_client_id} + handshake.clients > c.max_clients) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "join: resuming client ids %d..%d, past --max_clients=%d", join->resume_first_client_id,
        uint64_t{join->resume_first_client_id} + handshake.clients - 1, c.max_clients));
  }
  // Client ids are taken only now, at the Join, so concurrent handshakes never race for them.
  absl::StatusOr<uint32_t> ids = TakeClientIds(handshake.clients, *join);
  if (!ids.ok()) return ids.status();
  const uint32_t first = *ids;
  uint16_t slot = 0;
  if (c.response_uses_slots()) {
    while (slot < c.max_clients && queue_slots_used_[slot]) ++slot;
  }
  auto session = std::make_unique<Session>();
  session->peer = peer;
  session->first_client = first;
  session->clients = handshake.clients;
  session->generation = next_generation_++;
  session->secret = DrawSecret();
  session->has_queue_slot = c.response_uses_slots();
  session->queue_slot = slot;
  if (absl::Status s = BuildSession(*session, *join); !s.ok()) return s;

  Welcome welcome;
  welcome.first_client_id = first;
  if (session->region_mr) {  // requests are WRITEs
    welcome.region_addr = reinterpret_cast<uint64_t>(session->region_mr->addr());
    welcome.region_rkey = session->region_mr->rkey();
  }
  welcome.secret = session->secret;
  welcome.takes_writes =
      (options_.replication.role != ReplicationRole::kBackup || promoted_.load()) &&
      !fenced_.load();
  welcome.epoch = epoch_.load();
  welcome.resumed = join->resume_session != 0;
  for (uint32_t w = 0; w < c.workers; ++w) {
    welcome.worker_ud.push_back(workers_[w].ud_qps[0]->endpoint());
    for (const auto& qp : workers_[w].ud_qps) welcome.worker_response_qpns.push_back(qp->qp_num());
    Session::PerWorker& pw = session->workers[w];
    if (pw.request_qp) welcome.request_qps.push_back(pw.request_qp->endpoint());
    if (pw.response_qp) welcome.response_qps.push_back(pw.response_qp->endpoint());
    if (pw.large_qp) welcome.large_qps.push_back(pw.large_qp->endpoint());
  }
  if (session->landing_mr) {
    welcome.landing_addr = reinterpret_cast<uint64_t>(session->landing_mr->addr());
    welcome.landing_rkey = session->landing_mr->rkey();
  }
  // Publish before the welcome: the client sends its first request as soon as it has it.
  for (uint32_t i = first; i < first + session->clients; ++i) client_ids_used_[i] = true;
  if (session->has_queue_slot) queue_slots_used_[slot] = true;
  for (uint32_t w = 0; w < c.workers; ++w) {
    Session::PerWorker& pw = session->workers[w];
    Worker& worker = *workers_[w].worker;
    if (session->has_queue_slot) {
      worker.PublishQueue(static_cast<uint16_t>(c.ud_qps_per_worker + slot), &pw.queue);
    }
    for (uint32_t i = 0; i < session->clients; ++i) {
      worker.PublishRoute(first + i, &pw.routes[i]);
    }
  }
  client_count_.fetch_add(session->clients);
  absl::Status sent = pending_->Send(id, kWelcome, Encode(welcome));
  absl::StatusOr<std::unique_ptr<transport::control::MessageChannel>> channel =
      sent.ok() ? pending_->ReleaseChannel(id)
                : absl::StatusOr<std::unique_ptr<transport::control::MessageChannel>>(sent);
  if (!channel.ok()) {
    Retire(*session);  // the client never got (or will never read) its welcome
    return channel.status();
  }
  session->channel = *std::move(channel);
  LOG(INFO) << "clients " << first << ".." << first + session->clients - 1 << " (" << session->peer
            << ") joined";
  sessions_.push_back(std::move(session));
  session_count_.store(static_cast<uint32_t>(sessions_.size()));
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Server::TakeClientIds(uint32_t count, const Join& join) {
  const uint32_t max_clients = options_.config.max_clients;
  const auto free_run_at = [&](uint32_t first, bool avoid_awaiting) {
    for (uint32_t i = first; i < first + count; ++i) {
      if (client_ids_used_[i] || (avoid_awaiting && ids_awaiting_resume_[i])) return false;
    }
    return true;
  };
  if (join.resume_session != 0) {
    // Its client is back for the old ids' outcomes (the workers check the session before they
    // take any over; this is only a preference for fresh joins). Its old ids when they are free.
    for (uint32_t i = 0; i < count; ++i) ids_awaiting_resume_[join.resume_first_client_id + i] = 0;
    if (free_run_at(join.resume_first_client_id, false)) return join.resume_first_client_id;
  }
  // First fit: a contiguous run of free ids, preferring ids whose old outcomes no resumed client
  // took over yet (a session there records none until then: a second failover could re-apply).
  for (const bool avoid_awaiting : {true, false}) {
    uint32_t run = 0;
    for (uint32_t i = 0; i < max_clients; ++i) {
      run = client_ids_used_[i] || (avoid_awaiting && ids_awaiting_resume_[i]) ? 0 : run + 1;
      if (run == count) return i + 1 - count;
    }
  }
  uint32_t run = 0, longest = 0;
  for (uint32_t i = 0; i < max_clients; ++i) {
    run = client_ids_used_[i] ? 0 : run + 1;
    longest = std::max(longest, run);
  }
  return absl::ResourceExhaustedError(
      absl::StrFormat("%d clients asked for, but the server has room for %d in a row (of "
                      "--max_clients=%d)",
                      count, longest, max_clients));
}

absl::Status Server::BuildSession(Session& session, const Join& join) {
  const Config& c = options_.config;
  const uint32_t response_bytes = ResponseBytes(c.slot_value_bytes());
  if (session.has_queue_slot && session.queue_slot >= c.max_clients) {
    return absl::ResourceExhaustedError("no free response queue slot");
  }
  const uint8_t generation =
      session.has_queue_slot ? ++queue_slot_generation_[session.queue_slot] : 0;
  if (absl::Status s = Take(device_->AllocatePd(), &session.pd); !s.ok()) return s;
  if (c.request_uses_slots()) {
    const uint64_t block = c.client_block_bytes();
    if (absl::Status s =
            Take(session.pd->RegisterMemory(region_->data() + session.first_client * block,
                                            session.clients * block,
                                            transport::kLocalWrite | transport::kRemoteWrite),
                 &session.region_mr);
        !s.ok()) {
      return s;
    }
  }
  session.workers.resize(c.workers);
  for (uint32_t w = 0; w < c.workers; ++w) {
    Session::PerWorker& pw = session.workers[w];
    WorkerResources& r = workers_[w];
    if (absl::Status s = Take(pd_->CreateAddressHandle({join.ud.lid, join.ud.gid}), &pw.ah);
        !s.ok()) {
      return s;
    }
    auto connected = [&](transport::ProtectionDomain* pd, transport::QpType type,
                         transport::CompletionQueue* send_cq, const transport::QpEndpoint& remote,
                         std::unique_ptr<transport::QueuePair>* out) -> absl::Status {
      transport::QpConfig qc;
      qc.type = type;
      qc.send_cq = send_cq;
      qc.recv_cq = idle_cq_.get();
      qc.max_send_wr = c.sq_depth;
      qc.max_recv_wr = 1;
      qc.max_inline_data = c.max_inline;
      if (absl::Status s = Take(pd->CreateQp(qc), out); !s.ok()) return s;
      transport::ConnectConfig connect;
      connect.remote = remote;
      return (*out)->Connect(connect);
    };
    if (c.request_uses_slots()) {
      const auto type =
          c.request_verb == RequestVerb::kRcWrite ? transport::QpType::kRc : transport::QpType::kUc;
      if (absl::Status s = connected(session.pd.get(), type, idle_cq_.get(), join.request_qps[w],
                                     &pw.request_qp);
          !s.ok()) {
        return s;
      }
    }
    if (c.response_uses_slots()) {
      const auto type = c.response_verb == ResponseVerb::kRcWrite ? transport::QpType::kRc
                                                                  : transport::QpType::kUc;
      // In the server's PD: it sends from the worker's staging, and nothing may be written
      // through it.
      if (absl::Status s =
              connected(pd_.get(), type, r.send_cq.get(), join.response_qps[w], &pw.response_qp);
          !s.ok()) {
        return s;
      }
      absl::StatusOr<transport::SharedMemory> staging = transport::SharedMemory::Allocate(
          uint64_t{c.sq_depth} * response_bytes, "herd-session-staging", options_.region_pages);
      if (!staging.ok()) return staging.status();
      pw.staging = std::make_unique<transport::SharedMemory>(*std::move(staging));
      if (absl::Status s = Take(
              pd_->RegisterMemory(pw.staging->data(), pw.staging->size(), transport::kLocalWrite),
              &pw.staging_mr);
          !s.ok()) {
        return s;
      }
      pw.queue.qp = pw.response_qp.get();
      pw.queue.depth = c.sq_depth;
      pw.queue.unsig_batch = c.unsig_batch;
      pw.queue.table_slot = static_cast<uint16_t>(c.ud_qps_per_worker + session.queue_slot);
      pw.queue.generation = generation;
      pw.queue.staging = pw.staging->data();
      pw.queue.staging_lkey = pw.staging_mr->lkey();
      pw.queue.buffer_bytes = response_bytes;
    }
    pw.routes.resize(session.clients);
    for (uint32_t i = 0; i < session.clients; ++i) {
      ClientRoute& route = pw.routes[i];
      route.ah = pw.ah.get();
      route.ud_qpn = join.ud.qp_num;
      route.ud_gid = join.ud.gid;
      route.ud_qkey = join.ud_qkey;
      route.secret = session.secret;
      route.generation = session.generation;
      if (join.resume_session != 0) {
        route.resume_client = join.resume_first_client_id + i;
        route.resume_session = join.resume_session;
      }
      route.response_queue = pw.queue.table_slot;
      // The client's response region is [worker][its client][window] slots.
      route.response_addr = join.response_region_addr + (uint64_t{w} * session.clients + i) *
                                                            c.window * c.response_slot_bytes();
      route.response_rkey = join.response_region_rkey;
    }
  }
  if (c.large_values()) {
    if (absl::Status s = BuildLargeValuePath(session, join); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void Server::WaitForWorkers() {
  for (WorkerResources& r : workers_) {
    const uint64_t seen = r.worker->epoch();
    while (r.worker->running() && r.worker->epoch() == seen) std::this_thread::yield();
  }
}

void Server::Retire(Session& session) {
  const Config& c = options_.config;
  for (uint32_t w = 0; w < c.workers; ++w) {
    for (uint32_t i = 0; i < session.clients; ++i) {
      workers_[w].worker->PublishRoute(session.first_client + i, nullptr);
    }
    if (session.has_queue_slot) {
      workers_[w].worker->PublishQueue(
          static_cast<uint16_t>(c.ud_qps_per_worker + session.queue_slot), nullptr);
    }
  }
  // Once every worker finished a loop iteration, none holds a pointer into this session.
  WaitForWorkers();
  // UD responses already posted may still name the session's address handles (a NIC reads a WR
  // when it executes it): those wait in the graveyard until every UD queue retired past what
  // it had posted by now. Everything else goes at once, the request QPs first, so a departed
  // client cannot write into slots that new clients will get.
  RetiredHandles retired;
  for (uint32_t w = 0; w < c.workers; ++w) {
    const Worker& worker = *workers_[w].worker;
    for (uint32_t q = 0; q < c.ud_qps_per_worker; ++q) {
      retired.wait_for.push_back(
          {&worker.ud_progress(q), worker.ud_progress(q).posted.load(std::memory_order_acquire)});
    }
    retired.handles.push_back(std::move(session.workers[w].ah));
  }
  graveyard_.push_back(std::move(retired));
  graveyard_size_.store(graveyard_.size(), std::memory_order_relaxed);
  session.workers.clear();
  session.landing_mr.reset();
  session.landing.reset();
  session.region_mr.reset();
  session.pd.reset();
  for (uint32_t id = session.first_client; id < session.first_client + session.clients; ++id) {
    // Nothing can write the session's slots now. Workers scan only ids with a route, so markers
    // it left (requests that landed after its last scan) would otherwise wait for the id's next
    // session, to be rejected under its secret after a grace period, or to race its first one.
    for (uint32_t w = 0; w < c.workers; ++w) {
      for (uint32_t index = 0; index < c.window; ++index) {
        uint8_t* slot_end = region_->data() + c.SlotOffset(w, id, index) + c.slot_bytes;
        std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(slot_end - sizeof(uint64_t)))
            .store(0, std::memory_order_relaxed);
      }
    }
    client_ids_used_[id] = false;
  }
  if (session.has_queue_slot) queue_slots_used_[session.queue_slot] = false;
  client_count_.fetch_sub(session.clients);
}

void Server::BuryRetiredHandles() {
  ReclaimFenceReceives();
  if (graveyard_.empty()) return;
  std::erase_if(graveyard_, [](const RetiredHandles& r) {
    for (const auto& [progress, posted] : r.wait_for) {
      if (progress->retired.load(std::memory_order_acquire) < posted) return false;
    }
    return true;
  });
  graveyard_size_.store(graveyard_.size(), std::memory_order_relaxed);
  // A worker with no more requests would never retire its last unsignalled WRs, and every later
  // departure would wait here with a mapping of its client's device: an idle worker fences.
  if (!graveyard_.empty()) {
    for (WorkerResources& r : workers_) r.worker->RequestFence();
  }
}

absl::Status Server::PrepareFences() {
  if (absl::Status s = Take(device_->CreateCq(kFenceReceives + 1), &fence_cq_); !s.ok()) return s;
  transport::QpConfig qc;
  qc.type = transport::QpType::kUd;
  qc.send_cq = fence_cq_.get();
  qc.recv_cq = fence_cq_.get();
  qc.max_send_wr = 1;
  qc.max_recv_wr = kFenceReceives;
  if (absl::Status s = Take(pd_->CreateQp(qc), &fence_sink_); !s.ok()) return s;
  transport::ConnectConfig connect;
  connect.qkey = kQkey;
  if (absl::Status s = fence_sink_->Connect(connect); !s.ok()) return s;
  absl::StatusOr<transport::SharedMemory> buffers = transport::SharedMemory::Allocate(
      uint64_t{kFenceReceives} * kFenceReceiveBytes, "herd-fences");
  if (!buffers.ok()) return buffers.status();
  fence_buffers_ = std::make_unique<transport::SharedMemory>(*std::move(buffers));
  if (absl::Status s = Take(pd_->RegisterMemory(fence_buffers_->data(), fence_buffers_->size(),
                                                transport::kLocalWrite),
                            &fence_mr_);
      !s.ok()) {
    return s;
  }
  std::vector<uint32_t> all(kFenceReceives);
  for (uint32_t i = 0; i < kFenceReceives; ++i) all[i] = i;
  PostFenceReceives(all);
  const transport::QpEndpoint sink = fence_sink_->endpoint();
  if (absl::Status s = Take(pd_->CreateAddressHandle({sink.lid, sink.gid}), &fence_ah_); !s.ok()) {
    return s;
  }
  for (WorkerResources& r : workers_) {
    r.worker->SetFenceTarget(FenceTarget{fence_ah_.get(), sink.qp_num, kQkey});
  }
  return absl::OkStatus();
}

void Server::PostFenceReceives(absl::Span<const uint32_t> indices) {
  if (indices.empty()) return;
  std::vector<transport::Sge> sges(indices.size());
  std::vector<transport::RecvWr> wrs(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    sges[i] = transport::Sge{reinterpret_cast<uint64_t>(fence_buffers_->data()) +
                                 uint64_t{indices[i]} * kFenceReceiveBytes,
                             kFenceReceiveBytes, fence_mr_->lkey()};
    wrs[i].wr_id = indices[i];
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].next = i + 1 < indices.size() ? &wrs[i + 1] : nullptr;
  }
  transport::RecvWr* bad = nullptr;
  if (absl::Status s = fence_sink_->PostRecv(wrs.data(), &bad); !s.ok()) {
    LOG_EVERY_N(WARNING, 100) << "the fence sink's receives were not posted: " << s;
  }
}

void Server::ReclaimFenceReceives() {
  if (fence_cq_ == nullptr) return;
  std::array<transport::Completion, kFenceReceives> completions;
  const size_t got = fence_cq_->Poll(absl::MakeSpan(completions));
  if (got == 0) return;
  std::array<uint32_t, kFenceReceives> indices;
  size_t n = 0;
  for (size_t i = 0; i < got; ++i) {
    if (completions[i].wr_id < kFenceReceives)
      indices[n++] = static_cast<uint32_t>(completions[i].wr_id);
  }
  PostFenceReceives(absl::MakeConstSpan(indices.data(), n));
}

uint64_t Server::DrawSecret() {
  // Control path: std::random_device reads the kernel's entropy. Never 0 (0 means "none").
  std::random_device device;
  uint64_t secret = 0;
  while (secret == 0) secret = (uint64_t{device()} << 32) | device();
  return secret;
}

}  // namespace herd
