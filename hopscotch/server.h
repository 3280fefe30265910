// hop_server's engine: serves one hopscotch table file to one-sided readers.
//
// The table file is mapped MAP_SHARED (MAP_SYNC where the file system is DAX, table.h) and the
// whole file is registered for remote READ only: a client can read any byte of the table and
// write none. Each client connection (a HandshakeSet connection: TCP on the shm fabric and on
// verbs, or RDMA-CM on verbs) gets its own RC QP on the server, connected to the client's; the
// server never posts on it: lookups cost the server no CPU at all. The connection stays open for
// the client's whole stay and carries the small RPCs (wire.h): upserts, applied by this thread,
// the table's only writer, with displacement while clients READ, and stats. Over RDMA-CM a
// client's lookup QP may instead be connected by the CM alone, the table's address and rkey in
// the REP's private data (wire.h), with no control connection unless the client wants one.
//
// Threading: every method runs on one thread (the control thread), Run's.
#ifndef HERD_HOPSCOTCH_SERVER_H_
#define HERD_HOPSCOTCH_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hopscotch/table.h"
#include "hopscotch/wire.h"
#include "transport/cm.h"
#include "transport/control/channel.h"
#include "transport/control/handshake_set.h"
#include "transport/fabric.h"
#include "transport/join_listener.h"

namespace hopscotch {

// Client connections at once (each holds one QP on the server).
inline constexpr size_t kDefaultMaxClients = 1024;
// How long a new connection may take to send its hello.
inline constexpr absl::Duration kHelloTimeout = absl::Seconds(10);

struct ServerOptions {
  std::string table;                                     // the table file (hop_build's output)
  bool read_only = false;                                // map it read-only and refuse upserts
  Persistence persistence = Persistence::kProcessCrash;  // what an acknowledged upsert survives
  transport::DeviceOptions device;
  transport::ConnectMode connect = transport::ConnectMode::kTcp;
  std::string listen_address = "0.0.0.0";
  uint16_t port = 0;  // 0: any free port
  // Clients joined at once (each holds one QP here), and separately connections still in their
  // handshake (a flood of those evicts the oldest of them, never a joined client).
  size_t max_clients = kDefaultMaxClients;
};

struct ServerCounters {
  uint64_t joins = 0;            // clients welcomed
  uint64_t refused = 0;          // connections refused (bad hello, QP setup failure, bad message)
  uint64_t left = 0;             // clients gone (closed, died, evicted)
  uint64_t upserts = 0;          // pairs applied
  uint64_t upserts_refused = 0;  // pairs answered with an error
};

class Server {
 public:
  // Opens the table (errors name the file: missing, truncated, wrong format, in use by another
  // server or a hop_build: table_lock.h), the device, registers the table and starts listening.
  // The table's lock is held until the server is destroyed.
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();  // drops every client, then closes the table (marked clean)

  uint16_t port() const { return connections_->port(); }
  // Serves connections for up to `timeout`: hellos, upserts, stats, departures.
  void Step(absl::Duration timeout);
  // Steps until `stop` is set.
  void Run(const std::atomic<bool>& stop);

  // Joined connections: control sessions (with or without a lookup QP) and CM lookup QPs.
  size_t clients() const { return sessions_.size() + cm_lookups_.size(); }
  const ServerCounters& counters() const { return counters_; }
  const Table& table() const { return table_; }
  // The table, counters and the device's verb counters as one JSON object.
  std::string StatsJson() const;

 private:
  struct Session {
    std::unique_ptr<transport::QueuePair> qp;  // null: control only (upserts, stats)
  };
  // A lookup QP connected by RDMA-CM with no control connection.
  struct CmLookup {
    std::unique_ptr<transport::QueuePair> qp;
    std::unique_ptr<transport::CmConnection> cm;  // destroyed first: disconnect, then the QP
    absl::Time deadline;                          // to finish the CM handshake by
  };
  Server(const ServerOptions& options, Table table) : options_(options), table_(std::move(table)) {}
  absl::Status Open();
  absl::Status CheckRoom() const;  // ResourceExhausted at max_clients
  absl::StatusOr<std::unique_ptr<transport::QueuePair>> NewLookupQp();
  HopWelcome TableWelcome() const;  // everything but the QP
  void OnCmLookupRequest(std::unique_ptr<transport::CmRequest> request);
  // Drops CM lookups that disconnected, or never finished their handshake by their deadline.
  void ReapCmLookups();
  void OnHello(uint64_t id, const transport::control::Message& message);
  void OnUpsert(uint64_t id, const transport::control::Message& message);
  void Refuse(uint64_t id, const absl::Status& why);

  ServerOptions options_;
  Table table_;
  std::unique_ptr<transport::Device> device_;
  std::unique_ptr<transport::ProtectionDomain> pd_;
  // The QPs' CQ: the server posts nothing, so nothing ever completes on it.
  std::unique_ptr<transport::CompletionQueue> cq_;
  std::unique_ptr<transport::MemoryRegion> mr_;
  transport::JoinListener connections_;
  absl::flat_hash_map<uint64_t, Session> sessions_;  // by connection id
  std::vector<CmLookup> cm_lookups_;
  ServerCounters counters_;
  absl::Time started_ = absl::Now();
};

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_SERVER_H_
