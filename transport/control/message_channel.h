// A connected, message-oriented control link between two peers: the TCP Channel
// (transport/control/channel.h) or an RDMA-CM connection (transport/cm_channel.h). Setup
// messages travel over it, and its end is how a server learns that a client left or died.
#ifndef HERD_TRANSPORT_CONTROL_MESSAGE_CHANNEL_H_
#define HERD_TRANSPORT_CONTROL_MESSAGE_CHANNEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace transport::control {

struct Message {
  uint16_t type = 0;
  std::vector<uint8_t> payload;
};

class MessageChannel {
 public:
  virtual ~MessageChannel() = default;
  // Sends one whole message, or fails saying why (nothing partial is ever delivered).
  virtual absl::Status Send(uint16_t type, const std::vector<uint8_t>& payload) = 0;
  // Waits up to `timeout` for one whole message. kDeadlineExceeded when none came; kUnavailable
  // when the peer is gone; kDataLoss for a malformed message.
  virtual absl::StatusOr<Message> Receive(absl::Duration timeout) = 0;
  // The peer left (closed, reset, disconnected, died) or the link failed; never blocks.
  virtual bool PeerClosed() const = 0;
  virtual std::string peer_name() const = 0;
};

}  // namespace transport::control

#endif  // HERD_TRANSPORT_CONTROL_MESSAGE_CHANNEL_H_
