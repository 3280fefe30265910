// Encoding of control-plane payloads: fixed-width little-endian integers and length-prefixed
// byte strings. The reader checks every length against what is left, so a truncated or lying
// message yields a clear error instead of reading past its end.
#ifndef HERD_TRANSPORT_CONTROL_WIRE_H_
#define HERD_TRANSPORT_CONTROL_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "transport/types.h"

namespace transport::control {

class WireWriter {
 public:
  WireWriter& U8(uint8_t v) { return Raw(&v, 1); }
  WireWriter& U16(uint16_t v) { return Raw(&v, 2); }
  WireWriter& U32(uint32_t v) { return Raw(&v, 4); }
  WireWriter& U64(uint64_t v) { return Raw(&v, 8); }
  WireWriter& Bytes(std::string_view s);  // u32 length, then the bytes
  WireWriter& Endpoint(const QpEndpoint& endpoint);
  std::vector<uint8_t> Take() { return std::move(bytes_); }

 private:
  WireWriter& Raw(const void* data, size_t n);  // hosts are little-endian (x86-64, aarch64)
  std::vector<uint8_t> bytes_;
};

// Reads fields in order; after the first failure every read fails and status() names it.
class WireReader {
 public:
  WireReader(const std::vector<uint8_t>& bytes, std::string_view what)
      : data_(bytes.data()), size_(bytes.size()), what_(what) {}
  // The reader points into `bytes`: a temporary would dangle.
  WireReader(std::vector<uint8_t>&& bytes, std::string_view what) = delete;
  bool U8(uint8_t* v) { return Raw(v, 1, "u8"); }
  bool U16(uint16_t* v) { return Raw(v, 2, "u16"); }
  bool U32(uint32_t* v) { return Raw(v, 4, "u32"); }
  bool U64(uint64_t* v) { return Raw(v, 8, "u64"); }
  bool Bytes(std::string* s, uint32_t max_bytes);
  bool Endpoint(QpEndpoint* endpoint);
  // OK when every read succeeded and nothing is left over.
  absl::Status Finish() const;
  absl::Status status() const { return status_; }

 private:
  bool Raw(void* out, size_t n, const char* field);
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
  std::string what_;
  absl::Status status_;
};

}  // namespace transport::control

#endif  // HERD_TRANSPORT_CONTROL_WIRE_H_
