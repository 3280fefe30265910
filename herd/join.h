// The join handshake over the control plane: TCP (transport/control) or RDMA-CM
// (transport/cm_channel.h), the same messages either way. A client thread:
//   Hello(logical clients)            -> ServerConfig(the server's Config)  [or Error]
//   creates its QPs to match, then
//   Join(its endpoints, response region) -> Welcome(client ids, region, the server's endpoints)
// and keeps the connection open: closing it (or dying) is how it leaves.
#ifndef HERD_HERD_JOIN_H_
#define HERD_HERD_JOIN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "herd/config.h"
#include "herd/protocol.h"
#include "transport/cm_channel.h"
#include "transport/control/message_channel.h"
#include "transport/fabric.h"
#include "transport/types.h"

namespace herd {

enum MessageType : uint16_t {
  kHello = 1,
  kServerConfig = 2,
  kJoin = 3,
  kWelcome = 4,
  kError = 5,
  // Instead of a Hello: the server answers kStats (its counters as JSON, StatsJson) and closes.
  kStatsRequest = 6,
  kStats = 7,
  // Replication (herd/replication/link.h): a primary attaching to a backup's replication port.
  kReplicaHello = 8,
  kReplicaWelcome = 9,
  // Instead of a Hello, to a backup: become the primary (herd_admin promote). Answered kPromoted
  // (a JSON line) or kError, then closed.
  kPromoteRequest = 10,
  kPromoted = 11,
  // Primary to backup, on the replication channel: it dropped the backup and goes on without it.
  kReplicaDropped = 12,
  // Primary to a joining backup, on the replication channel: the state transfer is complete and
  // every later write reaches it before it is acknowledged; it serves reads from now on.
  kReplicaSynced = 13,
  // Coordinated replication, on the replication channel: a backup asks for its read lease
  // (payload: the u64 time it sent the request, its monotonic clock), and the primary grants it
  // (the same u64 back): the backup then serves reads until that time + its lease length.
  kLeaseRequest = 14,
  kLeaseGrant = 15,
};

struct Hello {
  uint32_t clients = 1;                  // logical clients this connection hosts
  uint32_t wire_version = kWireVersion;  // the request/response layouts the client speaks
};

struct Join {
  transport::QpEndpoint ud;  // receives UD responses; sends UD requests
  uint32_t ud_qkey = 0;      // the qkey ud accepts (drawn by the client: forgers must guess it)
  std::vector<transport::QpEndpoint> request_qps;   // per worker, when requests are WRITEs
  std::vector<transport::QpEndpoint> response_qps;  // per worker, when responses are WRITEs
  uint64_t response_region_addr = 0;                // [worker][client][window] response slots
  uint32_t response_region_rkey = 0;
  // Config::large_values(): per worker, the client's RC QP for WRITE_WITH_IMM (large PUTs) and
  // READ (large GETs).
  std::vector<transport::QpEndpoint> large_qps;
  // A client following a failover (Client::Follow): the first client id and the session secret
  // it had at the old primary, so the new one answers its retried mutations from the outcomes
  // replicated with them (herd/replication/outcome_table.h). resume_session 0: a fresh client.
  uint32_t resume_first_client_id = 0;
  uint64_t resume_session = 0;
};

struct Welcome {
  uint32_t first_client_id = 0;  // this connection's clients are first .. first + clients - 1
  uint64_t region_addr = 0;      // this session's block of request slots: [client][worker][window]
  uint32_t region_rkey = 0;      // ... registered for this session's QPs alone
  uint64_t secret = 0;  // the session's checksum key (protocol.h): requests and WRITE responses
  std::vector<transport::QpEndpoint> worker_ud;  // per worker: its request/first UD QP
  // [worker][ud_qps_per_worker]: the QPs a worker answers from; UD responses from any other QP
  // are forgeries.
  std::vector<uint32_t> worker_response_qpns;
  std::vector<transport::QpEndpoint> request_qps;   // per worker, the server's end
  std::vector<transport::QpEndpoint> response_qps;  // per worker, the server's end
  // Config::large_values(): per worker, the server's end of the large-value QP, and the
  // session's landing buffers: [worker][landing_buffers] x Config::landing_bytes().
  std::vector<transport::QpEndpoint> large_qps;
  uint64_t landing_addr = 0;
  uint32_t landing_rkey = 0;
  // Whether this server executes mutations now (an unreplicated server, a primary, a promoted
  // backup); a backup answers them NOT_PRIMARY.
  bool takes_writes = true;
  // The join named a lost session (Join::resume_session) and this server takes its outcomes
  // over: only a promoted backup, which holds what its dead primary replicated.
  bool resumed = false;
  // Coordinated replication: the configuration epoch the server acts in (0: uncoordinated).
  // A client follows only to the primary of a newer epoch (Client::Follow).
  uint64_t epoch = 0;
};

std::vector<uint8_t> Encode(const Hello& hello);
std::vector<uint8_t> Encode(const Config& config);
std::vector<uint8_t> Encode(const Join& join);
std::vector<uint8_t> Encode(const Welcome& welcome);
absl::StatusOr<Hello> DecodeHello(const std::vector<uint8_t>& bytes);
absl::StatusOr<Config> DecodeConfig(const std::vector<uint8_t>& bytes);
absl::StatusOr<Join> DecodeJoin(const std::vector<uint8_t>& bytes, uint32_t workers);
absl::StatusOr<Welcome> DecodeWelcome(const std::vector<uint8_t>& bytes, uint32_t workers,
                                      uint32_t ud_qps_per_worker);

using transport::ConnectControl;  // transport/cm_channel.h

// Asks the server at `host_port` for its counters (kStatsRequest on a connection of its own, no
// session): one JSON object with "uptime_s", "config" and "stats". `device`: for kCm only.
absl::StatusOr<std::string> FetchServerStats(
    std::string_view host_port, absl::Duration timeout,
    transport::ConnectMode mode = transport::ConnectMode::kTcp,
    transport::Device* device = nullptr);

// Asks the backup at `host_port` to become the primary (kPromoteRequest); its answer, a JSON
// object, or why not.
absl::StatusOr<std::string> RequestPromotion(std::string_view host_port, absl::Duration timeout);

// Receives one message and checks its type; a kError message becomes its status.
absl::StatusOr<transport::control::Message> Expect(transport::control::MessageChannel& channel,
                                                   MessageType type, absl::Duration timeout);

}  // namespace herd

#endif  // HERD_HERD_JOIN_H_
