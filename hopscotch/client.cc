#include "hopscotch/client.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "hopscotch/hash.h"
#include "transport/cm.h"
#include "transport/cm_channel.h"

namespace hopscotch {

namespace {

using transport::control::Message;

// Receives one message of type `want`; kHopError becomes its text as a status.
absl::StatusOr<Message> Expect(transport::control::MessageChannel& channel, uint16_t want,
                               absl::Duration timeout) {
  absl::StatusOr<Message> m = channel.Receive(timeout);
  if (!m.ok()) return m.status();
  if (m->type == kHopError) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s refused: %s", channel.peer_name(), std::string(m->payload.begin(), m->payload.end())));
  }
  if (m->type != want) {
    return absl::DataLossError(absl::StrFormat("%s sent message type %u, expected %u",
                                               channel.peer_name(), m->type, want));
  }
  return m;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.servers.empty()) return absl::InvalidArgumentError("no hop server named");
  if (options.window == 0) return absl::InvalidArgumentError("window must be >= 1");
  std::unique_ptr<Client> client(new Client(options));
  if (absl::Status s = client->Open(); !s.ok()) return s;
  return client;
}

Client::~Client() {
  // The QPs before the CQ; a READ still in flight completes into memory that stays mapped
  // until the MR and buffers go after them.
  for (Server& s : servers_) {
    s.qp.reset();
    s.cm.reset();
  }
}

absl::Status Client::Open() {
  // The server's pool may be a file on disk (hop_server --path), which no seal keeps from
  // shrinking: a client trusts its server with that, as with the data it serves.
  transport::DeviceOptions device = options_.device;
  device.shm_map_unsealed_regions = true;
  absl::StatusOr<transport::DeviceResources> opened =
      transport::OpenDeviceResources(device, options_.window);
  if (!opened.ok()) return opened.status();
  device_ = std::move(opened->device);
  pd_ = std::move(opened->pd);
  cq_ = std::move(opened->cq);
  absl::StatusOr<transport::SharedMemory> buffers =
      transport::SharedMemory::Allocate(uint64_t{options_.window} * kNeighbourhoodBytes, "hop");
  if (!buffers.ok()) return buffers.status();
  buffers_ = std::make_unique<transport::SharedMemory>(*std::move(buffers));
  absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> mr =
      pd_->RegisterMemory(buffers_->data(), buffers_->size(), transport::kLocalWrite);
  if (!mr.ok()) return mr.status();
  mr_ = *std::move(mr);

  std::vector<Server> joined;
  for (const std::string& address : options_.servers) {
    Server server;
    server.address = address;
    transport::QpConfig config;
    config.type = transport::QpType::kRc;
    config.send_cq = cq_.get();
    config.recv_cq = cq_.get();
    config.max_send_wr = options_.window;
    config.max_recv_wr = 1;
    absl::StatusOr<std::unique_ptr<transport::QueuePair>> qp = pd_->CreateQp(config);
    if (!qp.ok()) return qp.status();
    server.qp = *std::move(qp);
    absl::StatusOr<HopWelcome> welcome =
        options_.connect == transport::ConnectMode::kCm ? JoinByCm(server) : JoinByControl(server);
    if (!welcome.ok()) {
      return absl::Status(welcome.status().code(),
                          absl::StrFormat("%s: %s", address, welcome.status().message()));
    }
    server.table = *welcome;
    joined.push_back(std::move(server));
  }
  // Every shard exactly once, all of one sharding.
  const uint32_t shards = joined[0].table.shards;
  if (joined.size() != shards) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s serves shard %u of %u, but %u servers were named: name one server per shard",
        options_.servers[0], joined[0].table.shard, shards, joined.size()));
  }
  servers_.resize(shards);
  std::vector<bool> seen(shards, false);
  for (size_t i = 0; i < joined.size(); ++i) {
    const HopWelcome& t = joined[i].table;
    if (t.shards != shards || seen[t.shard]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s serves shard %u of %u: the servers named do not serve each of %u shards once",
          options_.servers[i], t.shard, t.shards, shards));
    }
    seen[t.shard] = true;
    servers_[t.shard] = std::move(joined[i]);
  }
  slots_.resize(options_.window);
  for (uint32_t i = 0; i < options_.window; ++i) {
    Slot& slot = slots_[i];
    // Prepared once: only the server, address and key change per lookup.
    slot.sge = transport::Sge{
        reinterpret_cast<uint64_t>(buffers_->data()) + uint64_t{i} * kNeighbourhoodBytes,
        static_cast<uint32_t>(kNeighbourhoodBytes), mr_->lkey()};
    slot.wr.wr_id = i;
    slot.wr.sg_list = &slot.sge;
    slot.wr.num_sge = 1;
    slot.wr.opcode = transport::Opcode::kRead;
    slot.wr.flags = transport::kSignaled;
    free_slots_.push_back(options_.window - 1 - i);
  }
  completions_.resize(options_.window);
  return absl::OkStatus();
}

absl::StatusOr<HopWelcome> Client::JoinByControl(Server& server) {
  absl::StatusOr<std::unique_ptr<transport::control::MessageChannel>> control =
      transport::ConnectControl(options_.connect, device_.get(), server.address, options_.timeout);
  if (!control.ok()) return control.status();
  server.control = *std::move(control);
  HopHello hello;
  hello.qp = server.qp->endpoint();
  if (absl::Status s = server.control->Send(kHopHello, Encode(hello)); !s.ok()) return s;
  absl::StatusOr<Message> m = Expect(*server.control, kHopWelcome, options_.timeout);
  if (!m.ok()) return m.status();
  absl::StatusOr<HopWelcome> welcome = DecodeWelcome(m->payload);
  if (!welcome.ok()) return welcome.status();
  transport::ConnectConfig connect;
  connect.remote = welcome->qp;
  if (absl::Status s = server.qp->Connect(connect); !s.ok()) return s;
  return welcome;
}

absl::StatusOr<HopWelcome> Client::JoinByCm(Server& server) {
  std::string host;
  uint16_t port = 0;
  if (absl::Status s = transport::ParseCmAddress(server.address, &host, &port); !s.ok()) return s;
  std::vector<uint8_t> reply;
  absl::StatusOr<std::unique_ptr<transport::CmConnection>> connection = transport::CmConnect(
      *device_, *server.qp, host, port, options_.timeout, EncodeCmHello(), &reply);
  if (!connection.ok()) return connection.status();
  server.cm = *std::move(connection);
  return DecodeCmWelcome(reply);
}

absl::StatusOr<transport::control::MessageChannel*> Client::ControlOf(uint32_t shard) {
  Server& server = servers_[shard];
  if (server.control != nullptr) return server.control.get();
  // Joined by the CM alone: a control connection that asks for no QP, opened on first use.
  absl::StatusOr<std::unique_ptr<transport::control::MessageChannel>> control =
      transport::ConnectControl(options_.connect, device_.get(), server.address, options_.timeout);
  if (!control.ok()) return control.status();
  HopHello hello;
  hello.lookup_qp = false;
  if (absl::Status s = (*control)->Send(kHopHello, Encode(hello)); !s.ok()) return s;
  absl::StatusOr<Message> m = Expect(**control, kHopWelcome, options_.timeout);
  if (!m.ok()) return m.status();
  absl::StatusOr<HopWelcome> welcome = DecodeWelcome(m->payload);
  if (!welcome.ok()) return welcome.status();
  if (welcome->shard != shard || welcome->table_addr != server.table.table_addr) {
    return absl::DataLossError(absl::StrFormat(
        "%s: its control connection describes another table (shard %u, at %#x) than its lookup "
        "connection (shard %u, at %#x)",
        server.address, welcome->shard, welcome->table_addr, shard, server.table.table_addr));
  }
  server.control = *std::move(control);
  return server.control.get();
}

absl::Status Client::Submit(std::string_view key, uint64_t tag) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  if (free_slots_.empty()) {
    return absl::ResourceExhaustedError("the window is full: poll completions first");
  }
  const uint32_t shard = ServerOf(key, shards());
  Server& server = servers_[shard];
  if (server.failed) {
    return absl::UnavailableError(
        absl::StrFormat("the server of shard %u failed: %s", shard, server.address));
  }
  const uint32_t index = free_slots_.back();
  free_slots_.pop_back();
  Slot& slot = slots_[index];
  slot.busy = true;
  slot.tag = tag;
  slot.server = shard;
  slot.key = PadKey(key);
  slot.reads = 0;
  slot.torn_reads = 0;
  slot.misses = 0;
  slot.unposted = false;
  const uint64_t home = HomeBucket(key, server.table.hash_seed, server.table.home_buckets);
  // home < home_buckets and the file holds H - 1 buckets after the last home: in bounds.
  slot.wr.remote_addr = server.table.table_addr + kHeaderBytes + home * kBucketBytes;
  slot.wr.rkey = server.table.table_rkey;
  ++in_flight_;
  Queue(index);
  return absl::OkStatus();
}

void Client::Queue(uint32_t index) {
  Slot& slot = slots_[index];
  Server& server = servers_[slot.server];
  slot.wr.next = nullptr;
  if (server.chain_tail == nullptr) {
    server.chain_head = &slot.wr;
  } else {
    server.chain_tail->next = &slot.wr;
  }
  server.chain_tail = &slot.wr;
  ++slot.reads;
  ++stats_.reads;
}

void Client::Flush() {
  for (Server& server : servers_) {
    if (server.chain_head == nullptr) continue;
    transport::SendWr* bad = nullptr;
    // At most `window` READs are in flight over all servers, so the send queue has room.
    absl::Status s = server.qp->PostSend(server.chain_head, &bad);
    if (!s.ok()) {
      LOG(ERROR) << "hop client: posting READs to " << server.address << ": " << s;
      server.failed = true;
      // Nothing from *bad on was posted: finished as failed by the next Poll.
      for (transport::SendWr* wr = bad; wr != nullptr; wr = wr->next) {
        slots_[wr->wr_id].unposted = true;
      }
    }
    server.chain_head = server.chain_tail = nullptr;
  }
}

void Client::Finish(Slot& slot, absl::Status status, const LookupResult& result, LookupDone* out) {
  out->tag = slot.tag;
  out->status = std::move(status);
  out->result = result;
  out->reads = slot.reads;
  ++stats_.lookups;
  if (!out->status.ok()) {
    ++stats_.failed;
  } else if (result.kind == LookupResult::Kind::kFound) {
    ++stats_.found;
  } else if (result.kind == LookupResult::Kind::kMiss) {
    ++stats_.misses;
  } else {
    ++stats_.torn;
  }
  slot.busy = false;
  free_slots_.push_back(static_cast<uint32_t>(&slot - slots_.data()));
  --in_flight_;
}

size_t Client::Poll(absl::Span<LookupDone> out) {
  Flush();
  size_t done = 0;
  // WRs a failed post never executed: no completion will come for them.
  for (Slot& slot : slots_) {
    if (done == out.size()) break;
    if (slot.busy && slot.unposted) {
      Finish(slot, absl::UnavailableError("posting the READ failed"), {}, &out[done++]);
    }
  }
  const size_t room = std::min(out.size() - done, completions_.size());
  const size_t n = cq_->Poll(absl::MakeSpan(completions_.data(), room));
  for (size_t i = 0; i < n; ++i) {
    const transport::Completion& c = completions_[i];
    Slot& slot = slots_[c.wr_id];
    if (c.status != transport::CompletionStatus::kSuccess) {
      servers_[slot.server].failed = true;
      Finish(slot,
             absl::UnavailableError(absl::StrFormat(
                 "READ from %s: %s", servers_[slot.server].address, transport::ToString(c.status))),
             {}, &out[done++]);
      continue;
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(slot.sge.addr);
    LookupResult r = FindInNeighbourhood(Snapshot(bytes, kNeighbourhoodBytes), slot.key);
    if (r.kind == LookupResult::Kind::kTorn && slot.torn_reads < options_.max_rereads) {
      ++slot.torn_reads;
      ++stats_.rereads;
      Queue(static_cast<uint32_t>(&slot - slots_.data()));
      continue;
    }
    if (r.kind == LookupResult::Kind::kMiss && options_.confirm_misses && slot.misses++ == 0) {
      ++stats_.confirm_reads;
      Queue(static_cast<uint32_t>(&slot - slots_.data()));
      continue;
    }
    r.rereads = static_cast<int>(slot.torn_reads);
    Finish(slot, absl::OkStatus(), r, &out[done++]);
  }
  Flush();  // rereads and confirmations go out now, not at the next call
  return done;
}

absl::StatusOr<LookupResult> Client::Lookup(std::string_view key) {
  if (in_flight_ != 0) {
    return absl::FailedPreconditionError("Lookup with pipelined lookups in flight");
  }
  if (absl::Status s = Submit(key, 0); !s.ok()) return s;
  LookupDone done;
  const absl::Time deadline = absl::Now() + options_.timeout;
  while (Poll(absl::MakeSpan(&done, 1)) == 0) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError("lookup: no READ completion (server gone?)");
    }
  }
  if (!done.status.ok()) return done.status;
  return done.result;
}

absl::StatusOr<std::vector<absl::Status>> Client::Upsert(const std::vector<HopUpsert>& pairs) {
  std::vector<absl::Status> statuses(pairs.size());
  std::vector<std::vector<size_t>> by_shard(shards());
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (absl::Status s = ValidateKey(pairs[i].key); !s.ok()) {
      statuses[i] = s;
      continue;
    }
    by_shard[ServerOf(pairs[i].key, shards())].push_back(i);
  }
  for (uint32_t shard = 0; shard < shards(); ++shard) {
    const std::vector<size_t>& mine = by_shard[shard];
    for (size_t from = 0; from < mine.size(); from += kMaxUpsertsPerMessage) {
      const size_t to = std::min<size_t>(mine.size(), from + kMaxUpsertsPerMessage);
      std::vector<HopUpsert> batch;
      for (size_t j = from; j < to; ++j) batch.push_back(pairs[mine[j]]);
      absl::StatusOr<transport::control::MessageChannel*> channel = ControlOf(shard);
      if (!channel.ok()) return channel.status();
      transport::control::MessageChannel& control = **channel;
      if (absl::Status s = control.Send(kHopUpsert, Encode(batch)); !s.ok()) return s;
      absl::StatusOr<Message> m = Expect(control, kHopUpserted, options_.timeout);
      if (!m.ok()) return m.status();
      absl::StatusOr<HopUpserted> answer = DecodeUpserted(m->payload);
      if (!answer.ok()) return answer.status();
      if (answer->codes.size() != batch.size()) {
        return absl::DataLossError(absl::StrFormat("%s answered %u of %u upserts",
                                                   control.peer_name(), answer->codes.size(),
                                                   batch.size()));
      }
      for (size_t j = from; j < to; ++j) {
        const uint32_t code = answer->codes[j - from];
        if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
          return absl::DataLossError(
              absl::StrFormat("%s answered status code %u", control.peer_name(), code));
        }
        statuses[mine[j]] =
            code == 0 ? absl::OkStatus()
                      : absl::Status(static_cast<absl::StatusCode>(code),
                                     absl::StrFormat("upsert refused by %s", control.peer_name()));
      }
    }
  }
  return statuses;
}

absl::StatusOr<std::string> Client::ServerStats(uint32_t shard) {
  if (shard >= shards()) {
    return absl::InvalidArgumentError(absl::StrFormat("shard %u of %u", shard, shards()));
  }
  absl::StatusOr<transport::control::MessageChannel*> channel = ControlOf(shard);
  if (!channel.ok()) return channel.status();
  transport::control::MessageChannel& control = **channel;
  if (absl::Status s = control.Send(kHopStatsRequest, {}); !s.ok()) return s;
  absl::StatusOr<Message> m = Expect(control, kHopStats, options_.timeout);
  if (!m.ok()) return m.status();
  return std::string(m->payload.begin(), m->payload.end());
}

}  // namespace hopscotch
