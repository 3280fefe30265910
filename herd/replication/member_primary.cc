// Replication on a primary (issue 16): it attaches to its backups at start, hands each worker
// a ReplicationGate, watches its links and attaches lost backups again. The backup's side is in
// member_backup.cc.

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <system_error>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "herd/join.h"
#include "herd/replication/link.h"
#include "herd/replication/log.h"
#include "herd/replication/member.h"
#include "transport/control/wire.h"
#include "util/take.h"

namespace herd {
namespace {

using util::Take;

// TCP keepalive on replication channels: a peer whose machine died (no FIN ever comes) counts as
// gone after about idle + interval x probes.
constexpr absl::Duration kKeepaliveIdle = absl::Seconds(1);
constexpr absl::Duration kKeepaliveInterval = absl::Seconds(1);
constexpr int kKeepaliveProbes = 3;
// How often a primary tries to attach a lost backup again, and how long one try may take (on a
// thread of its own: StartRejoin).
constexpr absl::Duration kRejoinInterval = absl::Seconds(1);
// ... and with a coordinator, where every attach is a (re)join of a registered member.
constexpr absl::Duration kCoordinatedRejoinInterval = absl::Milliseconds(200);
constexpr absl::Duration kRejoinConnectTimeout = absl::Milliseconds(200);
// ... and how long its welcome may take once connected: the backup registers its partitions
// first (seconds for large ones).
constexpr absl::Duration kRejoinWelcomeTimeout = absl::Seconds(10);
// How often an attach waiting for a backup's welcome looks whether the server is stopping.
constexpr absl::Duration kStopSlice = absl::Milliseconds(50);

// Whether `channel` has bytes (or a close) to read within `timeout`.
bool Readable(const transport::control::Channel& channel, absl::Duration timeout) {
  pollfd p{channel.fd(), POLLIN, 0};
  return poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) > 0;
}
// Completion queue entries beyond a full window of every link: error completions at teardown.
constexpr uint32_t kReplicationCqSlack = 64;

}  // namespace

void ReplicationMember::KeepReplicationChannelAlive(transport::control::Channel& channel) {
  if (absl::Status s =
          channel.EnableKeepalive(kKeepaliveIdle, kKeepaliveInterval, kKeepaliveProbes);
      !s.ok()) {
    LOG(WARNING) << "replication channel keepalive: " << s;
  }
}

absl::Status ReplicationMember::AttachToBackups() {
  const Config& c = config_;
  const ReplicationServerOptions& ro = options_;
  if (ro.backups.empty() && !ro.coordinated()) {
    return absl::InvalidArgumentError(
        "--role=primary needs --backups=HOST:PORT[,HOST:PORT...] (or --coordinator)");
  }
  if (!ro.backups.empty() && ro.coordinated()) {
    return absl::InvalidArgumentError(
        "--backups with --coordinator: coordinated backups register with the coordinator and the "
        "primary attaches them; drop --backups");
  }
  // One batch's record must hold a batch of small writes and, with large values, one large
  // write: the worker admits large writes only while they fit (LargeWritesAllowed).
  const uint64_t needed =
      SmallBatchRecordBytes(c) + (c.large_values() ? LargeWriteRecordBytes(c) : 0);
  if (MaxRecordBytes(ro.gate.staging_bytes) < needed) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--replication_staging_bytes=%d is too small: one batch's record (a third of the ring) "
        "must hold %d bytes (--postlist small writes%s); use at least %d",
        ro.gate.staging_bytes, needed, c.large_values() ? " and one largest value" : "",
        3 * (needed + sizeof(RedoHeader) + 64)));
  }
  const uint64_t depth = LinkSendQueueDepth(ro.gate);
  if (depth > UINT32_MAX / (ro.coordinated() ? kMaxBackups : ro.backups.size())) {
    return absl::InvalidArgumentError("replication: the links' queues are too deep");
  }
  transport::Device* device = &host_.device();
  if (ro.device.has_value()) {
    if (absl::Status s = Take(transport::OpenDevice(*ro.device), &replication_device_); !s.ok()) {
      return s;
    }
    device = replication_device_.get();
  }
  if (absl::Status s = PrepareLinks(device); !s.ok()) return s;
  if (ro.coordinated()) {
    // Every slot vacant: members that register join by state transfer (Coordinate).
    return CreateGates(
        std::vector<std::vector<BackupLink>>(c.workers, std::vector<BackupLink>(kMaxBackups)));
  }
  std::vector<std::vector<BackupLink>> links(c.workers);
  for (const std::string& address : ro.backups) {
    Attach attach = ConnectBackup(address, HelloForBackup(/*transfer=*/false), ro.connect_timeout,
                                  ro.connect_timeout);
    if (!attach.channel.ok()) return attach.channel.status();
    KeepLinkQps(attach);
    for (uint32_t w = 0; w < c.workers; ++w) links[w].push_back(attach.links[w]);
    LOG(INFO) << "replicating to backup " << address << " (" << c.workers << " partitions)";
    backup_channels_.push_back(
        std::make_unique<transport::control::Channel>(*std::move(attach.channel)));
  }
  backup_states_.assign(backup_channels_.size(), BackupState::kLive);
  next_rejoin_.assign(backup_channels_.size(), absl::InfinitePast());
  rejoining_.resize(backup_channels_.size());
  backup_addresses_ = ro.backups;
  return CreateGates(links);
}

absl::Status ReplicationMember::PrepareLinks(transport::Device* device) {
  const ReplicationServerOptions& ro = options_;
  const size_t slots = ro.coordinated() ? kMaxBackups : ro.backups.size();
  if (absl::Status s = Take(device->AllocatePd(), &replication_pd_); !s.ok()) return s;
  for (WorkerReplication& r : workers_) {
    const auto cq_depth =
        static_cast<uint32_t>(LinkSendQueueDepth(ro.gate) * slots + kReplicationCqSlack);
    if (absl::Status s = Take(device->CreateCq(cq_depth), &r.replication_cq); !s.ok()) return s;
  }
  if (ro.coordinated()) {
    backup_channels_.clear();
    for (size_t b = 0; b < kMaxBackups; ++b) {
      backup_channels_.push_back(std::make_unique<transport::control::Channel>(-1));
    }
    backup_states_.assign(kMaxBackups, BackupState::kVacant);
    next_rejoin_.assign(kMaxBackups, absl::InfinitePast());
    rejoining_.resize(kMaxBackups);
    backup_addresses_.assign(kMaxBackups, "");
    backup_members_.assign(kMaxBackups, "");
    lease_granted_.assign(kMaxBackups, kNeverGranted);
    drop_after_.assign(kMaxBackups, kNeverGranted);
  }
  return absl::OkStatus();
}

ReplicationOptions ReplicationMember::GateOptions() const {
  ReplicationOptions options = options_.gate;
  options.drops_need_consent = options_.coordinated();
  return options;
}

absl::Status ReplicationMember::CreateGates(const std::vector<std::vector<BackupLink>>& links) {
  for (uint32_t w = 0; w < config_.workers; ++w) {
    WorkerReplication& r = workers_[w];
    if (absl::Status s =
            Take(ReplicationGate::Create(r.partition, replication_pd_.get(), r.replication_cq.get(),
                                         links[w], GateOptions()),
                 &r.gate);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

ReplicaHello ReplicationMember::HelloForBackup(bool transfer) const {
  const Config& c = config_;
  const ReplicationServerOptions& ro = options_;
  ReplicaHello hello;
  hello.workers = c.workers;
  hello.staging_bytes = ro.gate.staging_bytes;
  hello.layout = LayoutOf(*workers_[0].partition);
  hello.transfer = transfer;
  hello.max_clients = c.max_clients;
  hello.window = c.window;
  hello.epoch = held_.epoch;
  hello.member = ro.member;
  return hello;
}

ReplicationMember::Attach ReplicationMember::ConnectBackup(const std::string& address,
                                                           ReplicaHello hello,
                                                           absl::Duration timeout,
                                                           absl::Duration welcome_timeout) {
  const Config& c = config_;
  Attach attach;
  attach.address = address;
  auto fail = [&attach](absl::Status status) {
    attach.channel = std::move(status);
    attach.links.clear();
    return std::move(attach);
  };
  absl::StatusOr<transport::control::Channel> channel =
      transport::control::Channel::Connect(address, timeout);
  if (!channel.ok()) {
    return fail(absl::UnavailableError(
        absl::StrFormat("backup %s: %s", address, channel.status().ToString())));
  }
  for (WorkerReplication& r : workers_) {
    transport::QpConfig qc;
    qc.type = transport::QpType::kRc;
    qc.send_cq = r.replication_cq.get();
    qc.recv_cq = r.replication_cq.get();  // receives nothing
    qc.max_send_wr = static_cast<uint32_t>(LinkSendQueueDepth(options_.gate));
    qc.max_recv_wr = 1;
    qc.max_inline_data = 0;
    std::unique_ptr<transport::QueuePair> qp;
    if (absl::Status s = Take(replication_pd_->CreateQp(qc), &qp); !s.ok()) return fail(s);
    hello.link_qps.push_back(qp->endpoint());
    attach.qps.push_back(std::move(qp));
  }
  if (absl::Status s = channel->Send(kReplicaHello, Encode(hello)); !s.ok()) return fail(s);
  // The welcome is awaited in slices while the server runs: a Stop ends an attach to a silent
  // (paused, cut off) backup within a slice instead of the welcome timeout.
  const absl::Time welcome_deadline = absl::Now() + welcome_timeout;
  while (!Readable(*channel, kStopSlice)) {
    if (host_.stopping() || absl::Now() >= welcome_deadline) break;
  }
  if (host_.stopping()) return fail(absl::CancelledError("the server is stopping"));
  absl::StatusOr<transport::control::Message> reply = Expect(
      *channel, kReplicaWelcome, std::max(welcome_deadline - absl::Now(), absl::ZeroDuration()));
  if (!reply.ok()) {
    return fail(absl::FailedPreconditionError(
        absl::StrFormat("backup %s refused this primary: %s", address, reply.status().message())));
  }
  absl::StatusOr<ReplicaWelcome> welcome = DecodeReplicaWelcome(reply->payload, c.workers);
  if (!welcome.ok()) return fail(welcome.status());
  for (uint32_t w = 0; w < c.workers; ++w) {
    const ReplicaPartition& p = welcome->partitions[w];
    transport::ConnectConfig connect;
    connect.remote = p.qp;
    if (absl::Status s = attach.qps[w]->Connect(connect); !s.ok()) return fail(s);
    attach.links.push_back(
        BackupLink{attach.qps[w].get(), p.region_addr, p.region_rkey, p.redo_addr, p.redo_rkey});
  }
  KeepReplicationChannelAlive(*channel);
  attach.channel = *std::move(channel);
  return attach;
}

void ReplicationMember::KeepLinkQps(Attach& attach) {
  for (size_t w = 0; w < attach.qps.size(); ++w) {
    workers_[w].backup_qps.push_back(std::move(attach.qps[w]));
  }
  attach.qps.clear();
}

void ReplicationMember::WatchBackups() {
  const absl::Time now = absl::Now();
  const bool coordinated = options_.coordinated();
  for (size_t b = 0; b < backup_channels_.size(); ++b) {
    const std::string& address = backup_addresses_[b];
    if (rejoining_[b].valid() &&
        rejoining_[b].wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      FinishRejoin(b);
    }
    if (backup_states_[b] == BackupState::kVacant) continue;
    if (backup_states_[b] == BackupState::kDropping) {
      SettleDrop(b);
      continue;
    }
    if (backup_states_[b] == BackupState::kLost) {
      if (!rejoining_[b].valid() && now >= next_rejoin_[b]) {
        next_rejoin_[b] = now + (coordinated ? kCoordinatedRejoinInterval : kRejoinInterval);
        StartRejoin(b);
      }
      continue;
    }
    const bool closed = backup_channels_[b]->PeerClosed();
    bool dropped = false;
    for (const WorkerReplication& r : workers_) dropped = dropped || r.gate->dropped(b);
    if (closed || dropped) {
      // Closed: it died or restarted. Dropped by a gate (an error, a stall, an oversize batch):
      // its copy misses acknowledged writes from now on; told so, it answers no more reads and
      // refuses a promotion. Every gate drops it, and the connection closes. It may come back
      // (StartRejoin) as an empty backup, brought up to date by state transfer.
      LOG(WARNING) << "backup " << address
                   << (closed ? " closed its control connection" : " dropped")
                   << ": serving degraded";
      for (WorkerReplication& r : workers_) r.gate->RequestDrop(b);
      if (!closed) (void)backup_channels_[b]->Send(kReplicaDropped, {});
      backup_channels_[b] = std::make_unique<transport::control::Channel>(-1);  // closes it
      if (coordinated) {
        // Its gates hold releases until the configuration no longer lists it, once its read
        // lease ran out (a member still joining never had one, nor a place to lose).
        drop_after_[b] = backup_states_[b] == BackupState::kLive
                             ? lease_granted_[b] + absl::ToInt64Nanoseconds(LeaseWait())
                             : kNeverGranted;
        backup_states_[b] = BackupState::kDropping;
        continue;
      }
      backup_states_[b] = BackupState::kLost;
      next_rejoin_[b] = now + kRejoinInterval;
      continue;
    }
    if (coordinated && backup_states_[b] == BackupState::kLive) AnswerLeaseRequests(b);
    if (backup_states_[b] == BackupState::kJoining) {
      bool synced = true;
      for (const WorkerReplication& r : workers_) synced = synced && r.gate->synced(b);
      if (!synced) continue;
      if (coordinated && !CommitAddition(b)) continue;  // tried again on the next pass
      (void)backup_channels_[b]->Send(kReplicaSynced, {});
      backup_states_[b] = BackupState::kLive;
      LOG(INFO) << "backup " << address << " is up to date: replicating to it again";
    }
  }
}

void ReplicationMember::StartRejoin(size_t b) {
  // Every gate must have let go of the old link first (RequestDrop takes up to
  // kStallCheckEvery of a worker's loops, a consent one loop).
  for (const WorkerReplication& r : workers_) {
    if (!r.gate->dropped(b) || r.gate->drop_unsettled(b)) return;
  }
  try {
    rejoining_[b] = std::async(
        std::launch::async, [this, address = backup_addresses_[b],
                             member = backup_members_.empty() ? std::string() : backup_members_[b],
                             hello = HelloForBackup(/*transfer=*/true)]() mutable {
          Attach attach = ConnectBackup(address, std::move(hello), kRejoinConnectTimeout,
                                        kRejoinWelcomeTimeout);
          attach.member = member;
          return attach;
        });
  } catch (const std::system_error& e) {
    // No thread to be had now: tried again after the rejoin interval.
    LOG(WARNING) << "backup " << backup_addresses_[b] << ": no thread for an attach: " << e.what();
  }
}

void ReplicationMember::FinishRejoin(size_t b) {
  Attach attach = rejoining_[b].get();
  if (!attach.channel.ok()) {
    VLOG(1) << "backup " << attach.address << " not back yet: " << attach.channel.status();
    return;
  }
  // Made for this slot as it still is: the same backup, still lost (a slot freed or given to
  // another member meanwhile: the attach is let go, and its channel's closing tells the
  // backup). A newer epoch of this primary's own making (another slot's addition or removal)
  // changes nothing for it: the backup took the hello as from its current primary, and a
  // fenced primary runs no WatchBackups at all.
  const std::string& member = backup_members_.empty() ? std::string() : backup_members_[b];
  if (backup_states_[b] != BackupState::kLost || attach.address != backup_addresses_[b] ||
      attach.member != member) {
    LOG(INFO) << "backup " << attach.address << ": an attach made for another configuration "
              << "of this slot is let go";
    return;
  }
  KeepLinkQps(attach);
  for (uint32_t w = 0; w < workers_.size(); ++w) {
    if (!workers_[w].gate->OfferLink(b, attach.links[w])) {
      // Only a gate that took an earlier offer could refuse: never left half-joined.
      LOG(ERROR) << "backup " << attach.address << ": worker " << w << " refused the new link";
      for (WorkerReplication& r : workers_) r.gate->RequestDrop(b);
      return;  // the channel closes: the backup sees its primary leave while syncing
    }
  }
  LOG(INFO) << "backup " << attach.address << " rejoined: transferring the partitions' state";
  backup_channels_[b] = std::make_unique<transport::control::Channel>(*std::move(attach.channel));
  backup_states_[b] = BackupState::kJoining;
}

}  // namespace herd
