// The hopscotch service's control messages (hop_server <-> clients), over a HandshakeSet's
// connection: TCP (transport/control) or RDMA-CM (transport/cm_channel.h). A client connection
//   Hello(version, its RC QP)     -> Welcome(the server's RC QP, where the table is) [or Error]
// and then, any number of times, on the same connection:
//   Upsert(key/value pairs)       -> Upserted(one status per pair, in order)
//   StatsRequest                  -> Stats(one JSON object)
// Lookups never touch this connection: they are RDMA READs on the connected QP. Closing the
// connection (or dying) is how a client leaves; its QP goes with it.
//
// Over RDMA-CM the lookup QP needs no control connection at all (as the original design does):
// the client connects it with the CM, its REQ private data carrying EncodeCmHello, and the
// server's REP carries EncodeCmWelcome: where the table is and its rkey. A client that later
// upserts or asks for stats opens a control connection whose Hello asks for no QP
// (lookup_qp = false).
#ifndef HERD_HOPSCOTCH_WIRE_H_
#define HERD_HOPSCOTCH_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hopscotch/format.h"
#include "transport/cm.h"
#include "transport/cm_channel.h"
#include "transport/types.h"

namespace hopscotch {

enum HopMessage : uint16_t {
  kHopHello = 1,
  kHopWelcome = 2,
  kHopError = 3,  // payload: the reason (text); the server closes the connection after it
  kHopUpsert = 4,
  kHopUpserted = 5,
  kHopStatsRequest = 6,
  kHopStats = 7,
};

// 2: the hello says whether the client wants a lookup QP; lookups may join by RDMA-CM alone.
inline constexpr uint32_t kHopProtocolVersion = 2;
// Pairs one Upsert message may carry: bounds the control thread's work per message (each pair is
// an insert with displacement, microseconds) and the message, which must fit one RDMA-CM control
// message too.
inline constexpr uint32_t kMaxUpsertsPerMessage = 512;
// The largest Upsert payload: a u32 count, then per pair a u32 length + key and a u32 length +
// value (WireWriter::Bytes).
inline constexpr uint32_t kMaxUpsertMessageBytes =
    4 + kMaxUpsertsPerMessage * (4 + kKeyBytes + 4 + kValueBytes);
static_assert(kMaxUpsertMessageBytes <= transport::kCmMaxMessageBytes - transport::kCmHeaderBytes,
              "a full upsert message must fit one RDMA-CM control message");
// The CM join's private data: a u32 version in the REQ; in the REP the table's address (u64),
// rkey (u32), bytes, home buckets and seed (u64 each), shard and shards (u32 each).
inline constexpr size_t kCmHelloBytes = 4;
inline constexpr size_t kCmWelcomeBytes = 8 + 4 + 8 + 8 + 8 + 4 + 4;
static_assert(kCmHelloBytes <= transport::kCmRequestAppBytes);
static_assert(kCmWelcomeBytes <= transport::kCmReplyAppBytes);

struct HopHello {
  uint32_t version = kHopProtocolVersion;
  bool lookup_qp = true;     // false: upserts and stats only (the CM connected the lookup QP)
  transport::QpEndpoint qp;  // the client's RC QP that will READ (ignored without lookup_qp)
};

struct HopWelcome {
  transport::QpEndpoint qp;   // the server's end (zero without a lookup QP, and over the CM)
  uint64_t table_addr = 0;    // the table file's first byte (its header) in the server's MR
  uint32_t table_rkey = 0;    // remote READ only
  uint64_t table_bytes = 0;   // FileBytes(home_buckets): every READ lies within
  uint64_t home_buckets = 0;  // power of two
  uint64_t hash_seed = 0;
  uint32_t shard = 0;
  uint32_t shards = 1;
};

struct HopUpsert {
  std::string key;  // validated by the server (ValidateKey)
  Value value{};
};

// Status codes of an upsert, as absl::StatusCode values (OK, INVALID_ARGUMENT for a key that
// cannot be stored or belongs to another shard, RESOURCE_EXHAUSTED for a full neighbourhood,
// FAILED_PRECONDITION when the server is read-only).
struct HopUpserted {
  std::vector<uint32_t> codes;
};

std::vector<uint8_t> Encode(const HopHello& hello);
std::vector<uint8_t> Encode(const HopWelcome& welcome);
std::vector<uint8_t> Encode(const std::vector<HopUpsert>& upserts);
std::vector<uint8_t> Encode(const HopUpserted& upserted);
absl::StatusOr<HopHello> DecodeHello(const std::vector<uint8_t>& bytes);
// The RDMA-CM join's private data: the hello (the protocol version; a lookup QP is implied) in
// the REQ and the welcome without its QP (the CM exchanged the endpoints) in the REP.
std::vector<uint8_t> EncodeCmHello();
absl::Status DecodeCmHello(absl::Span<const uint8_t> bytes);
std::vector<uint8_t> EncodeCmWelcome(const HopWelcome& welcome);
absl::StatusOr<HopWelcome> DecodeCmWelcome(absl::Span<const uint8_t> bytes);
// Also checks what a client relies on: a table of a valid geometry, an address range that does
// not wrap, shard < shards.
absl::StatusOr<HopWelcome> DecodeWelcome(const std::vector<uint8_t>& bytes);
// At most kMaxUpsertsPerMessage pairs, keys at most kKeyBytes long (their content is the server's
// to validate, so it can answer each pair).
absl::StatusOr<std::vector<HopUpsert>> DecodeUpserts(const std::vector<uint8_t>& bytes);
absl::StatusOr<HopUpserted> DecodeUpserted(const std::vector<uint8_t>& bytes);

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_WIRE_H_
