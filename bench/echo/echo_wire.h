// The echo baseline's setup exchange over the control plane (transport/control), shaped like
// herd's join: the client sends its QP endpoints and logical client count, the server answers
// with the parameters it runs with (authoritative, as in herd) and where the request slots are.
//
// The echo is herd with the store and the protocol taken out: clients WRITE requests into
// end-aligned slots over UC, one pinned server thread polls the slots and answers each with a
// UD SEND of a fixed-size response, chained and selectively signalled exactly as herd's worker
// does. Its throughput is the ceiling herd's engine can approach on the same fabric and cores.
#ifndef HERD_BENCH_ECHO_ECHO_WIRE_H_
#define HERD_BENCH_ECHO_ECHO_WIRE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/types.h"

namespace bench::echo {

enum MessageType : uint16_t { kHello = 1, kWelcome = 2, kError = 3 };

// The qkey of the echo's UD QPs.
inline constexpr uint32_t kEchoQkey = 0x4543484f;  // "ECHO"

// Every message (request and response) ends with this tag; a request's tag comes back verbatim
// in its response, so the client can match them. The server never interprets it: it only
// copies 16 bytes, so no client-written byte can steer it.
struct Tag {
  uint32_t client;  // the client process's logical client index
  uint32_t slot;    // window slot
  uint64_t seq;     // nonzero: the request has landed (a WRITE makes its last 8 bytes land last)
};
static_assert(sizeof(Tag) == 16);

struct EchoConfig {
  uint32_t max_clients = 64;    // logical clients the slot region is sized for
  uint32_t window = 4;          // outstanding requests per logical client
  uint32_t slot_bytes = 256;    // one request slot (herd's default), multiple of 8
  uint32_t request_bytes = 72;  // written at the slot's end
  uint32_t response_bytes = 72;
  uint32_t postlist = 16;     // most responses per post_send
  uint32_t unsig_batch = 32;  // one response in this many is signalled
  uint32_t sq_depth = 256;    // send queue depth
  uint32_t max_inline = 188;  // inline limit asked of each QP
  uint64_t SlotOffset(uint32_t client, uint32_t slot) const {
    return (uint64_t{client} * window + slot) * slot_bytes;
  }
  uint64_t region_bytes() const { return uint64_t{max_clients} * window * slot_bytes; }
};

// Checks the sizes against each other and the fabric's UD payload limit `mtu`.
absl::Status Validate(const EchoConfig& config, uint32_t mtu);

struct Hello {
  uint32_t clients = 1;
  transport::QpEndpoint ud;       // receives the responses
  transport::QpEndpoint request;  // the client's UC QP that WRITEs requests
};

struct Welcome {
  EchoConfig config;
  uint32_t first_client = 0;  // this connection's clients are first .. first + clients - 1
  uint64_t region_addr = 0;
  uint32_t region_rkey = 0;
  transport::QpEndpoint request;  // the server's UC QP, connected to Hello::request
};

std::vector<uint8_t> Encode(const Hello& hello);
std::vector<uint8_t> Encode(const Welcome& welcome);
absl::StatusOr<Hello> DecodeHello(const std::vector<uint8_t>& bytes);
absl::StatusOr<Welcome> DecodeWelcome(const std::vector<uint8_t>& bytes);

}  // namespace bench::echo

#endif  // HERD_BENCH_ECHO_ECHO_WIRE_H_
