// Connections a server accepted whose setup handshake is not finished yet, served together from
// one thread without ever blocking it, whatever carries them: TCP (PendingConnections) or RDMA-CM
// (transport/cm_channel.h). One implementation per transport; the server's handshake logic is
// written once against this interface.
#ifndef HERD_TRANSPORT_CONTROL_HANDSHAKE_SET_H_
#define HERD_TRANSPORT_CONTROL_HANDSHAKE_SET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/control/message_channel.h"

namespace transport::control {

struct HandshakeEvent {
  enum class Kind {
    kMessage,   // one whole message arrived; the connection stays pending
    kClosed,    // the peer closed or disconnected between messages (status kUnavailable)
    kError,     // a malformed message (kDataLoss naming the cause) or a link error (kUnavailable)
    kTimedOut,  // its deadline passed (kDeadlineExceeded)
    kEvicted,   // closed to make room for a newer connection (kResourceExhausted)
  };
  uint64_t id = 0;
  Kind kind = Kind::kMessage;
  Message message;      // kMessage only
  absl::Status status;  // OK for kMessage
  std::string peer;     // the peer's address, for logs
};

class HandshakeSet {
 public:
  virtual ~HandshakeSet() = default;
  // Replaces `*events` with what happened: new connections (each an id, never reused, and a
  // first deadline), at most one whole message per connection per call, closes, errors and
  // passed deadlines. Every event but kMessage means the set closed and forgot the connection.
  // Waits at most `timeout` while nothing is ready.
  virtual void Wait(absl::Duration timeout, std::vector<HandshakeEvent>* events) = 0;
  // Sends one small reply without blocking the caller for long; on failure the connection is
  // closed and forgotten. kNotFound for an unknown id.
  virtual absl::Status Send(uint64_t id, uint16_t type, const std::vector<uint8_t>& payload) = 0;
  // Moves a connection's deadline (after every answered message: a passed deadline times the
  // connection out at the next Wait).
  virtual absl::Status SetDeadline(uint64_t id, absl::Time deadline) = 0;
  // The connection becomes a long-lived session served from the set (its later messages keep
  // arriving as events, its close as kClosed): it no longer counts towards max_pending, is never
  // evicted to make room for a new connection, and has no deadline. kNotFound for an unknown id.
  virtual absl::Status Establish(uint64_t id) = 0;
  // The handshake finished: the connection leaves the set as a MessageChannel, losing nothing
  // the peer sent. kNotFound for an unknown id.
  virtual absl::StatusOr<std::unique_ptr<MessageChannel>> ReleaseChannel(uint64_t id) = 0;
  // Closes and forgets a connection; an unknown id is ignored. A reply sent just before is still
  // delivered (as far as the transport can: a dead peer gets nothing).
  virtual void Close(uint64_t id) = 0;
  // The port the set accepts connections on.
  virtual uint16_t port() const = 0;
};

}  // namespace transport::control

#endif  // HERD_TRANSPORT_CONTROL_HANDSHAKE_SET_H_
