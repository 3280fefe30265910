// The replication member's life: creation (a primary's links and gates, a backup's redo areas
// and readers), its threads, the control thread's pass, and its counters. The primary's
// machinery is in member_primary.cc, the backup's in member_backup.cc, the coordinated
// configuration's in member_coordination.cc.
#include "herd/replication/member.h"

#include <algorithm>
#include <chrono>

#include "glog/logging.h"

namespace herd {

absl::StatusOr<std::unique_ptr<ReplicationMember>> ReplicationMember::Create(
    ReplicationHost& host, ServerRole& role, const Config& config,
    const ReplicationServerOptions& options, transport::PagePolicy pages,
    std::vector<mica::Partition*> partitions) {
  if (partitions.size() != config.workers) {
    return absl::InvalidArgumentError(absl::StrCat("replication: ", partitions.size(),
                                                   " partitions for ", config.workers, " workers"));
  }
  std::unique_ptr<ReplicationMember> member(
      new ReplicationMember(host, role, config, options, pages, std::move(partitions)));
  switch (role.configured()) {
    case ReplicationRole::kPrimary:
      if (absl::Status s = member->AttachToBackups(); !s.ok()) return s;
      break;
    case ReplicationRole::kBackup:
      if (absl::Status s = member->PrepareReplica(); !s.ok()) return s;
      break;
    case ReplicationRole::kNone:
      return absl::InvalidArgumentError("a server without replication is no member of a group");
  }
  return member;
}

ReplicationMember::ReplicationMember(ReplicationHost& host, ServerRole& role, const Config& config,
                                     const ReplicationServerOptions& options,
                                     transport::PagePolicy pages,
                                     std::vector<mica::Partition*> partitions)
    : host_(host), role_(role), config_(config), options_(options), region_pages_(pages) {
  workers_.resize(partitions.size());
  for (size_t w = 0; w < partitions.size(); ++w) workers_[w].partition = partitions[w];
}

ReplicationMember::~ReplicationMember() {
  // The host calls it once it stops; here for a member never started (no threads) and as the
  // last word (a started member's threads return only once its host is stopping).
  StopThreads();
}

void ReplicationMember::Start() {
  if (coordinator_ != nullptr) lease_keeper_ = std::thread([this] { KeepPrimaryLease(); });
  if (replication_listener_) replication_thread_ = std::thread([this] { ServeReplication(); });
}

void ReplicationMember::OnControlPass() {
  if (coordinator_ != nullptr) {
    Coordinate();
  } else if (role_.configured() == ReplicationRole::kPrimary) {
    WatchBackups();
  }
}

absl::StatusOr<std::string> ReplicationMember::Promote() {
  return coordinator_ != nullptr ? PromoteCoordinated() : PromoteManually();
}

void ReplicationMember::StopThreads() {
  // Rejoin attempts still running (each bounded by its timeouts, and cut short by the host's
  // stop): their QPs go while the links' PD and CQs are still there.
  for (std::future<Attach>& attempt : rejoining_) {
    if (attempt.valid()) attempt.wait();
  }
  rejoining_.clear();
  if (lease_keeper_.joinable()) lease_keeper_.join();
  if (replication_thread_.joinable()) replication_thread_.join();  // detaches the primary
}

MemberStats ReplicationMember::Stats() const {
  MemberStats stats;
  stats.role = role_.current();
  stats.promoted = role_.promoted();
  stats.fenced = role_.fenced();
  stats.succession = succession_.load();
  stats.epoch = epoch_.load();
  const bool coordinated = options_.coordinated();
  if (coordinated) {
    stats.lease_left_s = absl::ToDoubleSeconds(
        stats.role == ReplicationRole::kPrimary ? primary_lease_.left() : read_lease_.left());
  }
  // Gates exist on a primary from the start, and on a coordinated one promoted (gates_ready_).
  if (stats.role == ReplicationRole::kPrimary && (!stats.promoted || gates_ready_.load())) {
    stats.backups =
        coordinated ? config_backups_.load() : static_cast<uint32_t>(options_.backups.size());
    stats.live_backups = coordinated ? UINT32_MAX : stats.backups;
    for (const WorkerReplication& r : workers_) {
      const ReplicationCounters g = r.gate->counters();
      stats.live_backups = std::min<uint32_t>(stats.live_backups, g.live_backups);
      ReplicationCounters& t = stats.replication;
      t.batches_posted += g.batches_posted;
      t.writes_posted += g.writes_posted;
      t.bytes_posted += g.bytes_posted;
      t.deferred += g.deferred;
      t.overflowed += g.overflowed;
      t.links_dropped += g.links_dropped;
      t.stalls += g.stalls;
      t.released += g.released;
      t.reads_held += g.reads_held;
      t.watermarks_posted += g.watermarks_posted;
      t.joined += g.joined;
      t.transfer_bytes += g.transfer_bytes;
    }
  } else if (stats.role == ReplicationRole::kBackup) {
    stats.syncing = syncing_.load();
    for (const WorkerReplication& r : workers_) {
      const ReplicaReadCounters& k = r.reader->counters();
      stats.replica_reads += k.reads.Get();
      stats.replica_torn += k.torn.Get();
      stats.replica_unconfirmed += k.unconfirmed.Get();
      stats.replica_busy += k.busy.Get();
      stats.replica_unreleased += k.unreleased.Get();
      stats.replica_held_back += k.held_back.Get();
    }
    stats.primary_attached = primary_attached_.load();
  }
  return stats;
}

}  // namespace herd
