// The control plane's transport: a persistent TCP connection carrying framed, versioned,
// length-checked messages. Peers exchange QP numbers, LIDs/GIDs, PSNs, rkeys and addresses over
// it once at setup (no registry, no hard-coded address), keep it open for as long as they talk
// (its closing is how a server learns that a client left or died), and never use it per request.
//
// Frame: magic "HRD1" (u32), version (u16), type (u16), payload length (u32), payload; all
// little-endian. A frame with another magic or version, a length past kMaxControlPayload, or a
// connection that closes mid-frame is an error that says which, never a partial message.
#ifndef HERD_TRANSPORT_CONTROL_CHANNEL_H_
#define HERD_TRANSPORT_CONTROL_CHANNEL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/control/message_channel.h"

namespace transport::control {

inline constexpr uint32_t kControlMagic = 0x31445248;  // "HRD1" read as little-endian bytes
inline constexpr uint16_t kControlVersion = 1;
inline constexpr uint32_t kFrameHeaderBytes = 12;
// Setup messages are small (endpoints and keys); anything past this is corruption or an attack.
inline constexpr uint32_t kMaxControlPayload = 1u << 20;

// One end of a control connection. Move-only; closes its socket when destroyed.
class Channel : public MessageChannel {
 public:
  // Connects to "host:port" (host: a name, IPv4 or [IPv6]), retrying refused connections until
  // `timeout` (the server may still be starting).
  static absl::StatusOr<Channel> Connect(std::string_view host_port, absl::Duration timeout);
  explicit Channel(int fd) : fd_(fd) {}
  Channel(Channel&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Channel& operator=(Channel&& other) noexcept;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel() override;

  absl::Status Send(uint16_t type, const std::vector<uint8_t>& payload) override;
  // Waits up to `timeout` for one whole message. kDeadlineExceeded when none began; kUnavailable
  // when the peer closed between messages; kDataLoss for a bad or truncated frame.
  absl::StatusOr<Message> Receive(absl::Duration timeout) override;
  // The peer closed, reset or half-closed (shut its sending side down) the connection, or this
  // channel has none; never blocks. Unread bytes the peer sent before closing do not count as
  // open (they stay readable): a peer that sends and leaves has left.
  bool PeerClosed() const override;

  // TCP keepalive: a peer whose machine died or was cut off (no FIN, no RST ever comes) makes
  // PeerClosed() true after about idle + interval x probes of silence.
  absl::Status EnableKeepalive(absl::Duration idle, absl::Duration interval, int probes);

  int fd() const { return fd_; }
  std::string peer_name() const override;

 private:
  // Reads exactly n bytes or fails (deadline, close, error).
  absl::Status ReadExactly(uint8_t* out, size_t n, absl::Time deadline, bool frame_started);
  int fd_ = -1;
};

// A listening TCP socket.
class Listener {
 public:
  // Binds `address` ("0.0.0.0", "::", "127.0.0.1", ...) and `port` (0 picks a free one).
  static absl::StatusOr<Listener> Listen(std::string_view address, uint16_t port);
  Listener(Listener&& other) noexcept : fd_(other.fd_), port_(other.port_) { other.fd_ = -1; }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  ~Listener();

  uint16_t port() const { return port_; }
  // TCP keepalive: a peer whose machine died or was cut off (no FIN, no RST ever comes) makes
  // PeerClosed() true after about idle + interval x probes of silence.
  absl::Status EnableKeepalive(absl::Duration idle, absl::Duration interval, int probes);

  int fd() const { return fd_; }
  // Waits up to `timeout` for a connection; kDeadlineExceeded when none came.
  absl::StatusOr<Channel> Accept(absl::Duration timeout);

 private:
  Listener(int fd, uint16_t port) : fd_(fd), port_(port) {}
  int fd_ = -1;
  uint16_t port_ = 0;
};

}  // namespace transport::control

#endif  // HERD_TRANSPORT_CONTROL_CHANNEL_H_
