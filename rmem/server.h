// rmem_server's engine: a pool (pool.h) served to many clients over one fabric (wire.h says
// what travels).
//
// Ownership, the rule a client cannot break: each client gets its own protection domain, and
// the server registers in it only the regions that client allocated or was granted by tag (one
// MR per region, remote READ and WRITE), next to its QP and its message buffers. A QP reaches
// only MRs of its own PD: on verbs the NIC refuses (a remote access error) a READ or WRITE whose
// rkey belongs to another PD, so even a guessed or stolen rkey of another client's region is
// useless; the shm fabric checks the same rule (Peer::Resolve takes the QP's PD). When a
// transaction frees a region, its MR is deregistered in every client's PD before the reply:
// memory that is reused later is unreachable through the old rkey.
//
// Identity: the server, not the client, picks a client's id (and a random secret) when it first
// joins; a client that reconnects (after a restart, or a lost connection) presents both to be
// the same client again, which is how a retried txn_go is answered instead of applied twice. A
// client that connects twice at once is refused the second time.
//
// A client's queued ops live only in its session: when its control connection closes (it left,
// or died: kill -9 closes the socket) they are discarded. A txn_go the server received is
// applied before anything else is done for that client, whether or not the client is alive to
// read the reply; the pool makes it all-or-nothing across a kill of the server itself.
//
// Threading: every method runs on one thread (Run's). It polls the command CQ and serves the
// control connections between polls; a large transaction's copies run on it too (the other
// clients wait for it: they are memory copies at memcpy speed).
#ifndef HERD_RMEM_SERVER_H_
#define HERD_RMEM_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rmem/pool.h"
#include "rmem/wire.h"
#include "transport/control/channel.h"
#include "transport/control/handshake_set.h"
#include "transport/fabric.h"
#include "transport/join_listener.h"
#include "transport/shared_memory.h"

namespace rmem {

// Clients joined at once (each holds a PD, a QP and kSessionBytes of buffers here).
inline constexpr size_t kDefaultServerClients = 256;
// How long a new connection may take to send its hello.
inline constexpr absl::Duration kHelloTimeout = absl::Seconds(10);

struct ServerOptions {
  // The pool: a file that exists is opened (validated, a committed transaction replayed) and its
  // geometry used (pool_bytes must be 0 or match); otherwise created with these options.
  PoolOptions pool;
  transport::DeviceOptions device;
  std::string listen_address = "0.0.0.0";
  uint16_t port = 0;  // 0: any free port
  size_t max_clients = kDefaultServerClients;
  // Tests: where the pool stops a commit (to play a kill of the server at that instant).
  StepHook pool_hook;
};

struct ServerCounters {
  uint64_t joins = 0, resumes = 0, refused = 0, left = 0;
  uint64_t allocs = 0, commits = 0, duplicates = 0, commands_refused = 0;
  uint64_t ops_discarded = 0;  // queued ops dropped because their client left before txn_go
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();

  uint16_t port() const { return connections_->port(); }
  // Serves commands and connections for about `timeout` (less when there is work).
  void Step(absl::Duration timeout);
  void Run(const std::atomic<bool>& stop);

  size_t clients() const { return sessions_.size(); }
  const ServerCounters& counters() const { return counters_; }
  const Pool& pool() const { return pool_; }
  std::string StatsJson() const;

 private:
  struct Session;
  Server(const ServerOptions& options, Pool pool);
  absl::Status Open();
  // Waits up to `wait` for control traffic: hellos, departures.
  void ServeConnections(absl::Duration wait);
  void OnHello(uint64_t conn, const transport::control::Message& message);
  absl::StatusOr<std::unique_ptr<Session>> NewSession(uint32_t slot);
  void Refuse(uint64_t conn, const absl::Status& why);
  void Drop(uint64_t conn, const absl::Status& why);  // the client left: forget its session
  // Polls the CQ once; returns how many completions it handled.
  size_t PollCommands();
  void OnCommand(Session& session, uint32_t recv_slot, uint32_t bytes);
  absl::Status Alloc(Session& session, uint64_t bytes, uint64_t tag, ReplyHeader* reply);
  absl::StatusOr<CommitResult> TxnGo(Session& session, uint64_t txn_id);
  // The pool transaction of a session's queued ops, each checked against what it may reach.
  absl::StatusOr<Txn> Translate(const Session& session, uint64_t txn_id) const;
  void Reply(Session& session, uint32_t recv_slot, const ReplyHeader& header,
             const absl::Status& status);
  absl::Status PostReceive(Session& session, uint32_t recv_slot);

  ServerOptions options_;
  Pool pool_;
  std::unique_ptr<transport::Device> device_;
  // One CQ for every client's QP: receives (commands) and sends (replies).
  std::unique_ptr<transport::CompletionQueue> cq_;
  uint64_t cq_depth_ = 0;
  // Every session's message buffers, one slice per session slot (registered in its PD).
  std::unique_ptr<transport::SharedMemory> buffers_;
  transport::JoinListener connections_;
  std::vector<std::unique_ptr<Session>> slots_;       // by session slot (max_clients)
  absl::flat_hash_map<uint64_t, uint32_t> sessions_;  // connection id -> slot
  std::vector<uint32_t> free_slots_;                  // popped from the back: lowest first
  absl::flat_hash_set<uint64_t> connected_;           // client ids with a session
  uint32_t next_generation_ = 1;
  absl::Time last_command_ = absl::InfinitePast();  // when the CQ last had work
  ServerCounters counters_;
  absl::Time started_ = absl::Now();
};

}  // namespace rmem

#endif  // HERD_RMEM_SERVER_H_
