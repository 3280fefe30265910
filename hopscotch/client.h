// A one-sided hopscotch client: one thread's connections to every shard's hop_server.
//
// A lookup hashes the key to its shard (ServerOf) and, with that table's seed, to its home
// bucket, and READs the 2 KiB neighbourhood at table_addr + kHeaderBytes + home * 64 from that
// server: one READ, no server CPU. The snapshot is searched by the pure reader
// (neighbourhood.h). A torn snapshot (a line the server was rewriting) is read again; a miss is
// confirmed by a second READ unless confirm_misses is off, since the reader's no-false-miss
// argument leans on lines being copied in ascending order, which the shm fabric promises and a
// NIC only does in practice (fabric.h).
//
// Lookups are pipelined: Submit queues up to `window` of them, Poll posts what is queued (one
// doorbell per server per call, a chain of WRs prepared once per window slot, only the address
// filled in per lookup) and reaps what completed. Upserts and stats go over the control
// connection as small RPCs (blocking; wire.h).
//
// Joining: over TCP (and --connect=tcp on verbs) a control connection's hello and welcome
// exchange the QPs and say where the table is. Over RDMA-CM the lookup QP is connected by the CM
// alone, the table's address and rkey arriving in the REP's private data (wire.h); a control
// connection is opened only when the client first upserts or asks for stats.
//
// Not thread-safe: one Client per thread (each has its own device, CQ and QPs).
#ifndef HERD_HOPSCOTCH_CLIENT_H_
#define HERD_HOPSCOTCH_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hopscotch/neighbourhood.h"
#include "hopscotch/wire.h"
#include "transport/cm.h"
#include "transport/control/message_channel.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

namespace hopscotch {

inline constexpr uint32_t kDefaultWindow = 16;
// Torn snapshots of one lookup read again before it ends as kTorn: a line stays busy for the
// few stores of one fill, so this many in a row means the server is stuck or hostile.
inline constexpr uint32_t kDefaultMaxRereads = 10000;

struct ClientOptions {
  std::vector<std::string> servers;  // host:port of every shard's server, in any order
  transport::DeviceOptions device;
  transport::ConnectMode connect = transport::ConnectMode::kTcp;
  absl::Duration timeout = absl::Seconds(10);  // connecting, and each RPC
  uint32_t window = kDefaultWindow;            // lookups in flight
  bool confirm_misses = true;
  uint32_t max_rereads = kDefaultMaxRereads;
};

struct LookupDone {
  uint64_t tag = 0;
  // OK with result.kind kFound or kMiss (or kTorn after max_rereads); otherwise the READ failed
  // (the server is gone: kUnavailable naming the completion status).
  absl::Status status;
  LookupResult result;
  uint32_t reads = 0;  // READs this lookup took
};

struct ClientStats {
  uint64_t lookups = 0;        // completed
  uint64_t reads = 0;          // READs posted
  uint64_t rereads = 0;        // of which torn snapshots read again
  uint64_t confirm_reads = 0;  // of which second READs of a miss
  uint64_t found = 0, misses = 0, torn = 0, failed = 0;
};

class Client {
 public:
  // Connects to every server; they must together serve each shard of one sharding exactly once.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  // Queues a lookup; InvalidArgument for a key no table can hold, ResourceExhausted when
  // `window` lookups are in flight (Poll first), Unavailable when its server's QP failed.
  absl::Status Submit(std::string_view key, uint64_t tag);
  // Posts what is queued and reaps completions into `out` (never blocks).
  size_t Poll(absl::Span<LookupDone> out);
  uint32_t in_flight() const { return in_flight_; }

  // One lookup, waited for (up to options.timeout).
  absl::StatusOr<LookupResult> Lookup(std::string_view key);
  // Inserts or updates keys through their shards' servers (pairs grouped per server, at most
  // kMaxUpsertsPerMessage per message); one status per pair, in order.
  absl::StatusOr<std::vector<absl::Status>> Upsert(const std::vector<HopUpsert>& pairs);
  // A server's stats JSON (shard 0..shards-1).
  absl::StatusOr<std::string> ServerStats(uint32_t shard);

  uint32_t shards() const { return static_cast<uint32_t>(servers_.size()); }
  const ClientStats& stats() const { return stats_; }
  // This client's verb economy: READs, doorbells and bytes (its device's counters).
  transport::CounterSnapshot counters() const { return device_->counters(); }

 private:
  struct Server {
    std::string address;  // host:port, as named (errors name it: a lookup-only CM join has no
                          // control channel until ControlOf opens one)
    // Null over RDMA-CM until the first upsert or stats request (ControlOf).
    std::unique_ptr<transport::control::MessageChannel> control;
    std::unique_ptr<transport::CmConnection> cm;  // the lookup QP's CM connection (RDMA-CM)
    std::unique_ptr<transport::QueuePair> qp;
    HopWelcome table;
    bool failed = false;
    transport::SendWr* chain_head = nullptr;  // READs queued for the next Poll
    transport::SendWr* chain_tail = nullptr;
  };
  struct Slot {
    bool busy = false;
    uint64_t tag = 0;
    uint32_t server = 0;
    PaddedKey key{};
    uint32_t reads = 0;
    uint32_t torn_reads = 0;  // of which re-reads of a torn snapshot
    uint32_t misses = 0;
    bool unposted = false;  // its post failed: no completion will come
    transport::Sge sge{};
    transport::SendWr wr;
  };
  explicit Client(const ClientOptions& options) : options_(options) {}
  absl::Status Open();
  // Connects server.qp and says where its table is: by a control connection's hello and welcome,
  // or by the CM's private data.
  absl::StatusOr<HopWelcome> JoinByControl(Server& server);
  absl::StatusOr<HopWelcome> JoinByCm(Server& server);
  absl::StatusOr<transport::control::MessageChannel*> ControlOf(uint32_t shard);
  void Queue(uint32_t slot);
  void Flush();
  void Finish(Slot& slot, absl::Status status, const LookupResult& result, LookupDone* out);

  ClientOptions options_;
  std::unique_ptr<transport::Device> device_;
  std::unique_ptr<transport::ProtectionDomain> pd_;
  std::unique_ptr<transport::CompletionQueue> cq_;
  std::unique_ptr<transport::SharedMemory> buffers_;  // window x 2 KiB snapshots
  std::unique_ptr<transport::MemoryRegion> mr_;
  std::vector<Server> servers_;  // by shard
  std::vector<Slot> slots_;      // window
  std::vector<uint32_t> free_slots_;
  std::vector<transport::Completion> completions_;
  uint32_t in_flight_ = 0;
  ClientStats stats_;
};

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_CLIENT_H_
