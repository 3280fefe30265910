#include "herd/protocol.h"

#include <cstring>

#include "mica/config.h"
#include "mica/keyhash.h"
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
  std::memcpy(out + key_space + value_space, &header, sizeof(header));
  const uint32_t length = key_space + value_space + kRequestHeaderBytes;
  const uint64_t checksum = WireChecksum(secret, out, length);
  std::memcpy(out + length - kChecksumFromEnd, &checksum, sizeof(checksum));
  return length;
}

void SetRequestAttempt(uint32_t attempt, uint64_t secret, uint8_t* out, uint32_t length) {
  uint8_t* header = out + length - kRequestHeaderBytes;
  std::memcpy(header + offsetof(RequestHeader, attempt), &attempt, sizeof(attempt));
  const uint64_t checksum = WireChecksum(secret, out, length);
  std::memcpy(out + length - kChecksumFromEnd, &checksum, sizeof(checksum));
}

void SetRequestCopyToLanding(uint32_t landing_buffer, uint64_t secret, uint8_t* out,
                             uint32_t length) {
  uint8_t* header = out + length - kRequestHeaderBytes;
  const uint8_t flags = kRequestCopyToLanding;
  std::memcpy(header + offsetof(RequestHeader, flags), &flags, sizeof(flags));
  std::memcpy(header + offsetof(RequestHeader, descriptor) + offsetof(ValueDescriptor, length),
              &landing_buffer, sizeof(landing_buffer));
  const uint64_t checksum = WireChecksum(secret, out, length);
  std::memcpy(out + length - kChecksumFromEnd, &checksum, sizeof(checksum));
}

Parse ParseRequest(const uint8_t* message, uint32_t length, const RequestLimits& limits,
                   uint64_t secret, ParsedRequest* out, Status* status) {
  if (length < kRequestHeaderBytes) return Parse::kIncomplete;
  // One private copy: later checks cannot be fooled by bytes changing underneath.
  std::memcpy(&out->header, message + length - kRequestHeaderBytes, kRequestHeaderBytes);
  const RequestHeader& h = out->header;
  // 64-bit arithmetic: value_bytes is up to 2^32 - 1 and must not wrap.
  const uint64_t key_space = Pad8(h.key_bytes);
  const uint64_t need = key_space + Pad8(h.value_bytes) + kRequestHeaderBytes;
  if (need > length) return Parse::kIncomplete;
  const uint8_t* start = message + length - need;
  // The header and the key are checked as copied: the copies are what the worker acts on, and
  // bytes landing after a copy must not change what passed. The slot can be rewritten under
  // the parse by its session's next request (ParsedRequest::key_copy says when). A key too long
  // to copy is refused below and never used: its bytes are checked in place.
  const uint8_t* key_source = start;
  out->key_length = 0;
  if (h.key_bytes <= mica::kMaxKeyBytes) {
    std::memcpy(out->key_copy, start, key_space);
    key_source = reinterpret_cast<const uint8_t*>(out->key_copy);
  }
  util::WordChecksum sum(secret, need);
  sum.AbsorbWords(key_source, key_space / sizeof(uint64_t));
  sum.AbsorbWords(start + key_space, Pad8(h.value_bytes) / sizeof(uint64_t));
  AbsorbLastPart(sum, reinterpret_cast<const uint8_t*>(&out->header), kRequestHeaderBytes);
  if (sum.Finish() != h.checksum) return Parse::kIncomplete;
  if (h.key_bytes <= mica::kMaxKeyBytes) out->key_length = h.key_bytes;
  out->value = std::string_view(reinterpret_cast<const char*>(start + key_space), h.value_bytes);
  *status = Status::kOk;
  const ValueDescriptor& d = h.descriptor;
  const Op op = static_cast<Op>(h.op);
  const bool carries_value = CarriesValue(op);
  const bool copy_to_landing = h.flags == kRequestCopyToLanding && op == Op::kGet && d.addr == 0 &&
                               d.rkey == 0 && d.length < limits.landing_buffers;
  if (!copy_to_landing && (h.flags != 0 || d.addr != 0 || d.rkey != 0 || d.length != 0)) {
    *status = Status::kBadRequest;
  } else if (h.op >= kOpCount) {
    *status = Status::kInvalidOp;
  } else if (h.key_bytes == 0 || h.key_bytes > limits.max_key_bytes ||
             h.key_bytes > mica::kMaxKeyBytes) {
    *status = Status::kKeyTooLong;
  } else if (h.value_bytes > limits.max_value_bytes) {
    *status = Status::kValueTooLong;
  } else if ((!carries_value && h.value_bytes != 0) ||
             (op != Op::kCas && h.expected_version != 0)) {
    *status = Status::kBadRequest;
  } else if (mica::KeyHash(out->key()) != h.keyhash) {
    *status = Status::kBadRequest;
  }
  return Parse::kRequest;
}

void EncodeResponseHeader(const ResponseHeader& header, uint64_t secret, uint8_t* response_start) {
  const auto value_space = static_cast<uint32_t>(Pad8(header.value_bytes));
  std::memset(response_start + header.value_bytes, 0, value_space - header.value_bytes);
  std::memcpy(response_start + value_space, &header, sizeof(header));
  if (secret != 0) {
    const uint32_t length = value_space + kResponseHeaderBytes;
    const uint64_t checksum = WireChecksum(secret, response_start, length);
    std::memcpy(response_start + length - kChecksumFromEnd, &checksum, sizeof(checksum));
  }
}

bool ParseResponse(const uint8_t* message, uint32_t length, uint64_t secret, ParsedResponse* out) {
  if (length < kResponseHeaderBytes) return false;
  std::memcpy(&out->header, message + length - kResponseHeaderBytes, kResponseHeaderBytes);
  const uint64_t need = uint64_t{Pad8(out->header.value_bytes)} + kResponseHeaderBytes;
  if (need > length) return false;
  out->value = message + length - need;
  if (secret != 0 && WireChecksum(secret, out->value, need) != out->header.checksum) return false;
  return true;
}

}  // namespace herd
