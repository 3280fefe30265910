// The herd server: one request region, N pinned workers (one MICA partition each), and a
// control thread that admits and retires clients while the workers run.
#ifndef HERD_HERD_SERVER_H_
#define HERD_HERD_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "herd/config.h"
#include "herd/pinning.h"
#include "herd/replication/configuration.h"
#include "herd/replication/member.h"
#include "herd/replication/role.h"
#include "herd/worker.h"
#include "mica/config.h"
#include "transport/control/channel.h"
#include "transport/control/handshake_set.h"
#include "transport/control/pending_connections.h"
#include "transport/fabric.h"
#include "transport/join_listener.h"
#include "transport/shared_memory.h"

namespace herd {

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
  // Fenced: whether another member took over (only then may its copy be dropped; see
  // herd/replication/configuration.h, Succession), read from the stored configuration.
  Succession succession = Succession::kUnknown;
  double lease_left_s = 0;
  transport::CounterSnapshot fabric;  // all of the server's QPs and CQs
};

// The counters of `now` since `since` (an empty ServerStats: since the start) over `seconds`,
// as one JSON object: rates, per-worker rows, and the fabric's counters.
std::string StatsJson(const ServerStats& now, const ServerStats& since, double seconds);

class Server : private ReplicationHost {
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
    return replication_ != nullptr ? replication_->replication_port() : 0;
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
  // ReplicationHost, for replication_.
  transport::Device& device() override { return *device_; }
  bool stopping() const override { return stop_.load(); }
  uint16_t client_port() const override { return port(); }
  std::vector<std::string> RunOnWorkers(absl::Span<ReplicaTask* const> tasks) override;
  void WaitForWorkers();
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
    std::unique_ptr<mica::Partition> partition;  // until the worker takes it
    std::unique_ptr<Worker> worker;
  };
  std::vector<WorkerResources> workers_;
  std::vector<std::thread> threads_;
  std::thread control_;
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

  // The primary or backup role of a replicated server (null without replication). Declared
  // after workers_: its gates and readers go before the workers that name them (their threads
  // are joined by then), and the gates before the partitions they record.
  std::unique_ptr<ReplicationMember> replication_;
};

}  // namespace herd

#endif  // HERD_HERD_SERVER_H_
