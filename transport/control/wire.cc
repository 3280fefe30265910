#include "transport/control/wire.h"

#include "absl/strings/str_format.h"

namespace transport::control {

WireWriter& WireWriter::Raw(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  bytes_.insert(bytes_.end(), p, p + n);
  return *this;
}

WireWriter& WireWriter::Bytes(std::string_view s) {
  U32(static_cast<uint32_t>(s.size()));
  return Raw(s.data(), s.size());
}

WireWriter& WireWriter::Endpoint(const QpEndpoint& endpoint) {
  U32(endpoint.qp_num).U16(endpoint.lid).U32(endpoint.psn);
  return Raw(endpoint.gid.data(), endpoint.gid.size());
}

bool WireReader::Raw(void* out, size_t n, const char* field) {
  if (!status_.ok()) return false;
  if (size_ - offset_ < n) {
    status_ = absl::DataLossError(
        absl::StrFormat("truncated %s: a %s at byte %d needs %d bytes, the message has %d", what_,
                        field, offset_, n, size_));
    return false;
  }
  std::memcpy(out, data_ + offset_, n);
  offset_ += n;
  return true;
}

bool WireReader::Bytes(std::string* s, uint32_t max_bytes) {
  uint32_t length = 0;
  if (!U32(&length)) return false;
  if (length > max_bytes) {
    status_ = absl::DataLossError(
        absl::StrFormat("%s: a string of %d bytes at byte %d exceeds the limit of %d", what_,
                        length, offset_, max_bytes));
    return false;
  }
  s->resize(length);
  return Raw(s->data(), length, "string");
}

bool WireReader::Endpoint(QpEndpoint* endpoint) {
  return U32(&endpoint->qp_num) && U16(&endpoint->lid) && U32(&endpoint->psn) &&
         Raw(endpoint->gid.data(), endpoint->gid.size(), "gid");
}

absl::Status WireReader::Finish() const {
  if (!status_.ok()) return status_;
  if (offset_ != size_) {
    return absl::DataLossError(
        absl::StrFormat("%s: %d unexpected trailing bytes", what_, size_ - offset_));
  }
  return absl::OkStatus();
}

}  // namespace transport::control
