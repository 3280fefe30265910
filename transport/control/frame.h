// Internals of the control plane shared by Channel (one blocking connection) and
// PendingConnections (many non-blocking ones): the frame header's encoding and checks, the
// frame send loop, and errno statuses. Not for use outside transport/control.
#ifndef HERD_TRANSPORT_CONTROL_FRAME_H_
#define HERD_TRANSPORT_CONTROL_FRAME_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "transport/control/channel.h"

namespace transport::control::internal {

// kUnavailable naming `what` and errno's text.
absl::Status Errno(std::string_view what);

// Milliseconds from now until `deadline` for poll/epoll_wait: rounded up, so a wait never ends
// just before its deadline and spins; 0 once it passed.
int MillisUntil(absl::Time deadline);

void EncodeFrameHeader(uint16_t type, uint32_t payload_bytes, uint8_t out[kFrameHeaderBytes]);

// Checks a received header (magic, version, payload length against `max_payload`) and returns its
// type and payload length; kDataLoss naming what is wrong otherwise.
absl::Status DecodeFrameHeader(const uint8_t header[kFrameHeaderBytes], uint32_t max_payload,
                               uint16_t* type, uint32_t* payload_bytes);

// Sends one whole frame on `fd`, blocking or not: where the socket cannot take more (EAGAIN) it
// waits for room until `deadline`. kDeadlineExceeded says how much went out (the stream is then
// mid-frame and unusable); kInvalidArgument for a payload past kMaxControlPayload.
absl::Status SendFrame(int fd, uint16_t type, const std::vector<uint8_t>& payload,
                       absl::Time deadline);

}  // namespace transport::control::internal

#endif  // HERD_TRANSPORT_CONTROL_FRAME_H_
