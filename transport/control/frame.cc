#include "transport/control/frame.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "util/errno_status.h"

namespace transport::control::internal {

absl::Status Errno(std::string_view what) {
  return util::ErrnoStatus(absl::StatusCode::kUnavailable, what);
}

int MillisUntil(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

void EncodeFrameHeader(uint16_t type, uint32_t payload_bytes, uint8_t out[kFrameHeaderBytes]) {
  const uint32_t magic = kControlMagic;
  const uint16_t version = kControlVersion;
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, &version, 2);
  std::memcpy(out + 6, &type, 2);
  std::memcpy(out + 8, &payload_bytes, 4);
}

absl::Status DecodeFrameHeader(const uint8_t header[kFrameHeaderBytes], uint32_t max_payload,
                               uint16_t* type, uint32_t* payload_bytes) {
  uint32_t magic, length;
  uint16_t version;
  std::memcpy(&magic, header, 4);
  std::memcpy(&version, header + 4, 2);
  std::memcpy(type, header + 6, 2);
  std::memcpy(&length, header + 8, 4);
  if (magic != kControlMagic) {
    return absl::DataLossError(absl::StrFormat(
        "not a herd control frame (magic 0x%08x, expected 0x%08x)", magic, kControlMagic));
  }
  if (version != kControlVersion) {
    return absl::DataLossError(
        absl::StrFormat("control protocol version %d, this build speaks %d: run matching builds",
                        version, kControlVersion));
  }
  if (length > max_payload) {
    return absl::DataLossError(absl::StrFormat(
        "control frame claims %d payload bytes, the limit is %d", length, max_payload));
  }
  *payload_bytes = length;
  return absl::OkStatus();
}

absl::Status SendFrame(int fd, uint16_t type, const std::vector<uint8_t>& payload,
                       absl::Time deadline) {
  if (payload.size() > kMaxControlPayload) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "control message of %d bytes exceeds the limit of %d", payload.size(), kMaxControlPayload));
  }
  uint8_t header[kFrameHeaderBytes];
  EncodeFrameHeader(type, static_cast<uint32_t>(payload.size()), header);
  iovec parts[2] = {{header, sizeof(header)},
                    {const_cast<uint8_t*>(payload.data()), payload.size()}};
  const size_t total = sizeof(header) + payload.size();
  size_t done = 0;
  msghdr msg{};
  msg.msg_iov = parts;
  msg.msg_iovlen = 2;
  while (done < total) {
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = poll(&p, 1, MillisUntil(deadline));
      if (ready < 0 && errno != EINTR) return Errno("control send poll");
      if (ready == 0) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "control send: the peer is not reading (%d of %d bytes went out in time)", done,
            total));
      }
      continue;
    }
    if (n < 0) return Errno("control send");
    done += static_cast<size_t>(n);
    // Advance the iovecs past what was sent.
    size_t sent = static_cast<size_t>(n);
    while (sent > 0 && msg.msg_iovlen > 0) {
      const size_t step = std::min(sent, msg.msg_iov->iov_len);
      msg.msg_iov->iov_base = static_cast<uint8_t*>(msg.msg_iov->iov_base) + step;
      msg.msg_iov->iov_len -= step;
      sent -= step;
      if (msg.msg_iov->iov_len == 0) {
        ++msg.msg_iov;
        --msg.msg_iovlen;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace transport::control::internal
