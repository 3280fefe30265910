// memcached's binary protocol, the part the memcached baseline client speaks: GET, SET (with an
// optional CAS value) and DELETE requests, and parsing of responses from a byte stream. Binary,
// not ASCII, because benchmark keys are arbitrary bytes (ASCII keys may not hold spaces or
// control characters) and to give memcached its cheapest parser.
//
// Header (24 bytes, big-endian fields): magic, opcode, key length, extras length, data type,
// vbucket (request) / status (response), total body length, opaque, CAS. The body is extras,
// then key, then value.
#ifndef HERD_BENCH_MEMCACHED_BINARY_PROTOCOL_H_
#define HERD_BENCH_MEMCACHED_BINARY_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace bench::memcached {

inline constexpr size_t kHeaderBytes = 24;
inline constexpr uint8_t kRequestMagic = 0x80;
inline constexpr uint8_t kResponseMagic = 0x81;
// A response body larger than this is a corrupt stream, not a value (memcached's default item
// limit is 1 MiB; the slack covers extras and key).
inline constexpr uint32_t kMaxBodyBytes = (1u << 20) + 4096;

enum class Opcode : uint8_t { kGet = 0x00, kSet = 0x01, kDelete = 0x04 };

enum class ResponseStatus : uint16_t {
  kOk = 0x0000,
  kKeyNotFound = 0x0001,
  kKeyExists = 0x0002,  // a SET with a CAS value that does not match
  kValueTooLarge = 0x0003,
  kInvalidArguments = 0x0004,
  kNotStored = 0x0005,
  kUnknownCommand = 0x0081,
  kOutOfMemory = 0x0082,
};

// Appends a request to `out` (which the caller reuses: no allocation once it has grown).
void AppendGet(std::string_view key, uint32_t opaque, std::string* out);
// cas = 0: store unconditionally; otherwise only if the item's CAS value equals it.
void AppendSet(std::string_view key, std::string_view value, uint64_t cas, uint32_t opaque,
               std::string* out);
void AppendDelete(std::string_view key, uint32_t opaque, std::string* out);

struct Response {
  Opcode opcode;
  ResponseStatus status;
  uint32_t opaque;
  uint64_t cas;
  std::string_view value;  // GET hits: points into the parsed bytes
  size_t bytes = 0;        // header + body: how much of the stream this response took
};

// Parses the response at the start of `stream`; a Response with bytes == 0 means `stream` does
// not yet hold a whole one (read more). A bad magic, an unknown opcode or a body
// longer than kMaxBodyBytes or shorter than its extras and key is kDataLoss (the stream cannot
// be resynchronised).
absl::StatusOr<Response> ParseResponse(std::string_view stream);

}  // namespace bench::memcached

#endif  // HERD_BENCH_MEMCACHED_BINARY_PROTOCOL_H_
