#include "herd/protocol.h"

#include <cstring>

#include "mica/config.h"
#include "mica/keyhash.h"

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
    case Status::kBadRequest:
      return "BAD_REQUEST";
    case Status::kWrongWorker:
      return "WRONG_WORKER";
    case Status::kTimedOut:
      return "TIMED_OUT";
  }
  return "UNKNOWN_STATUS";
}

uint32_t EncodeRequest(const RequestHeader& header, std::string_view key, std::string_view value,
                       uint8_t* out) {
  const uint32_t key_space = Pad8(static_cast<uint32_t>(key.size()));
  const uint32_t value_space = Pad8(static_cast<uint32_t>(value.size()));
  std::memcpy(out, key.data(), key.size());
  std::memset(out + key.size(), 0, key_space - key.size());
  if (!value.empty())
    std::memcpy(out + key_space, value.data(), value.size());  // data() may be null
  std::memset(out + key_space + value.size(), 0, value_space - value.size());
  std::memcpy(out + key_space + value_space, &header, sizeof(header));
  return key_space + value_space + kRequestHeaderBytes;
}

Status ParseRequest(const uint8_t* message, uint32_t length, const RequestLimits& limits,
                    ParsedRequest* out) {
  if (length < kRequestHeaderBytes) return Status::kBadRequest;
  // One private copy: later checks cannot be fooled by bytes changing underneath.
  std::memcpy(&out->header, message + length - kRequestHeaderBytes, kRequestHeaderBytes);
  const RequestHeader& h = out->header;
  const ValueDescriptor& d = h.descriptor;
  if (h.flags != 0 || h.reserved != 0 || d.addr != 0 || d.rkey != 0 || d.length != 0) {
    return Status::kBadRequest;
  }
  if (h.op >= kOpCount) return Status::kInvalidOp;
  if (h.key_bytes == 0 || h.key_bytes > limits.max_key_bytes || h.key_bytes > mica::kMaxKeyBytes) {
    return Status::kKeyTooLong;
  }
  if (h.value_bytes > limits.max_value_bytes) return Status::kValueTooLong;
  const Op op = static_cast<Op>(h.op);
  const bool carries_value = op == Op::kPut || op == Op::kCas;
  if (!carries_value && h.value_bytes != 0) return Status::kBadRequest;
  if (op != Op::kCas && h.expected_version != 0) return Status::kBadRequest;
  // 64-bit arithmetic: value_bytes is up to 2^32 - 1 and must not wrap.
  const uint64_t need = uint64_t{Pad8(h.key_bytes)} + Pad8(h.value_bytes) + kRequestHeaderBytes;
  if (need > length) return Status::kBadRequest;
  const uint8_t* start = message + length - need;
  out->key = std::string_view(reinterpret_cast<const char*>(start), h.key_bytes);
  out->value =
      std::string_view(reinterpret_cast<const char*>(start + Pad8(h.key_bytes)), h.value_bytes);
  if (mica::KeyHash(out->key) != h.keyhash) return Status::kBadRequest;
  return Status::kOk;
}

void EncodeResponseHeader(const ResponseHeader& header, uint8_t* response_start) {
  const uint32_t value_space = Pad8(header.value_bytes);
  std::memset(response_start + header.value_bytes, 0, value_space - header.value_bytes);
  std::memcpy(response_start + value_space, &header, sizeof(header));
}

bool ParseResponse(const uint8_t* message, uint32_t length, ParsedResponse* out) {
  if (length < kResponseHeaderBytes) return false;
  std::memcpy(&out->header, message + length - kResponseHeaderBytes, kResponseHeaderBytes);
  const uint64_t need = uint64_t{Pad8(out->header.value_bytes)} + kResponseHeaderBytes;
  if (need > length) return false;
  out->value = message + length - need;
  return true;
}

}  // namespace herd
