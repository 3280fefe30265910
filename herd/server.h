// The herd server: one request region, N pinned workers (one MICA partition each), and a
// control thread that admits and retires clients while the workers run.
#ifndef HERD_HERD_SERVER_H_
#define HERD_HERD_SERVER_H_

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "herd/config.h"
#include "herd/pinning.h"
#include "herd/replication/configuration.h"
#include "herd/replication/coordinator.h"
#include "herd/replication/gate.h"
#include "herd/replication/link.h"
#include "herd/replication/replica_reader.h"
#include "herd/replication/role.h"
#include "herd/worker.h"
#include "mica/config.h"
#include "transport/control/channel.h"
#include "transport/control/handshake_set.h"
#include "transport/control/pending_connections.h"
#include "transport/fabric.h"
#include "transport/join_listener.h"
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

struct ServerOptions {
  Config config;
  transport::DeviceOptions device;
  mica::PartitionConfig store;  // per worker; max_value_bytes is capped by the slot
  std::string listen_address = "0.0.0.0";
  uint16_t port = 0;  // 0 picks a free port (see port())
  // kCm: clients join over RDMA-CM (verbs devices; listen_address must be an address of the
  // device's interface) and no TCP port is opened.
  transport::ConnectMode connect = transport::ConnectMode::kTcp;
  std::string worker_cores;  // "" = the device's NUMA node, in order
  bool pin_workers = true;
  // Pages of the request region and the response staging buffers (see transport::PagePolicy).
  transport::PagePolicy region_pages = transport::PagePolicy::kHugeIfAvailable;
  ReplicationServerOptions replication;
};

struct ServerStats {
  std::vector<uint64_t> requests;  // per worker
  std::vector<uint64_t> batches;
  // Per worker, from its MICA partition: a GET that misses a key nobody deleted was evicted (a
  // full bucket) or overwritten by the circular log: cache mode's losses, shown, not hidden.
  std::vector<uint64_t> get_hits, get_misses, evictions, log_wraps;
  // Per worker, large values: GETs answered with a descriptor of their item, and with a copy in
  // a landing buffer (kRequestCopyToLanding).
  std::vector<uint64_t> out_of_line, copied_values;
  uint64_t bad_requests = 0, replays = 0, duplicates = 0, rejected = 0, dropped = 0;
  // Answers dropped (among `dropped`) because their client's own response QP was full.
  uint64_t response_queue_full = 0;
  // Answered NO_MEMORY by the store (an item longer than the log); answered INTERNAL (the
  // server's own inconsistency, e.g. an item in a log that fails its checksum).
  uint64_t no_memory = 0, internal_errors = 0;
  // Store mode (--store_mode=store): levels now, summed over the workers' partitions, and the
  // store's own counters. store_classes lists the size classes that have a span.
  bool store_mode = false;
  struct StoreClass {
    uint64_t block_bytes = 0, used_blocks = 0, capacity_blocks = 0;
  };
  std::vector<StoreClass> store_classes;
  uint64_t pool_bytes = 0, pool_free_bytes = 0, large_bytes = 0;
  std::vector<uint64_t> extra_buckets_in_use;  // per worker
  uint64_t extra_buckets_capacity = 0;         // per worker
  uint64_t no_memory_pool = 0, no_memory_index = 0, moves = 0;
  uint32_t sessions = 0, clients = 0;
  // Departed sessions whose address handles still wait for the UD queues to retire past what
  // they had posted (they pin a mapping of the client's device each), and the fences the idle
  // workers posted so that they do (Worker::RequestFence).
  uint64_t sessions_unreclaimed = 0, fences = 0;
  // Replication (ReplicationRole): the role; a primary's gates summed (live_backups: the fewest
  // any worker still has, < backups means degraded); a backup's replica reads, and whether a
  // primary is attached.
  ReplicationRole role = ReplicationRole::kNone;
  uint32_t backups = 0, live_backups = 0;
  ReplicationCounters replication;
  uint64_t replica_reads = 0, replica_torn = 0, replica_unconfirmed = 0, replica_busy = 0,
           replica_unreleased = 0, replica_held_back = 0;
  bool primary_attached = false;
  bool syncing = false;   // a backup's state transfer is under way
  bool promoted = false;  // a backup promoted (herd_admin promote): a primary without backups
  // Outcomes a promoted primary took over for clients that followed it, and outcomes it could
  // not record (their id's old outcomes still await a client).
  uint64_t resumed_outcomes = 0, unrecorded_outcomes = 0;
  // A primary's GETs held with no held-read buffer free: unanswered, their clients retransmit.
  uint64_t reads_unanswered = 0;
  // Coordinated replication: the configuration epoch this server acts in (0: none), whether it
  // is fenced (it lost its place as primary: it serves nothing), and its lease's time left.
  uint64_t epoch = 0;
  bool fenced = false;
  double lease_left_s = 0;
  transport::CounterSnapshot fabric;  // all of the server's QPs and CQs
};

// The counters of `now` since `since` (an empty ServerStats: since the start) over `seconds`,
// as one JSON object: rates, per-worker rows, and the fabric's counters.
std::string StatsJson(const ServerStats& now, const ServerStats& since, double seconds);

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();

  // Starts the workers and the control thread.
  absl::Status Start();
  // Stops accepting, retires every client, joins every thread. Idempotent.
  void Stop();

  uint16_t port() const { return pending_->port(); }  // the TCP or the RDMA-CM port
  // kBackup: the port primaries attach on.
  uint16_t replication_port() const {
    return replication_listener_ ? replication_listener_->port() : 0;
  }
  const Config& config() const { return options_.config; }
  const std::vector<int>& worker_cores() const { return cores_; }
  std::string device_name() const { return device_->name(); }
  // Page size of the request region: 2 MiB when hugepages backed it.
  size_t region_page_bytes() const { return region_->page_bytes(); }
  ServerStats Stats() const;
  // Tests only: worker `worker`'s partition (its log's bytes, to damage an item as failing
  // memory would).
  const mica::Partition& PartitionForTest(uint32_t worker) const {
    return workers_[worker].worker->partition();
  }

 private:
  // A joining client has this long to send each handshake message (its connection waits in the
  // pending set meanwhile, blocking nobody).
  static constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);
  // TCP keepalive on a replication channel (either end): a peer whose machine died (no FIN ever
  // comes) is found gone; a failure to set it is logged.
  static void KeepReplicationChannelAlive(transport::control::Channel& channel);

  struct Session;
  Server(const ServerOptions& options, std::unique_ptr<transport::control::Listener> listener);
  absl::Status Init();
  void ControlLoop();
  // The join handshake, one message at a time per connection: Hello, then Join.
  struct Handshake {
    uint32_t clients = 0;  // from the Hello
  };
  void OnHandshakeEvent(transport::control::HandshakeEvent& event);
  absl::Status OnHello(uint64_t id, const transport::control::Message& message,
                       Handshake* handshake);
  absl::Status OnJoin(uint64_t id, const transport::control::Message& message,
                      const Handshake& handshake, const std::string& peer);
  absl::Status BuildSession(Session& session, const struct Join& join);
  // Config::large_values(): the session's landing buffers, log registrations and large-value
  // QPs (server_large_values.cc); fills the routes' large-value fields.
  absl::Status BuildLargeValuePath(Session& session, const struct Join& join);
  void Retire(Session& session);
  // Replication (server_primary.cc, server_backup.cc). kPrimary, in Init: attaches to every backup
  // and builds each worker's gate. kBackup, in Init: each worker's redo area and reader; then a
  // thread that admits one primary at a time (ServeReplication).
  absl::Status AttachToBackups();
  absl::Status PrepareReplica();
  void ServeReplication();
  absl::Status AttachPrimary(transport::control::Channel& channel);
  void DetachPrimary();
  // kPrimary, control thread: a backup whose control connection closed is dropped by every gate.
  void WatchBackups();
  // kPrimary, in Init (or a coordinated promotion): the links' PD and per-worker CQs, and each
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
  // kBackup, control thread (a kPromoteRequest): once no primary is attached, every worker
  // replays its last committed batch, takes the partition's state over and takes writes; no
  // primary attaches afterwards. A JSON summary, or why not.
  absl::StatusOr<std::string> Promote();
  // kBackup: runs a ReplicaTask on every worker (replay the last committed batch, clear the
  // commit line; with take_writes, ResumeFromRegion, a version clock jump and writes) and waits
  // for them; what failed, per worker. With take_writes: the control thread only (it notes the
  // ids awaiting their clients' resumption).
  // With make_gates (a coordinated takeover), each worker also answers through a new gate
  // with every backup slot vacant.
  std::vector<std::string> RunOnWorkers(bool take_writes, bool make_gates = false);
  void WaitForWorkers();
  // Coordinated replication (server_coordination.cc). In Init: connects, checks the role
  // against the stored configuration (a kPrimary creates epoch 1) and registers the member.
  absl::Status JoinCluster();
  // Registers this member (waiting out its previous life's registration); a backup whose
  // session expired reconnects and registers again.
  absl::Status Register();
  absl::Status Reconnect();
  // Control thread, every pass: renews the primary's lease, follows the configuration (a
  // backup's failover, a primary's fencing), attaches registered members as backups, and
  // commits their addition and removal.
  void Coordinate();
  // A coordinated server's thread: while it acts as primary, renews its lease on its place.
  void KeepPrimaryLease();
  void CoordinateAsPrimary(const Configuration& stored, int32_t version);
  void CoordinateAsBackup(const Configuration& stored, int32_t version);
  // Takes over as the primary of `next` (committed): waits for the old primary's detachment,
  // promotes the workers with fresh gates, and serves as primary of that epoch.
  absl::Status TakeOver(const Configuration& next);
  // A promotion asked for by herd_admin: the same conditional write as an automatic one.
  absl::StatusOr<std::string> PromoteCoordinated();
  // Ends this primary's service for good (another epoch took over, or its session expired).
  void Fence(std::string_view why);
  // The primary's side of a backup slot's life in coordinated mode (WatchBackups's states).
  void AttachRegisteredMembers(const std::vector<std::string>& members);
  void AnswerLeaseRequests(size_t b);
  bool CommitChange(const Configuration& next, int32_t version);
  // Destroys the retired address handles no posted WR can name any more.
  void BuryRetiredHandles();
  // Makes the fence sink and its handle, and hands them to the workers.
  absl::Status PrepareFences();
  // Gives the sink back the receives fences took.
  void ReclaimFenceReceives();
  // (Re)posts the sink's receives named by `indices`.
  void PostFenceReceives(absl::Span<const uint32_t> indices);
  static uint64_t DrawSecret();
  // The first of `count` contiguous free client ids for a join (a resuming one's old ids when
  // they are free), or why there are none.
  absl::StatusOr<uint32_t> TakeClientIds(uint32_t count, const Join& join);

  const ServerOptions options_;
  // What this server is in its replication group now (alone, primary, backup; promoted,
  // fenced): every role question asks it.
  ServerRole role_;
  // ConnectMode::kTcp: the port bound in Create, until Init hands it to pending_.
  std::unique_ptr<transport::control::Listener> listener_;
  std::unique_ptr<Topology> topology_;
  std::vector<int> cores_;
  std::unique_ptr<transport::Device> device_;
  std::unique_ptr<transport::ProtectionDomain> pd_;
  std::unique_ptr<transport::SharedMemory> region_;
  std::unique_ptr<transport::CompletionQueue> idle_cq_;  // server ends of request QPs: no traffic
  // kPrimary: the backup links' device (ReplicationServerOptions::device; else device_) and PD.
  std::unique_ptr<transport::Device> replication_device_;
  std::unique_ptr<transport::ProtectionDomain> replication_pd_;

  // Address handles of departed sessions, kept until the UD queues that may still hold WRs
  // naming them retired past what they had posted at departure (control thread only). Declared
  // before workers_: what is left here is destroyed after the workers' QPs, which flush.
  struct RetiredHandles {
    std::vector<std::pair<const QueueProgress*, uint64_t>> wait_for;  // queue, posted then
    std::vector<std::unique_ptr<transport::AddressHandle>> handles;
  };
  std::vector<RetiredHandles> graveyard_;
  std::atomic<uint64_t> graveyard_size_{0};  // for Stats()
  // Where the workers' fences go (Worker::RequestFence): a UD QP whose receives the control
  // thread gives back (ReclaimFences), and the handle that names it. Declared before workers_:
  // destroyed after the QPs whose WRs may name it.
  std::unique_ptr<transport::CompletionQueue> fence_cq_;
  std::unique_ptr<transport::QueuePair> fence_sink_;
  std::unique_ptr<transport::SharedMemory> fence_buffers_;
  std::unique_ptr<transport::MemoryRegion> fence_mr_;
  std::unique_ptr<transport::AddressHandle> fence_ah_;

  // Destroyed in reverse: the worker, then its QPs (whose pending WRs read the staging and
  // receive buffers), then the memory, then the CQs.
  struct WorkerResources {
    std::unique_ptr<transport::CompletionQueue> send_cq, recv_cq;
    std::unique_ptr<transport::CompletionQueue> imm_cq;  // large PUTs' WRITE_WITH_IMMs
    std::unique_ptr<transport::SharedMemory> staging, receives;
    std::unique_ptr<transport::MemoryRegion> staging_mr, receives_mr;
    std::vector<std::unique_ptr<transport::QueuePair>> ud_qps;
    // kPrimary: the links' CQ; kBackup: the redo area the primary's chains land in.
    std::unique_ptr<transport::CompletionQueue> replication_cq;
    std::unique_ptr<transport::SharedMemory> redo;
    std::unique_ptr<mica::Partition> partition;  // until the worker takes it
    std::unique_ptr<Worker> worker;
    std::unique_ptr<ReplicaReader> reader;  // kBackup
    // kPrimary: destroyed before the worker (it unhooks the partition's recorder) and after the
    // links' QPs (their pending WRs read its staging ring).
    std::unique_ptr<ReplicationGate> gate;
    std::vector<std::unique_ptr<transport::QueuePair>> backup_qps;  // one per backup
  };
  std::vector<WorkerResources> workers_;
  std::vector<std::thread> threads_;
  std::thread control_;
  std::thread lease_keeper_;  // coordinated servers: KeepPrimaryLease
  std::atomic<bool> stop_{false};
  bool started_ = false;
  absl::Time start_time_;

  // Control thread only (Stats() reads the device's counters and atomics, never these).
  // The joins in progress, over TCP (PendingConnections) or RDMA-CM (CmHandshakes).
  transport::JoinListener pending_;
  absl::flat_hash_map<uint64_t, Handshake> handshakes_;  // by pending connection id
  std::vector<std::unique_ptr<Session>> sessions_;
  std::vector<bool> client_ids_used_;
  // After a promotion: ids whose outcomes the old primary left and no client resumed yet.
  std::vector<uint8_t> ids_awaiting_resume_;
  std::vector<uint8_t> queue_slot_generation_;  // per session queue slot
  std::vector<bool> queue_slots_used_;
  uint32_t next_generation_ = 1;
  std::atomic<uint32_t> session_count_{0}, client_count_{0};

  // kPrimary: each backup's control connection (its closing drops the backup), and whether
  // that was seen. (The links' PD is declared before workers_, whose QPs and gates use it.)
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
  // Per backup slot: the rejoin attempt running on its own thread (StartRejoin), if any. Stop()
  // waits for them (each bounded by its connect and welcome timeouts) before the links' PD and
  // the workers go.
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
  Configuration held_;                       // the configuration this server acts in
  int32_t held_version_ = 0;                 // its stored version (what a conditional write names)
  std::atomic<uint32_t> config_backups_{0};  // held_.backups.size(), for Stats
  uint64_t coordinator_changes_ = 0;         // coordinator_->changes() last acted on
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
  // Coordinated: the primary attached is of an older epoch than the configuration's (set by the
  // control thread): the replication thread detaches it (revoking its access) at once.
  std::atomic<bool> detach_requested_{false};
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

#endif  // HERD_HERD_SERVER_H_
