// Coordinated replication on the server (issue 35): the configuration in ZooKeeper decides who
// is primary and which backups count; this file is the control thread's side of it. The rules
// it applies are herd/replication/configuration.h's; what each epoch fences is described in
// docs/architecture.md ("Configurations, fencing and leases").
//
// A primary: renews its lease on its place (a round trip to the coordinator every quarter of
// the session timeout; its workers serve while it holds, half a session timeout past each
// round trip's start, so it has lapsed before the coordinator can have ended the session and
// let a backup take over); attaches every registered member as a backup by state transfer and
// commits its addition once synced; grants the backups' read leases; and, when a backup drops
// out, waits out its read lease and commits its removal before its gates go on without it. A
// newer epoch with another primary, or a lost session, fences it for good.
//
// A backup: publishes the configuration to its replication thread (which takes only that
// epoch's primary and detaches an older one); and, when the primary's registration is gone and
// it is an in-sync backup of the epoch, takes over by the conditional write (automatic failover)
// and serves as the primary of the new epoch, which takes backups again.
#include <algorithm>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "herd/join.h"
#include "herd/replication/member.h"

namespace herd {
namespace {

// Watches report every change; without one the control thread reads the configuration this
// often anyway (each read is a round trip to the coordinator: on a small machine its CPU is
// the clients').
constexpr absl::Duration kCoordinationInterval = absl::Seconds(1);
// A primary confirms its session this many times per session timeout (its lease keeper thread,
// which looks for the server's stop this often) ...
constexpr absl::Duration kLeaseKeeperPoll = absl::Milliseconds(10);
constexpr int64_t kConfirmsPerSession = 4;
// ... and serves until this fraction of a session timeout past a confirmation's start: the
// coordinator ends a session no sooner than a full timeout after the last message it got.
constexpr int64_t kPrimaryLeaseDivisor = 2;
// What a lease's waiter adds for the two clocks' drift and for scheduling: a tenth of the lease
// and this much.
constexpr absl::Duration kLeaseMarginFloor = absl::Milliseconds(20);
// How long a takeover waits for the old primary's detachment (the replication thread polls
// every 20 ms).
constexpr absl::Duration kDetachTimeout = absl::Seconds(5);
// How long a restarted member waits for its previous life's registration to expire.
constexpr absl::Duration kRegisterSlack = absl::Seconds(2);
constexpr absl::Duration kRegisterRetry = absl::Milliseconds(50);
// How long a former primary restarted as a backup waits for another member to take over.
constexpr absl::Duration kFormerPrimaryWait = absl::Minutes(5);

std::string HostPort(const std::string& host, uint16_t port) {
  return absl::StrFormat("%s:%d", host, port);
}

}  // namespace

bool ReplicationMember::HoldsWholeCopy() {
  // The configuration may list this member from an earlier life (killed and restarted before
  // the primary dropped it): only a transfer completed in this life makes its copy whole.
  util::MutexLock lock(&replication_mutex_);
  return ever_attached_ && !stale_.load() && !syncing_.load();
}

absl::Duration ReplicationMember::LeaseWait() const {
  const absl::Duration lease = options_.read_lease;
  return lease + lease / 10 + kLeaseMarginFloor;
}

absl::Status ReplicationMember::JoinCluster() {
  const ReplicationServerOptions& ro = options_;
  if (absl::Status s = CheckMemberName(ro.member); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--member: ", s.message()));
  }
  if (LeaseWait() > ro.coordinator.session_timeout / kPrimaryLeaseDivisor) {
    // A backup's read lease must end before a new primary can exist (docs/architecture.md).
    return absl::InvalidArgumentError(absl::StrFormat(
        "--read_lease_ms=%d is too long for --session_timeout_ms=%d: the lease and its margin "
        "(%s) must fit in half the session timeout",
        absl::ToInt64Milliseconds(ro.read_lease),
        absl::ToInt64Milliseconds(ro.coordinator.session_timeout),
        absl::FormatDuration(LeaseWait())));
  }
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator = Coordinator::Connect(ro.coordinator);
  if (!coordinator.ok()) return coordinator.status();
  coordinator_ = *std::move(coordinator);
  if (LeaseWait() > coordinator_->session_timeout() / kPrimaryLeaseDivisor) {
    // The service bounds sessions to its own range: what counts is what it granted.
    return absl::InvalidArgumentError(absl::StrFormat(
        "--read_lease_ms=%d does not fit the session the coordinator granted (%s of the %s "
        "asked): the lease and its margin (%s) must fit in half of it",
        absl::ToInt64Milliseconds(ro.read_lease),
        absl::FormatDuration(coordinator_->session_timeout()),
        absl::FormatDuration(ro.coordinator.session_timeout), absl::FormatDuration(LeaseWait())));
  }
  if (role_.configured() == ReplicationRole::kPrimary) {
    // A new cluster's first configuration. A cluster that has one has a primary (or had): this
    // server's empty store is no copy of it, so it joins as a backup instead.
    Configuration first;
    first.epoch = 1;
    first.primary = ro.member;
    first.primary_session = coordinator_->session_id();
    absl::Status created = coordinator_->CreateConfiguration(first);
    if (created.code() == absl::StatusCode::kAlreadyExists) {
      absl::StatusOr<VersionedConfiguration> stored = coordinator_->ReadConfiguration();
      return absl::FailedPreconditionError(absl::StrFormat(
          "cluster \"%s\" exists (%s): start this server with --role=backup; the primary "
          "brings it up to date by state transfer",
          ro.coordinator.cluster,
          stored.ok() ? stored->configuration.ToString() : stored.status().ToString()));
    }
    if (!created.ok()) return created;
    held_ = first;
    epoch_.store(first.epoch);
    const int64_t sent = util::Lease::NowNs();
    if (absl::Status s = coordinator_->Confirm().status(); !s.ok()) return s;
    primary_lease_.ExtendTo(sent + absl::ToInt64Nanoseconds(coordinator_->session_timeout()) /
                                       kPrimaryLeaseDivisor);
    LOG(INFO) << "cluster " << ro.coordinator.cluster << " started: " << first.ToString();
  } else {
    // A former primary restarted as a backup: while the configuration still names it, its
    // registration would tell the backups their primary lives (no failover would ever come).
    // It registers once another member took over.
    const absl::Time give_up = absl::Now() + kFormerPrimaryWait;
    absl::StatusOr<VersionedConfiguration> stored = coordinator_->ReadConfiguration();
    while (stored.ok() && stored->configuration.primary == ro.member) {
      if (absl::Now() >= give_up) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "%s is still the primary of %s and no backup took over within %s: promote one "
            "(herd_admin promote), then start this server again",
            ro.member, stored->configuration.ToString(), absl::FormatDuration(kFormerPrimaryWait)));
      }
      LOG_EVERY_N(INFO, 100) << "the configuration still names this member its primary ("
                             << stored->configuration.ToString()
                             << "): waiting for a backup to take over before registering";
      absl::SleepFor(kRegisterRetry);
      stored = coordinator_->ReadConfiguration();
    }
    if (stored.ok()) {
      // The epoch's primary may attach as soon as this member registers.
      util::MutexLock lock(&published_mutex_);
      published_ = stored->configuration;
      epoch_.store(stored->configuration.epoch);
    }
  }
  return Register();
}

absl::Status ReplicationMember::Reconnect() {
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Connect(options_.coordinator);
  if (!coordinator.ok()) return coordinator.status();
  coordinator_ = *std::move(coordinator);
  if (absl::Status s = Register(); !s.ok()) return s;
  LOG(INFO) << "coordination session renewed";
  return absl::OkStatus();
}

absl::Status ReplicationMember::Register() {
  const ReplicationServerOptions& ro = options_;
  MemberInfo info;
  info.client_address = HostPort(ro.advertise_host, host_.client_port());
  if (replication_listener_ != nullptr) {
    info.replication_address = HostPort(ro.advertise_host, ro.advertise_replication_port != 0
                                                               ? ro.advertise_replication_port
                                                               : replication_listener_->port());
  }
  // A member restarted at once finds its previous life's registration until that session
  // expires.
  const absl::Time give_up = absl::Now() + ro.coordinator.session_timeout + kRegisterSlack;
  while (true) {
    absl::Status s = coordinator_->Register(ro.member, info);
    if (s.ok()) break;
    if (s.code() != absl::StatusCode::kAlreadyExists || absl::Now() >= give_up) {
      return absl::Status(s.code(), absl::StrCat(s.message(), " (is another server named \"",
                                                 ro.member, "\" running?)"));
    }
    absl::SleepFor(kRegisterRetry);
  }
  coordinator_changes_ = coordinator_->changes();
  return absl::OkStatus();
}

void ReplicationMember::Fence(std::string_view why) {
  if (!role_.Fence()) return;
  primary_lease_.Revoke();
  LOG(ERROR) << "fenced: " << why
             << ". This server serves nothing from now on (herd_server --rejoin_when_fenced brings "
                "it back as a backup; otherwise restart it as one).";
}

bool ReplicationMember::CommitChange(const Configuration& next, int32_t version) {
  VersionedConfiguration current{held_, version};
  absl::Status s = coordinator_->ReplaceConfiguration(current, next);
  if (!s.ok()) {
    LOG(WARNING) << "configuration change to " << next.ToString() << " not made: " << s;
    next_coordination_ = absl::InfinitePast();  // read it again on the next pass
    return false;
  }
  LOG(INFO) << "configuration: " << next.ToString();
  held_ = next;
  held_version_ = version + 1;
  epoch_.store(next.epoch);
  config_backups_.store(static_cast<uint32_t>(next.backups.size()));
  return true;
}

void ReplicationMember::KeepPrimaryLease() {
  // Its own thread: a coordinator round trip (or a slow control pass) must not hold the lease,
  // and the workers must not stop serving meanwhile.
  const ReplicationServerOptions& ro = options_;
  while (!host_.stopping()) {
    // A promotion comes after any reconnection: from then on coordinator_ never changes.
    if (role_.serving_primary()) {
      if (coordinator_->expired()) {
        Fence("the coordination session expired");
      } else {
        const int64_t sent = util::Lease::NowNs();
        if (coordinator_->Confirm().ok() && !role_.fenced()) {
          primary_lease_.ExtendTo(sent + absl::ToInt64Nanoseconds(coordinator_->session_timeout()) /
                                             kPrimaryLeaseDivisor);
        }
      }
    }
    const absl::Time next = absl::Now() + ro.coordinator.session_timeout / kConfirmsPerSession;
    while (!host_.stopping() && absl::Now() < next) absl::SleepFor(kLeaseKeeperPoll);
  }
}

void ReplicationMember::Coordinate() {
  const absl::Time now = absl::Now();
  const bool acting_primary = role_.primary();
  if (acting_primary && coordinator_->expired()) Fence("the coordination session expired");
  if (role_.fenced()) {
    WatchSuccession(now);
    return;
  }
  if (!acting_primary && coordinator_->expired()) {
    // A backup's session ended (it was paused or cut off for longer than the timeout): its
    // registration went with it. A new session registers it again; its place in the
    // configuration is the primary's to keep or drop.
    if (absl::Status s = Reconnect(); !s.ok()) {
      LOG_EVERY_N(WARNING, 50) << "coordination session expired; not reconnected yet: " << s;
      return;
    }
  }
  const uint64_t changes = coordinator_->changes();
  if (changes != coordinator_changes_ || now >= next_coordination_) {
    coordinator_changes_ = changes;
    next_coordination_ = now + kCoordinationInterval;
    absl::StatusOr<VersionedConfiguration> stored = coordinator_->ReadConfiguration();
    if (!stored.ok()) {
      VLOG(1) << "coordination: " << stored.status();
    } else if (acting_primary) {
      CoordinateAsPrimary(stored->configuration, stored->version);
    } else {
      CoordinateAsBackup(stored->configuration, stored->version);
    }
  }
  if (role_.serving_primary() && !backup_states_.empty()) {
    WatchBackups();
  }
}

void ReplicationMember::WatchSuccession(absl::Time now) {
  if (succession_.load() == Succession::kTakenOver || now < next_succession_read_) return;
  next_succession_read_ = now + kCoordinationInterval;
  if (succession_view_ == nullptr || succession_view_->expired()) {
    // Bounded by the session timeout, not the default connect timeout: this blocks the control
    // thread, and so a stop, while the service does not answer.
    CoordinatorOptions o = options_.coordinator;
    o.connect_timeout = std::min(o.connect_timeout, o.session_timeout);
    absl::StatusOr<std::unique_ptr<Coordinator>> view = Coordinator::Connect(o);
    if (!view.ok()) {
      LOG_EVERY_N(WARNING, 10) << "fenced: the configuration is not readable yet (this server "
                                  "keeps its copy meanwhile): "
                               << view.status();
      return;
    }
    succession_view_ = *std::move(view);
  }
  absl::StatusOr<VersionedConfiguration> stored = succession_view_->ReadConfiguration();
  if (!stored.ok()) {
    LOG_EVERY_N(WARNING, 10) << "fenced: the configuration is not readable (this server keeps "
                                "its copy meanwhile): "
                             << stored.status();
    return;
  }
  const Configuration& c = stored->configuration;
  const absl::StatusOr<MemberInfo> primary = c.primary == options_.member
                                                 ? absl::NotFoundError("this member")
                                                 : succession_view_->Member(c.primary);
  const Succession succession = SuccessionOf(c, options_.member, held_.epoch, primary);
  if (succession == Succession::kNone) {
    config_backups_.store(static_cast<uint32_t>(c.backups.size()));
  }
  if (succession != succession_.load()) {
    LOG(INFO) << "fenced; the stored configuration (" << c.ToString() << ") says succession "
              << SuccessionName(succession);
  }
  succession_.store(succession);
  if (succession == Succession::kTakenOver) succession_view_.reset();  // nothing more to read
}

void ReplicationMember::CoordinateAsPrimary(const Configuration& stored, int32_t version) {
  if (stored.primary != options_.member) {
    Fence(absl::StrFormat("%s took over (%s)", stored.primary, stored.ToString()));
    return;
  }
  if (stored.epoch != held_.epoch) {
    // Its own change, whose answer was lost (a connection loss after the write).
    LOG(INFO) << "configuration: " << stored.ToString() << " (this primary's own change)";
    held_ = stored;
    epoch_.store(stored.epoch);
    config_backups_.store(static_cast<uint32_t>(stored.backups.size()));
  }
  held_version_ = version;
  absl::StatusOr<std::vector<std::string>> members = coordinator_->Members();
  if (members.ok()) AttachRegisteredMembers(*members);
}

void ReplicationMember::AttachRegisteredMembers(const std::vector<std::string>& members) {
  const absl::Time now = absl::Now();
  for (size_t b = 0; b < backup_members_.size(); ++b) {
    if (backup_states_[b] != BackupState::kLost) continue;
    // Not attached yet: a member that is gone frees its slot; one that registered again (a
    // restart, on new ports) is tried at its new address.
    absl::StatusOr<MemberInfo> info =
        std::find(members.begin(), members.end(), backup_members_[b]) == members.end()
            ? absl::NotFoundError("gone")
            : coordinator_->Member(backup_members_[b]);
    if (info.ok() && !info->replication_address.empty()) {
      backup_addresses_[b] = info->replication_address;
    } else if (info.ok() || absl::IsNotFound(info.status())) {
      backup_states_[b] = BackupState::kVacant;
      backup_members_[b].clear();
    }
  }
  for (const std::string& member : members) {
    if (member == options_.member || std::find(backup_members_.begin(), backup_members_.end(),
                                               member) != backup_members_.end()) {
      continue;
    }
    absl::StatusOr<MemberInfo> info = coordinator_->Member(member);
    if (!info.ok() || info->replication_address.empty()) continue;  // not a backup
    const auto vacant =
        std::find(backup_states_.begin(), backup_states_.end(), BackupState::kVacant);
    if (vacant == backup_states_.end()) {
      LOG_EVERY_N(WARNING, 100) << "member " << member << " not attached: all " << kMaxBackups
                                << " backup slots are taken";
      return;
    }
    const size_t b = static_cast<size_t>(vacant - backup_states_.begin());
    backup_members_[b] = member;
    backup_addresses_[b] = info->replication_address;
    backup_states_[b] = BackupState::kLost;  // WatchBackups attaches it (StartRejoin)
    next_rejoin_[b] = now;
    LOG(INFO) << "member " << member << " (" << info->replication_address
              << ") registered: attaching it as a backup";
  }
}

void ReplicationMember::AnswerLeaseRequests(size_t b) {
  transport::control::Channel& channel = *backup_channels_[b];
  for (absl::StatusOr<transport::control::Message> m = channel.Receive(absl::ZeroDuration());
       m.ok(); m = channel.Receive(absl::ZeroDuration())) {
    if (m->type != kLeaseRequest) continue;
    // Granted only while this primary is sure of its place: a fenced one lets them lapse.
    if (role_.fenced() || !primary_lease_.Valid()) continue;
    lease_granted_[b] = util::Lease::NowNs();
    (void)channel.Send(kLeaseGrant, m->payload);
  }
}

bool ReplicationMember::CommitAddition(size_t b) {
  // Committed already (the answer to the write was lost, and the next read found it there).
  if (held_.HasBackup(backup_members_[b])) return true;
  absl::StatusOr<Configuration> next = AddBackupIn(held_, options_.member, backup_members_[b]);
  if (!next.ok()) {
    LOG(WARNING) << "backup " << backup_members_[b] << " not added: " << next.status();
    return false;
  }
  if (!CommitChange(*next, held_version_)) return false;
  lease_granted_[b] = kNeverGranted;
  return true;
}

void ReplicationMember::SettleDrop(size_t b) {
  for (const WorkerReplication& r : workers_) {
    if (!r.gate->dropped(b)) return;  // RequestDrop takes a few of the worker's loops
  }
  if (util::Lease::NowNs() < drop_after_[b]) return;  // its read lease may still run
  const std::string& member = backup_members_[b];
  if (held_.HasBackup(member)) {
    absl::StatusOr<Configuration> next = DropBackupIn(held_, options_.member, member);
    if (!next.ok() || !CommitChange(*next, held_version_)) return;  // tried again next pass
  }
  // It can neither read nor be promoted now: the gates go on without it.
  for (WorkerReplication& r : workers_) r.gate->ConsentToDrop(b);
  LOG(INFO) << "backup " << member << " removed from the configuration";
  backup_states_[b] = BackupState::kVacant;
  backup_members_[b].clear();
}

void ReplicationMember::CoordinateAsBackup(const Configuration& stored, int32_t version) {
  const ReplicationServerOptions& ro = options_;
  {
    util::MutexLock lock(&published_mutex_);
    published_ = stored;
  }
  epoch_.store(stored.epoch);
  if (!taking_over_.has_value() && stored.primary == ro.member && stored.epoch == tried_epoch_) {
    // This member's own promotion, whose answer was lost (the write went through).
    LOG(WARNING) << "the configuration names this member primary (" << stored.ToString()
                 << "): its promotion went through; taking over";
    held_ = stored;
    held_version_ = version;
    taking_over_ = stored;
  }
  if (taking_over_.has_value()) {
    if (absl::Status s = TakeOver(*taking_over_); !s.ok()) {
      LOG(WARNING) << "takeover not complete yet: " << s;
    }
    return;
  }
  if (!ro.auto_failover || !stored.HasBackup(ro.member) || !HoldsWholeCopy()) return;
  // Gone: its registration expired with its session, or the name was registered again by a
  // later life (PresenceOf).
  absl::StatusOr<PrimaryPresence> presence =
      PresenceOf(stored, coordinator_->Member(stored.primary));
  if (!presence.ok() || *presence != PrimaryPresence::kGone) return;
  absl::StatusOr<Configuration> next =
      PromoteIn(stored, ro.member, coordinator_->session_id(), PrimaryPresence::kGone);
  if (!next.ok()) return;
  held_ = stored;
  tried_epoch_ = next->epoch;
  if (!CommitChange(*next, version)) return;  // another backup won: this one rejoins it
  LOG(WARNING) << "primary " << stored.primary << " of epoch " << stored.epoch
               << " is gone: taking over as the primary of epoch " << next->epoch;
  taking_over_ = *next;
  {
    util::MutexLock lock(&published_mutex_);
    published_ = *next;
  }
  if (absl::Status s = TakeOver(*next); !s.ok()) LOG(WARNING) << "takeover: " << s;
}

absl::Status ReplicationMember::TakeOver(Configuration next) {
  // The old primary's access goes first (the replication thread sees the new epoch).
  const absl::Time give_up = absl::Now() + kDetachTimeout;
  while (primary_attached_.load()) {
    if (absl::Now() >= give_up || host_.stopping()) {
      return absl::DeadlineExceededError("the old primary is still attached");
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  // The old primary may have granted read leases until its very end (a clean stop ends its
  // session at once, with no timeout to wait out): none is valid when this one takes writes.
  if (!lease_wait_until_.has_value())
    lease_wait_until_ = util::Lease::NowNs() + absl::ToInt64Nanoseconds(LeaseWait());
  if (util::Lease::NowNs() < *lease_wait_until_) {
    absl::SleepFor(absl::Nanoseconds(*lease_wait_until_ - util::Lease::NowNs()));
  }
  if (next.primary_session != coordinator_->session_id()) {
    // Its session ended since its promotion was written (a pause outlasted it; Coordinate
    // reconnected): the configuration names the session it had, so its backups would take its
    // registration for a later life and the primary for gone. It records the session it has
    // now, before it serves (none of its backups exists yet: nobody could take over meanwhile).
    absl::StatusOr<VersionedConfiguration> stored = coordinator_->ReadConfiguration();
    if (!stored.ok()) return stored.status();
    if (stored->configuration.primary != options_.member ||
        stored->configuration.epoch < next.epoch) {
      taking_over_.reset();
      return absl::AbortedError(absl::StrCat("the configuration moved on during the takeover: ",
                                             stored->configuration.ToString()));
    }
    next = stored->configuration;
    held_ = next;
    held_version_ = stored->version;
    if (next.primary_session != coordinator_->session_id()) {
      absl::StatusOr<Configuration> renewed =
          RenewIncarnationIn(next, options_.member, coordinator_->session_id());
      if (!renewed.ok()) return renewed.status();
      if (!CommitChange(*renewed, stored->version)) {
        return absl::AbortedError("recording this member's new session: not made");
      }
      next = *renewed;
    }
    taking_over_ = next;
  }
  const int64_t sent = util::Lease::NowNs();
  if (absl::Status s = coordinator_->Confirm().status(); !s.ok()) return s;
  primary_lease_.ExtendTo(sent + absl::ToInt64Nanoseconds(coordinator_->session_timeout()) /
                                     kPrimaryLeaseDivisor);
  {
    util::MutexLock lock(&replication_mutex_);
    promoting_ = true;  // no primary attaches from now on
  }
  if (replication_pd_ == nullptr) {
    if (absl::Status s = PrepareLinks(&host_.device()); !s.ok()) return s;
  }
  const std::vector<std::string> failures = RunOnWorkers(/*take_writes=*/true, /*make_gates=*/true);
  taking_over_.reset();
  if (!failures.empty()) {
    Fence(absl::StrCat("the takeover failed: ", absl::StrJoin(failures, "; ")));
    return absl::DataLossError(absl::StrCat("takeover failed: ", absl::StrJoin(failures, "; ")));
  }
  for (const WorkerReplication& r : workers_) {
    if (r.gate == nullptr) {
      Fence("a promoted worker has no replication gate");
      return absl::InternalError("a promoted worker has no replication gate");
    }
  }
  gates_ready_.store(true);
  held_ = next;
  epoch_.store(next.epoch);
  config_backups_.store(0);
  if (!role_.Promote()) {
    // Only a Fence could refuse it, and nothing fences a backup during its takeover but the
    // takeover itself (which returned above).
    LOG(DFATAL) << "the takeover's promotion was refused after its workers took writes";
  }
  next_coordination_ = absl::InfinitePast();
  LOG(INFO) << "took over: the primary of epoch " << next.epoch << " (" << workers_.size()
            << " partitions)";
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReplicationMember::PromoteCoordinated() {
  const ReplicationServerOptions& ro = options_;
  if (role_.primary()) {
    return absl::FailedPreconditionError("this server is a primary already");
  }
  if (role_.fenced()) {
    return absl::FailedPreconditionError(
        "this server was fenced (a takeover failed half way): restart it to serve again");
  }
  absl::StatusOr<VersionedConfiguration> stored = coordinator_->ReadConfiguration();
  if (!stored.ok()) return stored.status();
  absl::StatusOr<PrimaryPresence> presence =
      PresenceOf(stored->configuration, coordinator_->Member(stored->configuration.primary));
  if (!presence.ok()) return presence.status();
  absl::StatusOr<Configuration> next =
      PromoteIn(stored->configuration, ro.member, coordinator_->session_id(), *presence);
  if (!next.ok()) return next.status();
  if (!HoldsWholeCopy()) {
    return absl::FailedPreconditionError(
        "this backup's copy is not whole (dropped, restarted since the configuration listed it, "
        "or its state transfer not complete)");
  }
  held_ = stored->configuration;
  tried_epoch_ = next->epoch;
  if (!CommitChange(*next, stored->version)) {
    return absl::AbortedError("another configuration change came first: none made");
  }
  taking_over_ = *next;
  {
    util::MutexLock lock(&published_mutex_);
    published_ = *next;
  }
  const absl::Time start = absl::Now();
  if (absl::Status s = TakeOver(*next); !s.ok()) return s;
  return absl::StrFormat("{\"promoted\":true,\"epoch\":%d,\"workers\":%d,\"seconds\":%.6f}",
                         next->epoch, workers_.size(), absl::ToDoubleSeconds(absl::Now() - start));
}

}  // namespace herd
