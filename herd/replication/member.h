// What a replicated server does as a member of its group: the one object behind every primary
// and backup role (the Server owns it; a server without replication has none).
//
//   ReplicationHost& host = ...;  // the engine: its device, its workers, whether it stops
//   std::unique_ptr<ReplicationMember> member;
//   Take(ReplicationMember::Create(host, role, config, options, pages, partitions), &member);
//   // Build each worker with member->gate(w) (a primary's) and member->reader(w) (a backup's),
//   // and member->primary_lease() (a coordinated primary serves while it is valid); then
//   member->JoinCluster();     // coordinated only, once the client port is known
//   member->Start();           // the backup's replication thread, the primary's lease keeper
//   member->OnControlPass();   // every pass of the engine's control thread
//   member->StopThreads();     // once the host is stopping, before its workers' threads join
//
// A primary (member_primary.cc) attaches to its backups, hands each worker a ReplicationGate,
// watches its links and attaches lost backups again by state transfer. A backup (member_backup.cc)
// prepares each worker's redo area and reader, admits one primary at a time on its replication
// port, serves replica reads, and is promoted. With a coordinator (member_coordination.cc) the
// membership is a numbered configuration in ZooKeeper (configuration.h): fencing, read leases and
// automatic failover. docs/architecture.md, "Replication" and "Configurations, fencing and leases",
// says what each role guarantees.
//
// Threads: the engine's control thread calls OnControlPass and Promote; the replication thread
// (a backup's) and the lease keeper (a coordinated server's) are the member's own and return
// once host.stopping(); Stats may be called from any thread.
#ifndef HERD_HERD_REPLICATION_MEMBER_H_
#define HERD_HERD_REPLICATION_MEMBER_H_

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "herd/config.h"
#include "herd/replication/configuration.h"
#include "herd/replication/coordinator.h"
#include "herd/replication/gate.h"
#include "herd/replication/link.h"
#include "herd/replication/replica_reader.h"
#include "herd/replication/replica_task.h"
#include "herd/replication/role.h"
#include "mica/partition.h"
#include "transport/control/channel.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"
#include "util/lease.h"
#include "util/mutex.h"

namespace herd {

struct ReplicationServerOptions {
  ReplicationRole role = ReplicationRole::kNone;
  // kPrimary: every backup's replication port ("host:port"), attached at Create.
  std::vector<std::string> backups;
  // kBackup: where primaries attach (0 picks a free port: replication_port()).
  std::string listen_address = "0.0.0.0";
  uint16_t port = 0;
  // The gates' settings (kPrimary); staging_bytes must be the same on both sides (it sizes the
  // backup's redo areas).
  ReplicationOptions gate;
  // kPrimary: how long Create waits for a backup to accept.
  absl::Duration connect_timeout = absl::Seconds(30);
  // kPrimary: the device the backup links use, when not the clients' (a NIC of their own; on
  // the shm fabric, links with faults of their own, e.g. slower than the clients').
  std::optional<transport::DeviceOptions> device;
  // Coordinated replication (issue 35), when coordinator.hosts is set: the membership is a
  // numbered configuration in ZooKeeper (herd/replication/configuration.h). A kPrimary starts a
  // cluster (epoch 1; refused if one exists) and takes as backups the members that register; a
  // kBackup registers and waits for its epoch's primary to attach it with a state transfer.
  // Failover is automatic (auto_failover) or by herd_admin promote, through the same
  // conditional write. `backups` must be empty: backups join through the coordinator.
  CoordinatorOptions coordinator;
  std::string member;                        // this server's name in the cluster
  std::string advertise_host = "127.0.0.1";  // the host its registration names
  // The replication port its registration names, when the primary must dial another than the
  // one it listens on (a port forward, a proxy); 0: the port it listens on.
  uint16_t advertise_replication_port = 0;
  bool auto_failover = true;
  // A backup answers GETs only this long after the primary last renewed its lease; a primary
  // waits this long (plus a margin) after its last renewal before it goes on without a backup.
  absl::Duration read_lease = absl::Milliseconds(500);
  bool coordinated() const { return !coordinator.hosts.empty(); }
};

// What the member needs of the engine that hosts it, and nothing more.
class ReplicationHost {
 public:
  virtual ~ReplicationHost() = default;
  // The clients' device (a backup's primary attaches through it; a primary's links use it unless
  // ReplicationServerOptions::device names another).
  virtual transport::Device& device() = 0;
  // The engine is stopping: waits end, threads return.
  virtual bool stopping() const = 0;
  // The port clients join on (a coordinated member's registration names it).
  virtual uint16_t client_port() const = 0;
  // Runs tasks[w] on worker w, one per worker, and waits for them; a stopping engine takes back
  // the ones no worker claimed. What failed, per worker (empty: all succeeded). Ids a promotion's
  // tasks list in awaiting_resume are kept from fresh joins.
  virtual std::vector<std::string> RunOnWorkers(absl::Span<ReplicaTask* const> tasks) = 0;
};

// The member's part of ServerStats (a snapshot; any thread).
struct MemberStats {
  ReplicationRole role = ReplicationRole::kNone;
  bool promoted = false, fenced = false;
  // Fenced: what the stored configuration says came after it (WatchSuccession); kTakenOver is
  // the one state in which its copy may be dropped.
  Succession succession = Succession::kUnknown;
  uint64_t epoch = 0;
  double lease_left_s = 0;
  // A primary's gates summed (live_backups: the fewest any worker still has).
  uint32_t backups = 0, live_backups = 0;
  ReplicationCounters replication;
  // A backup's readers summed, whether a primary is attached and a state transfer runs.
  uint64_t replica_reads = 0, replica_torn = 0, replica_unconfirmed = 0, replica_busy = 0,
           replica_unreleased = 0, replica_held_back = 0;
  bool primary_attached = false, syncing = false;
};

class ReplicationMember {
 public:
  // `partitions`: each worker's (they outlive the member; the workers are built after Create,
  // with gate(w) and reader(w)). kPrimary: attaches to every configured backup (or, coordinated,
  // leaves every slot vacant) and builds the gates. kBackup: the redo areas, the readers and the
  // replication port. `role` outlives the member; the member moves it (Promote, Fence).
  static absl::StatusOr<std::unique_ptr<ReplicationMember>> Create(
      ReplicationHost& host, ServerRole& role, const Config& config,
      const ReplicationServerOptions& options, transport::PagePolicy pages,
      std::vector<mica::Partition*> partitions);
  ~ReplicationMember();
  ReplicationMember(const ReplicationMember&) = delete;
  ReplicationMember& operator=(const ReplicationMember&) = delete;

  // For worker w's constructor: the gate it answers mutations through (a primary's; else null),
  // the reader its GETs go through (a backup's; else null), the lease it serves under (a
  // coordinated server's; else null).
  ResponseGate* gate(uint32_t w) const { return workers_[w].gate.get(); }
  ReplicaReader* reader(uint32_t w) const { return workers_[w].reader.get(); }
  const util::Lease* primary_lease() const {
    return options_.coordinated() ? &primary_lease_ : nullptr;
  }
  // kBackup: the port primaries attach on (0 otherwise).
  uint16_t replication_port() const {
    return replication_listener_ ? replication_listener_->port() : 0;
  }
  // The configuration epoch this member acts in (0: not coordinated).
  uint64_t epoch() const { return epoch_.load(); }

  // Coordinated only, once the host's client port is known: connects, checks the role against
  // the stored configuration (a kPrimary creates epoch 1) and registers the member.
  absl::Status JoinCluster();
  // Starts the member's threads (after the workers').
  void Start();
  // The engine's control thread, every pass: follows the configuration, watches the backups.
  void OnControlPass();
  // The engine's control thread: herd_admin promote (coordinated: the conditional write). A JSON
  // summary, or why not.
  absl::StatusOr<std::string> Promote();
  // Once host.stopping() (the threads return only then): waits for the rejoin attempts in flight
  // and joins the member's threads (a backup's detaches its primary). Before the workers' threads
  // join. The destructor calls it: a started member is destroyed only after its host stopped.
  void StopThreads();
  MemberStats Stats() const;

 private:
  ReplicationMember(ReplicationHost& host, ServerRole& role, const Config& config,
                    const ReplicationServerOptions& options, transport::PagePolicy pages,
                    std::vector<mica::Partition*> partitions);
  // TCP keepalive on a replication channel (either end): a peer whose machine died (no FIN ever
  // comes) is found gone; a failure to set it is logged.
  static void KeepReplicationChannelAlive(transport::control::Channel& channel);

  // Replication (member_primary.cc, member_backup.cc). kPrimary, in Create: attaches to every
  // backup and builds each worker's gate. kBackup, in Create: each worker's redo area and
  // reader; then a thread that admits one primary at a time (ServeReplication).
  absl::Status AttachToBackups();
  absl::Status PrepareReplica();
  void ServeReplication();
  absl::Status AttachPrimary(transport::control::Channel& channel);
  void DetachPrimary();
  // kPrimary, control thread: a backup whose control connection closed is dropped by every gate.
  void WatchBackups();
  // kPrimary, in Create (or a coordinated promotion): the links' PD and per-worker CQs, and each
  // worker's gate over `links` (per worker, per backup slot; a null qp is a vacant slot).
  absl::Status PrepareLinks(transport::Device* device);
  absl::Status CreateGates(const std::vector<std::vector<BackupLink>>& links);
  ReplicationOptions GateOptions() const;
  // Coordinated primary, control thread: commits the removal of dropping slot `b` once its
  // lease ran out, then lets the gates go on without it; commits a synced slot's addition.
  void SettleDrop(size_t b);
  bool CommitAddition(size_t b);
  // How long after a lease grant its backup's lease is surely over (read_lease and a margin for
  // the two clocks' drift).
  absl::Duration LeaseWait() const;
  // A coordinated backup's copy is whole: a state transfer completed in this life, and its
  // primary has not dropped it since.
  bool HoldsWholeCopy();
  // kPrimary: an attach to one backup, made by ConnectBackup: the control channel, and per
  // worker the RC QP and the link over it (not yet kept or offered to a gate).
  struct Attach {
    absl::StatusOr<transport::control::Channel> channel = absl::UnknownError("not attached");
    std::vector<BackupLink> links;
    std::vector<std::unique_ptr<transport::QueuePair>> qps;
    std::string address;  // what it was made for: a slot may be given another meanwhile
    std::string member;
  };
  // The hello ConnectBackup sends (but its QPs): built on the control thread, which owns
  // `held_`, and read by an attach running on its own thread.
  ReplicaHello HelloForBackup(bool transfer) const;
  // kPrimary: attaches to backup `address` with `hello` (which says whether a state transfer
  // follows): one RC QP per worker. Touches nothing the control thread changes, so it may run
  // on a thread of its own. Waits up to `timeout` to connect and `welcome_timeout` for the
  // backup's welcome.
  Attach ConnectBackup(const std::string& address, ReplicaHello hello, absl::Duration timeout,
                       absl::Duration welcome_timeout);
  // Keeps an attach's QPs for the server's life: a dropped link's QP may still be named by its
  // gate until the worker adopts a rejoined one (a few QPs per rejoin).
  void KeepLinkQps(Attach& attach);
  // kPrimary, control thread: starts an attempt to attach lost backup `b` again (a restarted,
  // empty one) on a thread of its own, so that clients keep joining while a backup takes
  // seconds to answer; FinishRejoin takes its result on a later pass and offers the new links
  // to the gates, which bring the backup up to date (OfferLink).
  void StartRejoin(size_t b);
  void FinishRejoin(size_t b);
  // kBackup, control thread (a kPromoteRequest, no coordinator): once no primary is attached,
  // every worker replays its last committed batch, takes the partition's state over and takes
  // writes; no primary attaches afterwards. A JSON summary, or why not.
  absl::StatusOr<std::string> PromoteManually();
  // kBackup: runs a ReplicaTask on every worker (replay the last committed batch, clear the
  // commit line; with take_writes, ResumeFromRegion, a version clock jump and writes) and waits
  // for them; what failed, per worker. With take_writes: the control thread only (the host notes
  // the ids awaiting their clients' resumption). With make_gates (a coordinated takeover), each
  // worker also answers through a new gate with every backup slot vacant.
  std::vector<std::string> RunOnWorkers(bool take_writes, bool make_gates = false);
  // Coordinated replication (member_coordination.cc). Registers this member (waiting out its
  // previous life's registration); a backup whose session expired reconnects and registers
  // again.
  absl::Status Register();
  absl::Status Reconnect();
  // Control thread, every pass: renews the primary's lease, follows the configuration (a
  // backup's failover, a primary's fencing), attaches registered members as backups, and
  // commits their addition and removal.
  void Coordinate();
  // Control thread, each pass of a fenced member (at most every kCoordinationInterval): reads
  // the stored configuration, and a newer primary's registration, through a session of its own
  // (the one it was fenced in may have expired; it registers nothing) and publishes the
  // succession (SuccessionOf) and the stored configuration's backups (Stats). Stops once a
  // takeover is seen.
  void WatchSuccession(absl::Time now);
  // A coordinated server's thread: while it acts as primary, renews its lease on its place.
  void KeepPrimaryLease();
  void CoordinateAsPrimary(const Configuration& stored, int32_t version);
  void CoordinateAsBackup(const Configuration& stored, int32_t version);
  // Takes over as the primary of `next` (committed): waits for the old primary's detachment,
  // promotes the workers with fresh gates, and serves as primary of that epoch.
  // By value: callers pass *taking_over_, which it resets (and may replace).
  absl::Status TakeOver(Configuration next);
  // A promotion asked for by herd_admin: the same conditional write as an automatic one.
  absl::StatusOr<std::string> PromoteCoordinated();
  // Ends this primary's service for good (another epoch took over, or its session expired).
  void Fence(std::string_view why);
  // The primary's side of a backup slot's life in coordinated mode (WatchBackups's states).
  void AttachRegisteredMembers(const std::vector<std::string>& members);
  void AnswerLeaseRequests(size_t b);
  bool CommitChange(const Configuration& next, int32_t version);

  ReplicationHost& host_;
  // What this server is in its replication group now (primary, backup; promoted, fenced): the
  // engine's, every role question asks it.
  ServerRole& role_;
  const Config config_;
  const ReplicationServerOptions options_;
  const transport::PagePolicy region_pages_;

  // kPrimary: the backup links' device (ReplicationServerOptions::device; else the host's) and
  // PD. Declared before workers_, whose QPs and gates use them.
  std::unique_ptr<transport::Device> replication_device_;
  std::unique_ptr<transport::ProtectionDomain> replication_pd_;
  // Per worker. Destroyed in reverse: the links' QPs (their pending WRs read the gate's staging
  // ring), the gate (it unhooks the partition's recorder: the partition, the worker's, outlives
  // the member), the reader, the redo area, the CQ.
  struct WorkerReplication {
    mica::Partition* partition = nullptr;  // the worker's
    // kPrimary: the links' CQ; kBackup: the redo area the primary's chains land in.
    std::unique_ptr<transport::CompletionQueue> replication_cq;
    std::unique_ptr<transport::SharedMemory> redo;
    std::unique_ptr<ReplicaReader> reader;                          // kBackup
    std::unique_ptr<ReplicationGate> gate;                          // kPrimary
    std::vector<std::unique_ptr<transport::QueuePair>> backup_qps;  // one per backup
  };
  std::vector<WorkerReplication> workers_;
  std::thread lease_keeper_;  // coordinated servers: KeepPrimaryLease

  // kPrimary: each backup's control connection (its closing drops the backup), and whether
  // that was seen.
  std::vector<std::unique_ptr<transport::control::Channel>> backup_channels_;
  enum class BackupState : uint8_t {
    kLive,     // in sync: its gates count it
    kJoining,  // rejoined: its state transfer runs; told kReplicaSynced once every gate synced
    kLost,     // dropped; tried again every kRejoinInterval
    // Coordinated only: a slot no member holds; and a dropped member whose removal from the
    // configuration (after its read lease ran out) the gates wait for (ConsentToDrop).
    kVacant,
    kDropping,
  };
  std::vector<BackupState> backup_states_;
  std::vector<absl::Time> next_rejoin_;
  // Per backup slot: the rejoin attempt running on its own thread (StartRejoin), if any.
  // StopThreads waits for them (each bounded by its connect and welcome timeouts) before the
  // links' PD and the workers go.
  std::vector<std::future<Attach>> rejoining_;
  // Per backup slot: where it attaches, its member name (coordinated), and when the primary
  // last granted it a read lease (the lease ends by then + read_lease).
  std::vector<std::string> backup_addresses_;
  std::vector<std::string> backup_members_;
  // On util::Lease::NowNs()'s monotonic clock, as the backups' leases (a wall clock that jumps
  // would end a wait early).
  static constexpr int64_t kNeverGranted = 0;
  std::vector<int64_t> lease_granted_;
  std::vector<int64_t> drop_after_;

  // Coordinated replication (control thread, but for the atomics).
  std::unique_ptr<Coordinator> coordinator_;
  Configuration held_;        // the configuration this server acts in
  int32_t held_version_ = 0;  // its stored version (what a conditional write names)
  // held_.backups.size() (once fenced: the stored configuration's, WatchSuccession), for Stats.
  std::atomic<uint32_t> config_backups_{0};
  // A fenced member's (WatchSuccession): its read-only session, when to read next, and what it
  // read (any thread).
  std::unique_ptr<Coordinator> succession_view_;
  absl::Time next_succession_read_ = absl::InfinitePast();
  std::atomic<Succession> succession_{Succession::kUnknown};
  uint64_t coordinator_changes_ = 0;  // coordinator_->changes() last acted on
  absl::Time next_coordination_ = absl::InfinitePast();
  // A backup's: the configuration it committed to take over, while the old primary detaches.
  std::optional<Configuration> taking_over_;
  uint64_t tried_epoch_ = 0;  // the epoch of this member's last promotion write
  // When the takeover may take writes: every read lease of the old primary over (NowNs terms).
  std::optional<int64_t> lease_wait_until_;
  std::atomic<uint64_t> epoch_{0};  // held_.epoch, for Stats and the replication thread
  util::Lease primary_lease_;       // the workers of a coordinated primary serve while it is valid
  util::Lease read_lease_;          // a coordinated backup's readers answer while it is valid
  // The replication thread's (a coordinated backup): the attached primary's epoch and member.
  uint64_t attached_epoch_ = 0;
  std::string attached_member_;
  absl::Time next_lease_request_ = absl::InfinitePast();
  // kBackup: the replication port, its thread, and the attached primary (replication thread
  // only), whose QPs alone can write the partitions and redo areas (its own PD).
  std::unique_ptr<transport::control::Listener> replication_listener_;
  std::thread replication_thread_;
  struct Attachment {
    std::unique_ptr<transport::control::Channel> channel;
    std::unique_ptr<transport::CompletionQueue> cq;
    std::unique_ptr<transport::ProtectionDomain> pd;
    std::vector<std::unique_ptr<transport::MemoryRegion>> mrs;
    std::vector<std::unique_ptr<transport::QueuePair>> qps;
  };
  // Attach, detach and promotion exclude one another (control plane only).
  util::Mutex replication_mutex_;
  std::unique_ptr<Attachment> primary_;  // written under replication_mutex_ (replication thread)
  bool promoting_ ABSL_GUARDED_BY(replication_mutex_) = false;
  // A primary attached once (this backup's data is its): no other attaches, promotion may.
  bool ever_attached_ ABSL_GUARDED_BY(replication_mutex_) = false;
  // Coordinated: the configuration the control thread last read, for the replication thread.
  util::Mutex published_mutex_;
  Configuration published_ ABSL_GUARDED_BY(published_mutex_);
  // The gates of a promoted coordinated primary exist (Stats may read them).
  std::atomic<bool> gates_ready_{false};
  // Its primary dropped it (kReplicaDropped): GETs answer BACKUP_BUSY, promotion is refused.
  std::atomic<bool> stale_{false};
  // A state transfer to it is under way (ReplicaHello::transfer): no reads, no promotion.
  std::atomic<bool> syncing_{false};
  // stale_ or syncing_, or no primary attached yet (a restarted backup's empty region is no
  // copy of anything): every GET answers BACKUP_BUSY (the replica readers watch it).
  std::atomic<bool> reads_refused_{true};
  std::atomic<bool> primary_attached_{false};
};

}  // namespace herd

#endif  // HERD_HERD_REPLICATION_MEMBER_H_
