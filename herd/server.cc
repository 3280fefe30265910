// The server: creating its devices, workers and listener; starting and stopping; the control
// loop; the fence sink. Sessions (joins, retirement) are in server_sessions.cc.
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

// The item the start-up layout line counts capacity in: HERD's 16 B keys and 32 B values.
constexpr uint32_t kDescribedKeyBytes = 16;
constexpr uint32_t kDescribedValueBytes = 32;

// How often the control thread looks for departed clients while waiting for new ones.
constexpr absl::Duration kControlPollInterval = absl::Milliseconds(20);
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
  if (options_.replication.coordinated() && !role_.replicated()) {
    // Before anything is allocated: a server alone has no replication member to coordinate.
    return absl::InvalidArgumentError("--coordinator needs --role=primary or --role=backup");
  }
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
  if (role_.replicated()) {
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
  if (role_.replicated()) {
    std::vector<mica::Partition*> partitions;
    for (WorkerResources& r : workers_) partitions.push_back(r.partition.get());
    if (absl::Status s =
            Take(ReplicationMember::Create(*this, role_, c, options_.replication,
                                           options_.region_pages, std::move(partitions)),
                 &replication_);
        !s.ok()) {
      return s;
    }
  }
  for (uint32_t w = 0; w < c.workers; ++w) {
    WorkerResources& r = workers_[w];
    const bool replicated = replication_ != nullptr;
    r.worker = std::make_unique<Worker>(w, c, std::move(r.partition), std::move(worker_qps[w]),
                                        r.send_cq.get(), r.recv_cq.get(), memories[w],
                                        replicated ? replication_->gate(w) : nullptr,
                                        replicated ? replication_->reader(w) : nullptr,
                                        replicated ? replication_->primary_lease() : nullptr);
    if (absl::Status s = r.worker->PostInitialReceives(); !s.ok()) return s;
  }
  if (absl::Status s = PrepareFences(); !s.ok()) return s;
  transport::control::PendingOptions pending;
  pending.max_payload = kMaxHandshakeBytes;
  pending.first_message_timeout = kHandshakeTimeout;
  if (options_.connect == transport::ConnectMode::kCm) {
    pending.max_pending = transport::kCmDefaultMaxPending;
  }
  transport::JoinListenerOptions joins;
  joins.connect = options_.connect;
  joins.address = options_.listen_address;
  joins.port = options_.port;
  joins.pending = pending;
  absl::StatusOr<transport::JoinListener> listener =
      transport::JoinListener::Open(*device_, joins, std::move(listener_));
  if (!listener.ok()) return listener.status();
  pending_ = *std::move(listener);
  client_ids_used_.assign(c.max_clients, false);
  ids_awaiting_resume_.assign(c.max_clients, 0);
  queue_slots_used_.assign(c.max_clients, false);
  queue_slot_generation_.assign(c.max_clients, 0);
  // Once the ports are known.
  if (options_.replication.coordinated()) return replication_->JoinCluster();
  return absl::OkStatus();
}

Server::Server(const ServerOptions& options, std::unique_ptr<transport::control::Listener> listener)
    : options_(options), role_(options.replication.role), listener_(std::move(listener)) {}

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
  if (replication_ != nullptr) replication_->Start();
  return absl::OkStatus();
}

void Server::Stop() {
  if (!started_ || stop_.exchange(true)) return;
  control_.join();  // retires every session first, while the workers still run
  // Its rejoin attempts and threads, while the workers still run (a backup's detachment runs a
  // task on each).
  if (replication_ != nullptr) replication_->StopThreads();
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
    if (replication_ != nullptr) replication_->OnControlPass();
  }
  for (auto& session : sessions_) Retire(*session);
  sessions_.clear();
  session_count_.store(0);
}

std::vector<std::string> Server::RunOnWorkers(absl::Span<ReplicaTask* const> tasks) {
  DCHECK_EQ(tasks.size(), workers_.size());
  for (size_t w = 0; w < tasks.size(); ++w) workers_[w].worker->RequestTask(tasks[w]);
  std::vector<std::string> failures;
  for (size_t w = 0; w < tasks.size(); ++w) {
    ReplicaTask* task = tasks[w];
    while (!task->done.load(std::memory_order_acquire)) {
      // Stopping: the worker may exit its loop before it claims the task; take it back (if it
      // claimed it already, it finishes it).
      if (stop_.load() && workers_[w].worker->CancelTask(task)) break;
      std::this_thread::yield();
    }
    if (!task->done.load(std::memory_order_acquire)) {
      failures.push_back(absl::StrFormat("worker %d: the server stopped first", w));
    } else if (!task->status.ok()) {
      failures.push_back(absl::StrFormat("worker %d: %s", w, task->status.ToString()));
    } else {
      // A promotion (control thread): fresh joins avoid these ids while their clients may
      // still come back for their outcomes (TakeClientIds).
      for (uint32_t client : task->awaiting_resume) ids_awaiting_resume_[client] = 1;
    }
  }
  return failures;
}

void Server::WaitForWorkers() {
  for (WorkerResources& r : workers_) {
    const uint64_t seen = r.worker->epoch();
    while (r.worker->running() && r.worker->epoch() == seen) std::this_thread::yield();
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
