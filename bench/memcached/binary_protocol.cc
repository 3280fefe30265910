#include "bench/memcached/binary_protocol.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace bench::memcached {
namespace {

// SET's extras: flags (u32) and expiration time (u32), both zero here.
constexpr uint8_t kSetExtrasBytes = 8;

void PutBig(uint64_t value, int bytes, std::string* out) {
  for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<char>(value >> (8 * i)));
}

uint64_t GetBig(const char* p, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value = (value << 8) | static_cast<uint8_t>(p[i]);
  return value;
}

void AppendHeader(Opcode opcode, uint16_t key_bytes, uint8_t extras_bytes, uint32_t body_bytes,
                  uint32_t opaque, uint64_t cas, std::string* out) {
  out->push_back(static_cast<char>(kRequestMagic));
  out->push_back(static_cast<char>(opcode));
  PutBig(key_bytes, 2, out);
  out->push_back(static_cast<char>(extras_bytes));
  out->push_back(0);  // data type: raw bytes
  PutBig(0, 2, out);  // vbucket
  PutBig(body_bytes, 4, out);
  out->append(reinterpret_cast<const char*>(&opaque), 4);  // opaque is echoed, never interpreted
  PutBig(cas, 8, out);
}

}  // namespace

void AppendGet(std::string_view key, uint32_t opaque, std::string* out) {
  AppendHeader(Opcode::kGet, static_cast<uint16_t>(key.size()), 0,
               static_cast<uint32_t>(key.size()), opaque, 0, out);
  out->append(key);
}

void AppendSet(std::string_view key, std::string_view value, uint64_t cas, uint32_t opaque,
               std::string* out) {
  AppendHeader(Opcode::kSet, static_cast<uint16_t>(key.size()), kSetExtrasBytes,
               static_cast<uint32_t>(kSetExtrasBytes + key.size() + value.size()), opaque, cas,
               out);
  PutBig(0, 4, out);  // flags
  PutBig(0, 4, out);  // expiration: never
  out->append(key);
  out->append(value);
}

void AppendDelete(std::string_view key, uint32_t opaque, std::string* out) {
  AppendHeader(Opcode::kDelete, static_cast<uint16_t>(key.size()), 0,
               static_cast<uint32_t>(key.size()), opaque, 0, out);
  out->append(key);
}

absl::StatusOr<Response> ParseResponse(std::string_view stream) {
  Response r{};
  if (stream.size() < kHeaderBytes) return r;
  const char* h = stream.data();
  if (static_cast<uint8_t>(h[0]) != kResponseMagic) {
    return absl::DataLossError(absl::StrFormat("memcached response: magic 0x%02x, expected 0x%02x",
                                               static_cast<uint8_t>(h[0]), kResponseMagic));
  }
  const auto opcode = static_cast<uint8_t>(h[1]);
  if (opcode != static_cast<uint8_t>(Opcode::kGet) &&
      opcode != static_cast<uint8_t>(Opcode::kSet) &&
      opcode != static_cast<uint8_t>(Opcode::kDelete)) {
    return absl::DataLossError(
        absl::StrFormat("memcached response: opcode 0x%02x was never sent", opcode));
  }
  const auto key_bytes = static_cast<uint32_t>(GetBig(h + 2, 2));
  const auto extras_bytes = static_cast<uint8_t>(h[4]);
  const auto body_bytes = static_cast<uint32_t>(GetBig(h + 8, 4));
  if (body_bytes > kMaxBodyBytes || body_bytes < key_bytes + extras_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "memcached response: body of %d bytes with %d bytes of extras and %d of key", body_bytes,
        extras_bytes, key_bytes));
  }
  if (stream.size() < kHeaderBytes + body_bytes) return r;
  r.opcode = static_cast<Opcode>(opcode);
  r.status = static_cast<ResponseStatus>(GetBig(h + 6, 2));
  std::memcpy(&r.opaque, h + 12, 4);
  r.cas = GetBig(h + 16, 8);
  const size_t value_offset = kHeaderBytes + extras_bytes + key_bytes;
  r.value = stream.substr(value_offset, kHeaderBytes + body_bytes - value_offset);
  r.bytes = kHeaderBytes + body_bytes;
  return r;
}

}  // namespace bench::memcached
