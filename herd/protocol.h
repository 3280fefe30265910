// herd's wire format: what a client writes into a request slot (or SENDs), and what a worker
// answers. Both messages END with a fixed trailer, and a trailer ends with its checksum and then
// the 8-byte marker (sequence and attempt numbers), the word a receiver polls (nonzero:
// something landed). The layouts, and what does not travel, are at RequestHeader and
// ResponseHeader below.
//
// A WRITE's bytes may land in any order and more than once (Soft-RoCE places a WRITE with
// memcpy; the spec promises nothing about placement order), so the marker says only "look":
// - a checksum over the whole message, keyed by the session's secret, says the message is
//   complete (not torn) and was written by the session that owns the slot;
// - the attempt number (0, then +1 per retransmission) makes each send of a request distinct, so
//   a marker that reappears after the worker consumed it (the same seq AND attempt) is recognised
//   as a duplicate landing and never executed twice.
//
// Everything in a request is written by a remote client and treated as hostile: ParseRequest
// checks every field against the slot before any byte past the header is touched.
#ifndef HERD_HERD_PROTOCOL_H_
#define HERD_HERD_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mica/limits.h"

namespace herd {

// Per-request outcome on the wire. 0..8 are the store's own results (mica::Result, passed
// through); the rest are the engine's.
enum class Status : uint8_t {
  kOk = 0,
  kNotFound = 1,
  kCasFailed = 2,
  kKeyTooLong = 3,
  kValueTooLong = 4,
  kBufferTooSmall = 5,
  kInvalidOp = 6,
  kExists = 7,        // INSERT: the key is present (the response's version is its current one)
  kNoMemory = 8,      // PUT/CAS/INSERT: the item is longer than the worker's whole log; GET of a
                      // copy: the value is longer than a landing buffer; client-side: a request
                      // longer than the server's landing buffers (nothing was sent)
  kBadRequest = 16,   // malformed slot: lengths, flags, reserved bytes, sequence
  kWrongWorker = 17,  // the key belongs to another worker's partition
  kInternal = 18,     // the server's own inconsistency (an item in its log that fails its
                      // checksum, a store result it does not know): not the request's fault
  kBackupBusy = 19,   // GET at a backup: no whole copy could be read while its primary's writes
                      // landed (or the primary died mid-batch): ask again, or the primary
  kNotPrimary = 20,   // a mutation sent to a backup: only the primary takes writes
  kTimedOut = 32,     // client-side: no valid response through every retransmission
  kSendFailed = 33,   // client-side: the request could not be sent (its QP is in error)
};
std::string_view StatusName(Status status);

// The same values as mica::OpCode (the worker passes them through; static_asserts in worker.cc).
enum class Op : uint8_t { kGet = 0, kPut = 1, kDelete = 2, kCas = 3, kInsert = 4 };
inline constexpr uint8_t kOpCount = 5;
inline bool IsMutation(Op op) { return op != Op::kGet; }
// Whether a request of `op` carries a value.
inline bool CarriesValue(Op op) { return op == Op::kPut || op == Op::kCas || op == Op::kInsert; }
std::string_view OpName(Op op);

// The request and response layouts below, as a number a client states in its Hello (join.h): a
// server refuses a client built for other layouts at the join, instead of every request failing
// its checksum. 1: 64-byte request and 48-byte response headers; 2: session 17's trailers.
inline constexpr uint32_t kWireVersion = 2;

inline constexpr uint32_t kWireAlign = 8;
// 64-bit: a peer-written 32-bit length near 2^32 must not wrap to a small padded size.
inline constexpr uint64_t Pad8(uint64_t n) {
  return (n + kWireAlign - 1) & ~uint64_t{kWireAlign - 1};
}

// Where an out-of-line value lies: remote memory a client READs (docs/architecture.md, "Large
// values"). In an out-of-line GET's response, in place of the value.
struct ValueDescriptor {
  uint64_t addr;
  uint32_t rkey;
  uint32_t length;
};
static_assert(sizeof(ValueDescriptor) == 16);

// RequestHeader::flags.
// GET: copy the value into this session's landing buffer `landing_buffer` at the worker and
// answer with a descriptor of it (the fallback when READs of the item keep failing their check).
inline constexpr uint8_t kRequestCopyToLanding = 1;
// ResponseHeader::flags.
// The value area holds a ValueDescriptor of the value (header.value_bytes == 16): of its item in
// the worker's log (check it with mica::VerifyItem), or with kResponseCopied of the bare value
// in the session's landing buffer.
inline constexpr uint8_t kResponseOutOfLine = 1;
inline constexpr uint8_t kResponseCopied = 2;

// A large PUT's WRITE_WITH_IMM immediate: [client id : 16][landing buffer : kLandingBufferBits].
// A SEND (request or response) carries the bare client id as its immediate.
inline constexpr int kLandingBufferBits = 16;
inline constexpr uint32_t LandingImmediate(uint32_t client_id, uint32_t buffer) {
  return (client_id << kLandingBufferBits) | buffer;
}

// The marker word packs the sequence number and the attempt number: one word that changes with
// every send, and that a poller reads first.
inline constexpr int kSeqBits = 48;
inline constexpr uint64_t kMaxSeq = (uint64_t{1} << kSeqBits) - 1;  // ~2.8e14 per stream
inline constexpr uint32_t kMaxAttempt = (1u << (64 - kSeqBits)) - 1;
inline constexpr uint64_t PackMarker(uint64_t seq, uint32_t attempt) {
  return seq | (uint64_t{attempt} << kSeqBits);
}
inline constexpr uint64_t SeqOfMarker(uint64_t marker) { return marker & kMaxSeq; }
inline constexpr uint32_t AttemptOfMarker(uint64_t marker) {
  return static_cast<uint32_t>(marker >> kSeqBits);
}

// A request's fields as a client fills them and ParseRequest returns them: NOT the wire layout.
// Only what a request's op and flags need travels:
//
//   request = [key, pad 8][value, pad 8][expected_version : 8, CAS only]
//             [landing_buffer : 4, zero : 4, kRequestCopyToLanding only][RequestTrailer : 24]
//
// A GET of a 16-byte key is 40 bytes. The key hash does not travel: the worker must hash the key
// anyway to check it, so it computes it. The client id does not travel either: a request slot
// belongs to one client, and a SEND names it in its immediate. The checksum under the session's
// secret says the request is that session's (a session may name any of its own clients; a UD
// SEND must also come from the session's QP).
struct RequestHeader {
  uint64_t keyhash = 0;           // mica::KeyHash(key): computed by ParseRequest, never sent
  uint64_t expected_version = 0;  // CAS only, else 0
  uint64_t seq = 0;               // per (client, worker) stream, 1..kMaxSeq
  uint64_t checksum = 0;          // as received (ParseRequest); EncodeRequest computes it
  uint32_t value_bytes = 0;
  uint32_t landing_buffer = 0;  // kRequestCopyToLanding only, else 0
  uint32_t attempt = 0;         // 0 for the first send of a request, +1 per retransmission
  uint16_t key_bytes = 0;
  uint8_t op = 0;
  uint8_t flags = 0;  // kRequestCopyToLanding, else 0
};

// The fixed end of every request on the wire.
struct RequestTrailer {
  uint32_t value_bytes;
  uint16_t key_bytes;
  uint8_t op;
  uint8_t flags;
  uint64_t checksum;  // WireChecksum(session secret, the whole request)
  uint64_t marker;    // PackMarker(seq, attempt); LAST: nonzero means something landed
};
static_assert(sizeof(RequestTrailer) == 24);
inline constexpr uint32_t kRequestTrailerBytes = sizeof(RequestTrailer);
// The optional words before the trailer: a CAS's expected version, a copy-to-landing GET's
// buffer. No request carries both (only a GET asks for a copy).
inline constexpr uint32_t kRequestExtensionBytes = sizeof(uint64_t);
// The most header a request of any op carries: what a slot must hold beyond key and value.
inline constexpr uint32_t kRequestHeaderMaxBytes = kRequestTrailerBytes + kRequestExtensionBytes;

// A response's fields as the worker fills them and ParseResponse returns them: NOT the wire
// layout.
//
//   response = [value, pad 8][ResponseTrailer : 32]
//
// The client id does not travel: a response slot belongs to one client, and a UD SEND names it
// in its immediate. The key hash does not either: the client matches an answer by client,
// worker, sequence and attempt, and the response is authenticated by its checksum (WRITE) or
// by the worker QP that sent it (UD).
struct ResponseHeader {
  uint64_t version = 0;
  uint64_t seq = 0;
  uint64_t checksum = 0;  // as received
  uint32_t value_bytes = 0;
  uint32_t attempt = 0;    // the request's, echoed: tells the client which send was answered
  uint32_t client_id = 0;  // never sent: set from the slot or the SEND's immediate
  uint16_t worker = 0;
  uint8_t status = 0;
  uint8_t flags = 0;  // kResponseOutOfLine, kResponseCopied
};

struct ResponseTrailer {
  uint64_t version;
  uint32_t value_bytes;
  uint8_t status;
  uint8_t flags;
  uint16_t worker;
  uint64_t checksum;  // WRITE responses: WireChecksum(session secret, the whole response); UD: 0
  uint64_t marker;    // PackMarker(seq, attempt); LAST: for WRITE responses, what a client polls
};
static_assert(sizeof(ResponseTrailer) == 32);
// Both trailers keep the checksum in the word before the marker, so one function covers both.
static_assert(offsetof(RequestTrailer, checksum) + 16 == sizeof(RequestTrailer));
static_assert(offsetof(ResponseTrailer, checksum) + 16 == sizeof(ResponseTrailer));
inline constexpr uint32_t kChecksumFromEnd = 16;  // bytes from a message's end to its checksum
inline constexpr uint32_t kResponseHeaderBytes = sizeof(ResponseTrailer);

// The header bytes a request of `op` with `flags` carries.
inline constexpr uint32_t RequestHeaderBytes(Op op, uint8_t flags) {
  return kRequestTrailerBytes + (op == Op::kCas ? kRequestExtensionBytes : 0) +
         ((flags & kRequestCopyToLanding) != 0 ? kRequestExtensionBytes : 0);
}
inline constexpr uint32_t RequestBytes(Op op, uint32_t key_bytes, uint32_t value_bytes,
                                       uint8_t flags = 0) {
  return static_cast<uint32_t>(Pad8(key_bytes) + Pad8(value_bytes) + RequestHeaderBytes(op, flags));
}
inline constexpr uint32_t ResponseBytes(uint32_t value_bytes) {
  return static_cast<uint32_t>(Pad8(value_bytes) + kResponseHeaderBytes);
}

// A 64-bit keyed hash of a message (length a multiple of 8) that skips the checksum word itself
// (kChecksumFromEnd bytes before the end). Not cryptographic: it detects torn and mixed bytes
// with probability 1 - 2^-64 and makes a forger who does not know `secret` guess.
uint64_t WireChecksum(uint64_t secret, const uint8_t* message, uint64_t length);

// Lays a request out in `out` (which must hold RequestBytes(op, key, value, flags)) with its
// checksum; returns its length. header.keyhash and header.checksum are not read.
uint32_t EncodeRequest(const RequestHeader& header, std::string_view key, std::string_view value,
                       uint64_t secret, uint8_t* out);
// A request already laid out at out[0, length): sets its attempt and recomputes its checksum
// (a retransmission).
void SetRequestAttempt(uint32_t attempt, uint64_t secret, uint8_t* out, uint32_t length);
// A GET already laid out at out[0, length): asks for its value to be copied into landing buffer
// `landing_buffer` (kRequestCopyToLanding) and recomputes its checksum. Returns its new length:
// the first time, the request grows by kRequestExtensionBytes (out must have room for them).
uint32_t SetRequestCopyToLanding(uint32_t landing_buffer, uint64_t secret, uint8_t* out,
                                 uint32_t length);

// Limits a worker checks requests against.
struct RequestLimits {
  uint32_t max_key_bytes;
  uint32_t max_value_bytes;
  uint32_t landing_buffers = 0;  // kRequestCopyToLanding may name buffers 0..landing_buffers-1
};

// A request that passed every check. The key is a private copy, the value a view of the message.
struct ParsedRequest {
  RequestHeader header;
  std::string_view value;
  // The key bytes the checksum was computed over, copied out of the message first: the key the
  // worker hashes and executes is the one that checked out, whatever lands in the slot later. A
  // late retransmission of an answered request can be parsed while the slot's NEXT request (the
  // client reused the slot after the answer) lands over it; the key used to be hashed in place
  // after the checksum, and read as the next request's key (BAD_REQUEST). The value stays in
  // place: only a request's first execution reads it, and its slot is not reused before that
  // execution's answer (a late retransmission of a mutation is replayed, its value unread).
  alignas(kWireAlign) char key_copy[Pad8(mica::kMaxKeyBytes)];
  uint16_t key_length = 0;  // 0 when header.key_bytes is over mica::kMaxKeyBytes (not copied)
  std::string_view key() const { return std::string_view(key_copy, key_length); }
};

// What ParseRequest made of a message.
enum class Parse : uint8_t {
  kRequest,     // complete and authentic: `status` says whether it may execute
  kIncomplete,  // lengths that do not fit, or a checksum that does not match: a WRITE still
                // landing, a torn one, or bytes not written by the session; never answered
};

// Parses the request that ENDS at message + length (a slot: length = slot size; a UD receive:
// the payload length). Reads the trailer and the extension words it names once into a private
// copy; checks that the lengths fit, then the checksum under `secret`, and only then the fields
// (kBadRequest, kKeyTooLong, kValueTooLong, kInvalidOp into *status, kOk if it may execute).
// The key is copied into *out before the checksum is computed over it; the value view lies
// inside [message, message + length). header.keyhash is the key's hash when *status is kOk,
// else 0.
Parse ParseRequest(const uint8_t* message, uint32_t length, const RequestLimits& limits,
                   uint64_t secret, ParsedRequest* out, Status* status);

// Lays a response's header (and value padding) out so the response ends at
// response_start + ResponseBytes(header.value_bytes); the value must already be in place.
// `secret` != 0 also computes the checksum (WRITE responses); 0 leaves it 0 (UD responses).
void EncodeResponseHeader(const ResponseHeader& header, uint64_t secret, uint8_t* response_start);

// A response that ENDS at message + length: the header, and the value before it.
struct ParsedResponse {
  ResponseHeader header;
  const uint8_t* value;
};
// False when the lengths do not add up, or (secret != 0) the checksum does not match; the caller
// counts and drops it.
bool ParseResponse(const uint8_t* message, uint32_t length, uint64_t secret, ParsedResponse* out);

}  // namespace herd

#endif  // HERD_HERD_PROTOCOL_H_
