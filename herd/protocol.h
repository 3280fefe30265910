// herd's wire format: what a client writes into a request slot (or SENDs), and what a worker
// answers. Both messages END with their header, and a header ends with the 8-byte sequence
// number: a WRITE makes its last 8 bytes visible last, so a nonzero sequence word at the end of a
// slot means the whole request has landed. The receiver polls one word per slot.
//
//   request  = [key, padded to 8][value, padded to 8][RequestHeader]   written to end at slot end
//   response = [value, padded to 8][ResponseHeader]
//
// Everything in a request is written by a remote client and treated as hostile: ParseRequest
// checks every field against the slot before any byte past the header is touched.
#ifndef HERD_HERD_PROTOCOL_H_
#define HERD_HERD_PROTOCOL_H_

#include <cstdint>
#include <string_view>

#include "mica/partition.h"

namespace herd {

// Per-request outcome on the wire. 0..6 are the store's own results (mica::Result); the rest are
// the engine's.
enum class Status : uint8_t {
  kOk = 0,
  kNotFound = 1,
  kCasFailed = 2,
  kKeyTooLong = 3,
  kValueTooLong = 4,
  kBufferTooSmall = 5,
  kInvalidOp = 6,
  kBadRequest = 16,   // malformed slot: lengths, flags, reserved bytes, sequence, key hash
  kWrongWorker = 17,  // the key belongs to another worker's partition
  kTimedOut = 32,     // client-side: no valid response through every retransmission
};
std::string_view StatusName(Status status);

enum class Op : uint8_t { kGet = 0, kPut = 1, kDelete = 2, kCas = 3 };
inline constexpr uint8_t kOpCount = 4;
inline bool IsMutation(Op op) { return op != Op::kGet; }

inline constexpr uint32_t kWireAlign = 8;
inline constexpr uint32_t Pad8(uint32_t n) { return (n + kWireAlign - 1) & ~(kWireAlign - 1); }

// Room for a later issue's out-of-line value (remote address, rkey, length); must be zero today.
struct ValueDescriptor {
  uint64_t addr;
  uint32_t rkey;
  uint32_t length;
};

struct RequestHeader {
  uint64_t keyhash;           // mica::KeyHash(key); routes the key and is re-checked by the worker
  uint64_t expected_version;  // CAS only, else 0
  ValueDescriptor descriptor;
  uint32_t value_bytes;
  uint16_t key_bytes;
  uint8_t op;
  uint8_t flags;       // none defined yet: must be 0
  uint32_t client_id;  // who to answer (for slots, must match the slot's owner)
  uint32_t reserved;   // must be 0
  uint64_t seq;        // per (client, worker) stream, starting at 1; LAST: the valid marker
};
static_assert(sizeof(RequestHeader) == 56);
inline constexpr uint32_t kRequestHeaderBytes = sizeof(RequestHeader);

struct ResponseHeader {
  uint64_t keyhash;  // the request's, echoed: the client checks it
  uint64_t version;
  uint32_t value_bytes;
  uint32_t client_id;
  uint8_t status;
  uint8_t reserved0;
  uint16_t worker;
  uint32_t reserved1;
  uint64_t seq;  // LAST: for WRITE responses, the valid marker the client polls
};
static_assert(sizeof(ResponseHeader) == 40);
inline constexpr uint32_t kResponseHeaderBytes = sizeof(ResponseHeader);

inline constexpr uint32_t RequestBytes(uint32_t key_bytes, uint32_t value_bytes) {
  return Pad8(key_bytes) + Pad8(value_bytes) + kRequestHeaderBytes;
}
inline constexpr uint32_t ResponseBytes(uint32_t value_bytes) {
  return Pad8(value_bytes) + kResponseHeaderBytes;
}

// Lays a request out in `out` (which must hold RequestBytes(key, value)); returns its length.
uint32_t EncodeRequest(const RequestHeader& header, std::string_view key, std::string_view value,
                       uint8_t* out);

// Limits a worker checks requests against.
struct RequestLimits {
  uint32_t max_key_bytes;
  uint32_t max_value_bytes;
};

// A request that passed every check; key and value point into the message.
struct ParsedRequest {
  RequestHeader header;
  std::string_view key;
  std::string_view value;
};

// Parses the request that ENDS at message + length (a slot: length = slot size; a UD receive:
// the payload length). Reads the header once into a private copy, then validates it; only then
// forms key/value views, which lie inside [message, message + length). Returns kOk or the
// reason to reject (kBadRequest, kKeyTooLong, kValueTooLong, kInvalidOp); on rejection
// out->header still holds what was read, for an error response.
Status ParseRequest(const uint8_t* message, uint32_t length, const RequestLimits& limits,
                    ParsedRequest* out);

// Lays a response out so it ends at out + ResponseBytes(header.value_bytes); the value may
// already be in place (pass value = nullptr to skip the copy).
void EncodeResponseHeader(const ResponseHeader& header, uint8_t* response_start);

// A response that ENDS at message + length: the header, and the value before it.
struct ParsedResponse {
  ResponseHeader header;
  const uint8_t* value;
};
// False when the lengths do not add up (the caller counts and drops it).
bool ParseResponse(const uint8_t* message, uint32_t length, ParsedResponse* out);

}  // namespace herd

#endif  // HERD_HERD_PROTOCOL_H_
