#include "herd/protocol.h"

#include <bit>
#include <cstddef>
#include <cstring>

#include "mica/keyhash.h"
#include "mica/limits.h"
#include "util/word_checksum.h"

namespace herd {

std::string_view StatusName(Status status) {
  switch (status) {
    case Status::kOk:
      return "OK";
    case Status::kNotFound:
      return "NOT_FOUND";
    case Status::kCasFailed:
      return "CAS_FAILED";
    case Status::kKeyTooLong:
      return "KEY_TOO_LONG";
    case Status::kValueTooLong:
      return "VALUE_TOO_LONG";
    case Status::kBufferTooSmall:
      return "BUFFER_TOO_SMALL";
    case Status::kInvalidOp:
      return "INVALID_OP";
    case Status::kExists:
      return "EXISTS";
    case Status::kNoMemory:
      return "NO_MEMORY";
    case Status::kBadRequest:
      return "BAD_REQUEST";
    case Status::kWrongWorker:
      return "WRONG_WORKER";
    case Status::kInternal:
      return "INTERNAL";
    case Status::kBackupBusy:
      return "BACKUP_BUSY";
    case Status::kNotPrimary:
      return "NOT_PRIMARY";
    case Status::kTimedOut:
      return "TIMED_OUT";
    case Status::kSendFailed:
      return "SEND_FAILED";
  }
  return "UNKNOWN_STATUS";
}

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kGet:
      return "GET";
    case Op::kPut:
      return "PUT";
    case Op::kDelete:
      return "DELETE";
    case Op::kCas:
      return "CAS";
    case Op::kInsert:
      return "INSERT";
  }
  return "UNKNOWN_OP";
}

namespace {

// Absorbs the last part of a message (whole words), in which the checksum word
// (kChecksumFromEnd from its end) counts as 0.
void AbsorbLastPart(util::WordChecksum& sum, const uint8_t* last, uint64_t last_bytes) {
  sum.AbsorbWords(last, (last_bytes - kChecksumFromEnd) / sizeof(uint64_t));
  sum.Absorb(0);
  sum.AbsorbWords(last + last_bytes - kChecksumFromEnd + sizeof(uint64_t),
                  (kChecksumFromEnd - sizeof(uint64_t)) / sizeof(uint64_t));
}

// The trailers are stored a whole word at a time, from registers. Copied whole, a trailer was
// assembled on the stack with narrow stores and read back 16 bytes at a time; stored field by
// field, it was read back a word at a time by the checksum. Either way the CPU cannot forward a
// load from several narrower stores: a stall of about 10 ns per message, most of the encoders'
// time (perf of bench/engine_bench and bench/herd_client). The packed words need little-endian
// hosts (x86-64, aarch64), as the rest of the wire.
static_assert(std::endian::native == std::endian::little);

void StoreWord(uint8_t* at, uint64_t word) { std::memcpy(at, &word, sizeof(word)); }

void StoreTrailer(const RequestTrailer& t, uint8_t* at) {
  static_assert(offsetof(RequestTrailer, value_bytes) == 0 &&
                offsetof(RequestTrailer, key_bytes) == 4 && offsetof(RequestTrailer, op) == 6 &&
                offsetof(RequestTrailer, flags) == 7);
  StoreWord(at, uint64_t{t.value_bytes} | uint64_t{t.key_bytes} << 32 | uint64_t{t.op} << 48 |
                    uint64_t{t.flags} << 56);
  StoreWord(at + offsetof(RequestTrailer, checksum), t.checksum);
  StoreWord(at + offsetof(RequestTrailer, marker), t.marker);
}

void StoreTrailer(const ResponseTrailer& t, uint8_t* at) {
  static_assert(offsetof(ResponseTrailer, value_bytes) == 8 &&
                offsetof(ResponseTrailer, status) == 12 && offsetof(ResponseTrailer, flags) == 13 &&
                offsetof(ResponseTrailer, worker) == 14);
  StoreWord(at + offsetof(ResponseTrailer, version), t.version);
  StoreWord(at + offsetof(ResponseTrailer, value_bytes),
            uint64_t{t.value_bytes} | uint64_t{t.status} << 32 | uint64_t{t.flags} << 40 |
                uint64_t{t.worker} << 48);
  StoreWord(at + offsetof(ResponseTrailer, checksum), t.checksum);
  StoreWord(at + offsetof(ResponseTrailer, marker), t.marker);
}

}  // namespace

uint64_t WireChecksum(uint64_t secret, const uint8_t* message, uint64_t length) {
  util::WordChecksum sum(secret, length);
  AbsorbLastPart(sum, message, length);
  return sum.Finish();
}

uint32_t EncodeRequest(const RequestHeader& header, std::string_view key, std::string_view value,
                       uint64_t secret, uint8_t* out) {
  const auto key_space = static_cast<uint32_t>(Pad8(key.size()));
  const auto value_space = static_cast<uint32_t>(Pad8(value.size()));
  std::memcpy(out, key.data(), key.size());
  std::memset(out + key.size(), 0, key_space - key.size());
  if (!value.empty())
    std::memcpy(out + key_space, value.data(), value.size());  // data() may be null
  std::memset(out + key_space + value.size(), 0, value_space - value.size());
  uint8_t* at = out + key_space + value_space;
  if (static_cast<Op>(header.op) == Op::kCas) {
    std::memcpy(at, &header.expected_version, kRequestExtensionBytes);
    at += kRequestExtensionBytes;
  }
  if ((header.flags & kRequestCopyToLanding) != 0) {
    const uint64_t word = header.landing_buffer;
    std::memcpy(at, &word, kRequestExtensionBytes);
    at += kRequestExtensionBytes;
  }
  const RequestTrailer trailer{header.value_bytes,
                               header.key_bytes,
                               header.op,
                               header.flags,
                               0,
                               PackMarker(header.seq, header.attempt)};
  StoreTrailer(trailer, at);
  const auto length = static_cast<uint32_t>(at + sizeof(trailer) - out);
  const uint64_t checksum = WireChecksum(secret, out, length);
  std::memcpy(out + length - kChecksumFromEnd, &checksum, sizeof(checksum));
  return length;
}

void SetRequestAttempt(uint32_t attempt, uint64_t secret, uint8_t* out, uint32_t length) {
  uint64_t marker;
  std::memcpy(&marker, out + length - sizeof(marker), sizeof(marker));
  marker = PackMarker(SeqOfMarker(marker), attempt);
  std::memcpy(out + length - sizeof(marker), &marker, sizeof(marker));
  const uint64_t checksum = WireChecksum(secret, out, length);
  std::memcpy(out + length - kChecksumFromEnd, &checksum, sizeof(checksum));
}

uint32_t SetRequestCopyToLanding(uint32_t landing_buffer, uint64_t secret, uint8_t* out,
                                 uint32_t length) {
  uint8_t* trailer_at = out + length - kRequestTrailerBytes;
  RequestTrailer trailer;
  std::memcpy(&trailer, trailer_at, sizeof(trailer));
  if ((trailer.flags & kRequestCopyToLanding) == 0) {
    // The landing word goes where the trailer was; the trailer moves up to the new end.
    trailer.flags |= kRequestCopyToLanding;
    std::memcpy(trailer_at + kRequestExtensionBytes, &trailer, sizeof(trailer));
    length += kRequestExtensionBytes;
  } else {
    trailer_at -= kRequestExtensionBytes;  // the landing word already there
  }
  const uint64_t word = landing_buffer;
  std::memcpy(trailer_at, &word, sizeof(word));
  const uint64_t checksum = WireChecksum(secret, out, length);
  std::memcpy(out + length - kChecksumFromEnd, &checksum, sizeof(checksum));
  return length;
}

// Not vectorized: GCC packs the checksum's four lanes into one AVX2 register here, where
// (without AVX-512) each 64-bit multiply is three 32-bit ones and shifts, and the check of a
// 512-byte request took twice the checksum alone (bench/protocol_bench).
[[gnu::optimize("no-tree-vectorize")]] Parse ParseRequest(const uint8_t* message, uint32_t length,
                                                          const RequestLimits& limits,
                                                          uint64_t secret, ParsedRequest* out,
                                                          Status* status) {
  if (length < kRequestTrailerBytes) return Parse::kIncomplete;
  // One private copy of the header: later checks cannot be fooled by bytes changing underneath.
  // The extension words are copied in front of the trailer, as they lie on the wire.
  constexpr uint32_t kMaxExtensions = 2;  // a hostile CAS may also set kRequestCopyToLanding
  alignas(kWireAlign) uint8_t copy[kMaxExtensions * kRequestExtensionBytes + kRequestTrailerBytes];
  uint8_t* trailer_copy = copy + kMaxExtensions * kRequestExtensionBytes;
  std::memcpy(trailer_copy, message + length - kRequestTrailerBytes, kRequestTrailerBytes);
  RequestTrailer t;
  std::memcpy(&t, trailer_copy, sizeof(t));
  // Decoded at once: an incomplete request's marker and checksum tell its caller whether the
  // same bytes are still there on a later look (a WRITE landing, or torn for good).
  RequestHeader& h = out->header;
  h = RequestHeader{};
  h.seq = SeqOfMarker(t.marker);
  h.attempt = AttemptOfMarker(t.marker);
  h.checksum = t.checksum;
  h.value_bytes = t.value_bytes;
  h.key_bytes = t.key_bytes;
  h.op = t.op;
  h.flags = t.flags;
  const Op op = static_cast<Op>(t.op);
  const uint32_t header_bytes = RequestHeaderBytes(op, t.flags);
  const uint32_t extension_bytes = header_bytes - kRequestTrailerBytes;
  // 64-bit arithmetic: value_bytes is up to 2^32 - 1 and must not wrap.
  const uint64_t key_space = Pad8(t.key_bytes);
  const uint64_t need = key_space + Pad8(t.value_bytes) + header_bytes;
  if (need > length) return Parse::kIncomplete;
  const uint8_t* start = message + length - need;
  uint8_t* header_copy = trailer_copy - extension_bytes;
  std::memcpy(header_copy, message + length - header_bytes, extension_bytes);
  // The header and the key are checked as copied: the copies are what the worker acts on, and
  // bytes landing after a copy must not change what passed. The slot can be rewritten under
  // the parse by its session's next request (ParsedRequest::key_copy says when). A key too long
  // to copy is refused below and never used: its bytes are checked in place.
  out->key_length = 0;
  util::WordChecksum sum(secret, need);
  if (t.key_bytes <= mica::kMaxKeyBytes) {
    sum.CopyAbsorbWords(start, out->key_copy, key_space / sizeof(uint64_t));
  } else {
    sum.AbsorbWords(start, key_space / sizeof(uint64_t));
  }
  sum.AbsorbWords(start + key_space, Pad8(t.value_bytes) / sizeof(uint64_t));
  AbsorbLastPart(sum, header_copy, header_bytes);
  if (sum.Finish() != t.checksum) return Parse::kIncomplete;

  const uint8_t* extension = header_copy;
  if (op == Op::kCas) {
    std::memcpy(&h.expected_version, extension, kRequestExtensionBytes);
    extension += kRequestExtensionBytes;
  }
  uint64_t landing_word = 0;
  if ((t.flags & kRequestCopyToLanding) != 0) {
    std::memcpy(&landing_word, extension, kRequestExtensionBytes);
    h.landing_buffer = static_cast<uint32_t>(landing_word);
  }
  if (t.key_bytes <= mica::kMaxKeyBytes) out->key_length = t.key_bytes;
  out->value = std::string_view(reinterpret_cast<const char*>(start + key_space), t.value_bytes);
  *status = Status::kOk;
  const bool copy_to_landing =
      h.flags == kRequestCopyToLanding && op == Op::kGet && landing_word < limits.landing_buffers;
  if (!copy_to_landing && h.flags != 0) {
    *status = Status::kBadRequest;
  } else if (h.op >= kOpCount) {
    *status = Status::kInvalidOp;
  } else if (h.key_bytes == 0 || h.key_bytes > limits.max_key_bytes ||
             h.key_bytes > mica::kMaxKeyBytes) {
    *status = Status::kKeyTooLong;
  } else if (h.value_bytes > limits.max_value_bytes) {
    *status = Status::kValueTooLong;
  } else if (!CarriesValue(op) && h.value_bytes != 0) {
    *status = Status::kBadRequest;
  } else {
    h.keyhash = mica::KeyHash(out->key());
  }
  return Parse::kRequest;
}

void EncodeResponseHeader(const ResponseHeader& header, uint64_t secret, uint8_t* response_start) {
  const auto value_space = static_cast<uint32_t>(Pad8(header.value_bytes));
  if (value_space != header.value_bytes) {  // most values are whole words: no call for nothing
    std::memset(response_start + header.value_bytes, 0, value_space - header.value_bytes);
  }
  const ResponseTrailer trailer{header.version,
                                header.value_bytes,
                                header.status,
                                header.flags,
                                header.worker,
                                0,
                                PackMarker(header.seq, header.attempt)};
  StoreTrailer(trailer, response_start + value_space);
  if (secret != 0) {
    const uint32_t length = value_space + kResponseHeaderBytes;
    const uint64_t checksum = WireChecksum(secret, response_start, length);
    std::memcpy(response_start + length - kChecksumFromEnd, &checksum, sizeof(checksum));
  }
}

bool ParseResponse(const uint8_t* message, uint32_t length, uint64_t secret, ParsedResponse* out) {
  if (length < kResponseHeaderBytes) return false;
  ResponseTrailer t;
  std::memcpy(&t, message + length - kResponseHeaderBytes, kResponseHeaderBytes);
  const uint64_t need = uint64_t{Pad8(t.value_bytes)} + kResponseHeaderBytes;
  if (need > length) return false;
  out->value = message + length - need;
  if (secret != 0 && WireChecksum(secret, out->value, need) != t.checksum) return false;
  ResponseHeader& h = out->header;
  h = ResponseHeader{};
  h.version = t.version;
  h.seq = SeqOfMarker(t.marker);
  h.attempt = AttemptOfMarker(t.marker);
  h.checksum = t.checksum;
  h.value_bytes = t.value_bytes;
  h.worker = t.worker;
  h.status = t.status;
  h.flags = t.flags;
  return true;
}

}  // namespace herd
