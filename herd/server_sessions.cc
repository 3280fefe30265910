// The server's sessions: the join handshake (Hello, Join), client ids, building a session's
// queues on every worker, and retiring a departed session's.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "herd/join.h"
#include "herd/server.h"
#include "herd/server_session.h"
#include "transport/control/wire.h"
#include "util/take.h"

namespace herd {

using util::Take;

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
        replication_ != nullptr
            ? replication_->Promote()
            : absl::FailedPreconditionError(
                  "this server is not a backup (--role=backup): there is nothing to promote");
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
  if (!role_.promoted()) join->resume_session = 0;
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
  welcome.takes_writes = role_.takes_writes();
  welcome.epoch = replication_ != nullptr ? replication_->epoch() : 0;
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

}  // namespace herd
