// Replication on a backup (issue 16): it prepares each worker's redo area and reader, admits one
// primary at a time on its replication port, serves replica reads under a lease, and is
// promoted. The primary's side is in member_primary.cc.
#include <cstring>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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

// A primary's replication hello must arrive this soon after it connects (a primary sends it at
// once; a connector that sends nothing holds the replication thread no longer than this).
constexpr absl::Duration kReplicaHandshakeTimeout = absl::Seconds(2);
// At promotion each partition's version clock jumps this far: past every version the dead
// primary may have handed out beyond what the backup holds (at most a few batches in flight).
constexpr uint64_t kPromotionVersionGap = uint64_t{1} << 32;
// How often the backup's replication thread looks for a new primary, or for its primary's
// departure.
constexpr absl::Duration kReplicationPollInterval = absl::Milliseconds(20);
// A backup's end of a link receives nothing and sends nothing.
constexpr uint32_t kBackupQpDepth = 1;
// A coordinated backup asks for its read lease this many times per lease length (a lost or late
// grant or two leave it serving).
constexpr int64_t kLeaseRenewalsPerLease = 4;

}  // namespace

absl::Status ReplicationMember::PrepareReplica() {
  const ReplicationServerOptions& ro = options_;
  for (WorkerReplication& r : workers_) {
    absl::StatusOr<transport::SharedMemory> redo = transport::SharedMemory::Allocate(
        RedoAreaBytes(ro.gate.staging_bytes), "herd-redo", region_pages_);
    if (!redo.ok()) return redo.status();
    r.redo = std::make_unique<transport::SharedMemory>(*std::move(redo));
    std::memset(r.redo->data(), 0, kRedoCommitLineBytes);  // nothing committed, nothing landing
    r.reader = std::make_unique<ReplicaReader>(r.partition, r.redo->data(), &reads_refused_,
                                               ro.coordinated() ? &read_lease_ : nullptr);
  }
  absl::StatusOr<transport::control::Listener> listener =
      transport::control::Listener::Listen(ro.listen_address, ro.port);
  if (!listener.ok()) return listener.status();
  replication_listener_ = std::make_unique<transport::control::Listener>(*std::move(listener));
  return absl::OkStatus();
}

void ReplicationMember::ServeReplication() {
  const bool coordinated = options_.coordinated();
  while (!host_.stopping()) {
    if (primary_ != nullptr && coordinated) {
      Configuration now;
      {
        util::MutexLock lock(&published_mutex_);
        now = published_;
      }
      if (now.epoch > attached_epoch_ && now.primary != attached_member_) {
        // Fenced: a newer epoch has another primary. Its QPs go to error before anything else
        // (nothing it sends lands from now on), and this copy, which may hold its unacknowledged
        // writes, serves nothing until a state transfer from the new primary replaces it.
        LOG(WARNING) << "epoch " << now.epoch << "'s primary is " << now.primary << ": detaching "
                     << attached_member_ << " of epoch " << attached_epoch_;
        stale_.store(true);
        reads_refused_.store(true);
        DetachPrimary();
        continue;
      }
      if (absl::Now() >= next_lease_request_) {
        next_lease_request_ = absl::Now() + options_.read_lease / kLeaseRenewalsPerLease;
        const int64_t sent = util::Lease::NowNs();
        (void)primary_->channel->Send(
            kLeaseRequest,
            transport::control::WireWriter().U64(static_cast<uint64_t>(sent)).Take());
      }
    }
    if (primary_ != nullptr) {
      // The primary's only message: it dropped this backup (it went on without it, so this
      // copy misses acknowledged writes from then on): stale for good.
      absl::StatusOr<transport::control::Message> message =
          primary_->channel->Receive(absl::ZeroDuration());
      while (message.ok() && message->type == kLeaseGrant) {
        // The lease runs from when its request was sent (this clock): never past what the
        // primary can bound from when it received it.
        transport::control::WireReader r(message->payload, "lease grant");
        uint64_t sent = 0;
        if (r.U64(&sent) && r.Finish().ok() && sent <= static_cast<uint64_t>(INT64_MAX)) {
          read_lease_.ExtendTo(static_cast<int64_t>(sent) +
                               absl::ToInt64Nanoseconds(options_.read_lease));
        }
        message = primary_->channel->Receive(absl::ZeroDuration());
      }
      if (message.ok() && message->type == kReplicaDropped) {
        LOG(ERROR) << "the primary dropped this backup: its copy is stale from now on (GETs "
                      "answer BACKUP_BUSY, promotion is refused)";
        stale_.store(true);
        reads_refused_.store(true);
      }
      if (message.ok() && message->type == kReplicaSynced && syncing_.load()) {
        // The whole state was copied over whatever this backup held: not stale any more.
        LOG(INFO) << "the state transfer is complete: serving reads";
        stale_.store(false);
        syncing_.store(false);
        reads_refused_.store(false);
      }
      if (primary_->channel->PeerClosed()) {
        if (syncing_.load()) {
          // Half a state transfer is no copy of anything: never read, never promoted.
          LOG(ERROR) << "the primary left during the state transfer: this backup's copy is "
                        "incomplete (restart it empty)";
          stale_.store(true);
          reads_refused_.store(true);
        }
        LOG(WARNING) << "the primary (" << primary_->channel->peer_name() << ") left"
                     << (stale_.load() ? ""
                                       : ": this backup keeps its last state and serves reads");
        DetachPrimary();
      }
    }
    absl::StatusOr<transport::control::Channel> channel =
        replication_listener_->Accept(kReplicationPollInterval);
    if (!channel.ok()) continue;  // none came
    const std::string peer = channel->peer_name();
    absl::Status status = AttachPrimary(*channel);
    if (status.ok()) {
      LOG(INFO) << "primary " << peer << " attached";
      continue;
    }
    LOG(WARNING) << "primary " << peer << " not attached: " << status;
    (void)channel->Send(kError, transport::control::WireWriter().Bytes(status.ToString()).Take());
  }
  DetachPrimary();
}

absl::Status ReplicationMember::AttachPrimary(transport::control::Channel& channel) {
  const Config& c = config_;
  // The hello first, without the lock: a connector that sends nothing must not hold up a
  // promotion (which takes the lock on the clients' control thread).
  absl::StatusOr<transport::control::Message> message = channel.Receive(kReplicaHandshakeTimeout);
  if (!message.ok()) return message.status();
  util::MutexLock lock(&replication_mutex_);
  if (promoting_) {
    return absl::FailedPreconditionError(
        "this backup was promoted: it is a primary now and follows no one");
  }
  if (primary_ != nullptr) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "primary %s is attached; a backup follows one primary", primary_->channel->peer_name()));
  }
  absl::StatusOr<ReplicaHello> early = message->type == kReplicaHello
                                           ? DecodeReplicaHello(message->payload, c.workers)
                                           : absl::InvalidArgumentError("not a hello");
  if (ever_attached_ && !(early.ok() && early->transfer)) {
    // It followed an earlier primary and holds its data (possibly a half-landed first chain,
    // before any header says so): a new primary mirroring only what it changes from now on
    // would leave it a mix. A primary that transfers its whole state may take it over.
    return absl::FailedPreconditionError(
        "this backup holds data written by an earlier primary; only a primary that transfers "
        "its state to it (a rejoin) may attach");
  }
  if (message->type != kReplicaHello) {
    return absl::InvalidArgumentError(
        absl::StrFormat("control message %d where a replica hello was expected", message->type));
  }
  absl::StatusOr<ReplicaHello> hello = DecodeReplicaHello(message->payload, c.workers);
  if (!hello.ok()) return hello.status();
  if (options_.coordinated()) {
    // Fencing: only the primary of the configuration in force, and only with a transfer (this
    // copy may hold another epoch's writes).
    Configuration now;
    {
      util::MutexLock published(&published_mutex_);
      now = published_;
    }
    if (hello->epoch != now.epoch || hello->member != now.primary) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s of epoch %d is not the primary of this backup's configuration (%s)",
                          hello->member, hello->epoch, now.ToString()));
    }
    if (!hello->transfer) {
      return absl::FailedPreconditionError(
          "a coordinated backup is attached only with a state transfer");
    }
  }
  if (hello->workers != c.workers) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the primary has %d workers, this backup %d (--workers must match)",
                        hello->workers, c.workers));
  }
  if (hello->max_clients != c.max_clients || hello->window != c.window) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the primary has --max_clients=%d --window=%d, this backup %d and %d (they index the "
        "replicated mutation outcomes: they must match)",
        hello->max_clients, hello->window, c.max_clients, c.window));
  }
  if (hello->staging_bytes != options_.gate.staging_bytes) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the primary's staging ring is %d bytes, this backup's redo areas hold %d "
                        "(--replication_staging_bytes must match)",
                        hello->staging_bytes, options_.gate.staging_bytes));
  }
  for (uint32_t w = 0; w < c.workers; ++w) {
    const mica::Partition& partition = *workers_[w].partition;
    if (absl::Status s = CheckSameLayout(hello->layout, LayoutOf(partition)); !s.ok()) return s;
  }
  auto attachment = std::make_unique<Attachment>();
  if (absl::Status s = Take(host_.device().AllocatePd(), &attachment->pd); !s.ok()) return s;
  if (absl::Status s = Take(host_.device().CreateCq(c.workers * 2 + 1), &attachment->cq); !s.ok()) {
    return s;
  }
  ReplicaWelcome welcome;
  for (uint32_t w = 0; w < c.workers; ++w) {
    WorkerReplication& r = workers_[w];
    const mica::MirroredRegion& region = r.partition->region();
    std::unique_ptr<transport::MemoryRegion> region_mr, redo_mr;
    constexpr auto kWritable = transport::kLocalWrite | transport::kRemoteWrite;
    if (absl::Status s =
            Take(attachment->pd->RegisterMemory(region.base(), region.mapped_bytes(), kWritable),
                 &region_mr);
        !s.ok()) {
      return s;
    }
    std::memset(r.redo->data(), 0, kRedoCommitLineBytes);  // a new stream: nothing committed
    if (absl::Status s = Take(
            attachment->pd->RegisterMemory(r.redo->data(), r.redo->size(), kWritable), &redo_mr);
        !s.ok()) {
      return s;
    }
    transport::QpConfig qc;
    qc.type = transport::QpType::kRc;
    qc.send_cq = attachment->cq.get();
    qc.recv_cq = attachment->cq.get();
    qc.max_send_wr = kBackupQpDepth;
    qc.max_recv_wr = kBackupQpDepth;
    qc.max_inline_data = 0;
    std::unique_ptr<transport::QueuePair> qp;
    if (absl::Status s = Take(attachment->pd->CreateQp(qc), &qp); !s.ok()) return s;
    transport::ConnectConfig connect;
    connect.remote = hello->link_qps[w];
    if (absl::Status s = qp->Connect(connect); !s.ok()) return s;
    welcome.partitions.push_back(ReplicaPartition{
        qp->endpoint(), reinterpret_cast<uint64_t>(region.base()), region_mr->rkey(),
        reinterpret_cast<uint64_t>(r.redo->data()), redo_mr->rkey()});
    attachment->qps.push_back(std::move(qp));
    attachment->mrs.push_back(std::move(region_mr));
    attachment->mrs.push_back(std::move(redo_mr));
  }
  const bool refused_before = reads_refused_.load();
  if (hello->transfer) {
    // Its partitions are copied while the primary runs: nothing here (not even this empty
    // region's misses) is a state until the primary says the transfer is complete. Before the
    // welcome: the transfer starts once the primary has it.
    syncing_.store(true);
    reads_refused_.store(true);
  }
  if (absl::Status s = channel.Send(kReplicaWelcome, Encode(welcome)); !s.ok()) {
    syncing_.store(false);  // never attached: nothing will land
    reads_refused_.store(refused_before);
    return s;
  }
  // A first primary that transfers nothing starts from the same empty state as this backup.
  if (!hello->transfer) reads_refused_.store(stale_.load());
  KeepReplicationChannelAlive(channel);
  ever_attached_ = true;
  attached_epoch_ = hello->epoch;
  attached_member_ = hello->member;
  next_lease_request_ = absl::InfinitePast();
  attachment->channel = std::make_unique<transport::control::Channel>(std::move(channel));
  primary_ = std::move(attachment);
  primary_attached_.store(true);
  return absl::OkStatus();
}

void ReplicationMember::DetachPrimary() {
  util::MutexLock lock(&replication_mutex_);
  if (primary_ == nullptr) return;
  // Its QPs first: nothing it still sends lands once they are gone; then its MRs and PD.
  for (auto& qp : primary_->qps) qp->SetError();
  primary_.reset();
  primary_attached_.store(false);
  // Nothing lands any more: a chain the primary left cut is finished now (replayed from its
  // committed record) and the commit line cleared, so reads are confirmed at once again instead
  // of answering BACKUP_BUSY until a promotion. (A later promotion replays nothing more.)
  const std::vector<std::string> failures = RunOnWorkers(/*take_writes=*/false);
  if (!failures.empty()) {
    LOG(ERROR) << "settling the replica after its primary left: " << absl::StrJoin(failures, "; ");
  }
}

std::vector<std::string> ReplicationMember::RunOnWorkers(bool take_writes, bool make_gates) {
  std::vector<std::unique_ptr<ReplicaTask>> tasks;
  for (WorkerReplication& r : workers_) {
    auto task = std::make_unique<ReplicaTask>();
    task->take_writes = take_writes;
    if (make_gates) {
      // After the takeover (the version clock jumped): the gate's released clock starts there.
      // Every slot vacant: registered members join by state transfer.
      WorkerReplication* resources = &r;
      task->make_gate = [this, resources](mica::Partition& partition) -> ResponseGate* {
        absl::StatusOr<std::unique_ptr<ReplicationGate>> gate = ReplicationGate::Create(
            &partition, replication_pd_.get(), resources->replication_cq.get(),
            std::vector<BackupLink>(kMaxBackups), GateOptions());
        if (!gate.ok()) {
          LOG(ERROR) << "the promoted worker takes no backups: " << gate.status();
          return nullptr;
        }
        resources->gate = *std::move(gate);
        return resources->gate.get();
      };
    }
    transport::SharedMemory* redo = r.redo.get();
    task->apply = [redo, take_writes](mica::Partition& partition) -> absl::Status {
      const mica::MirroredRegion& region = partition.region();
      if (absl::Status s = ReplayLastBatch(absl::MakeConstSpan(redo->data(), redo->size()),
                                           absl::MakeSpan(region.base(), region.mapped_bytes()));
          !s.ok()) {
        return s;
      }
      ClearCommitLine(redo->data());
      if (!take_writes) return absl::OkStatus();
      if (absl::Status s = partition.ResumeFromRegion(); !s.ok()) return s;
      // Versions the dead primary handed out for writes no backup received (answers held, or
      // read by a GET) are never handed out again: the clock jumps past any of them.
      partition.AdvanceVersionClock(kPromotionVersionGap);
      return absl::OkStatus();
    };
    tasks.push_back(std::move(task));
  }
  std::vector<ReplicaTask*> each;
  for (const std::unique_ptr<ReplicaTask>& task : tasks) each.push_back(task.get());
  return host_.RunOnWorkers(each);
}

absl::StatusOr<std::string> ReplicationMember::PromoteManually() {
  if (role_.configured() != ReplicationRole::kBackup) {
    return absl::FailedPreconditionError(
        "this server is not a backup (--role=backup): there is nothing to promote");
  }
  {
    util::MutexLock lock(&replication_mutex_);
    if (role_.promoted()) return std::string("{\"promoted\":true,\"already\":true}");
    if (role_.fenced()) {
      return absl::FailedPreconditionError(
          "this server was fenced (a takeover failed half way): restart it to serve again");
    }
    if (promoting_)
      return absl::FailedPreconditionError("an earlier promotion of this backup failed");
    if (primary_ != nullptr) {
      // Two primaries would diverge: the old one must be gone (its connection closed, or its
      // keepalive expired) first.
      return absl::FailedPreconditionError(absl::StrFormat(
          "its primary %s is still attached: promote a backup only once its primary is gone",
          primary_->channel->peer_name()));
    }
    if (!ever_attached_) {
      return absl::FailedPreconditionError(
          "this backup never had a primary: there is nothing to take over");
    }
    if (syncing_.load()) {
      return absl::FailedPreconditionError(
          "this backup's state transfer has not completed (or its primary left during it): its "
          "copy is incomplete; promote another");
    }
    if (stale_.load()) {
      return absl::FailedPreconditionError(
          "its primary dropped this backup (it went on acknowledging writes without it): its "
          "copy misses acknowledged writes; promote another backup");
    }
    promoting_ = true;  // no primary attaches from now on
  }
  const absl::Time start = absl::Now();
  const std::vector<std::string> failures = RunOnWorkers(/*take_writes=*/true);
  if (!failures.empty()) {
    // Workers that succeeded take writes for their partitions; the others stay replicas. Loud.
    LOG(ERROR) << "promotion failed: " << absl::StrJoin(failures, "; ");
    return absl::DataLossError(absl::StrCat("promotion failed: ", absl::StrJoin(failures, "; ")));
  }
  if (!role_.Promote()) {
    // Checked under replication_mutex_ above; only a Fence meanwhile (coordinated servers, which
    // never come here) could refuse it.
    LOG(DFATAL) << "the promotion of this backup was refused after its workers took writes";
  }
  LOG(INFO) << "promoted: this server is the primary now (" << workers_.size() << " partitions, "
            << absl::FormatDuration(absl::Now() - start) << ")";
  return absl::StrFormat("{\"promoted\":true,\"workers\":%d,\"seconds\":%.6f}", workers_.size(),
                         absl::ToDoubleSeconds(absl::Now() - start));
}

}  // namespace herd
