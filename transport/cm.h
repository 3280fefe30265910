// RDMA-CM (librdmacm) connection setup for RC queue pairs on the verbs backend: the alternative
// to exchanging endpoints over the TCP control plane (transport/control). Peers name each other
// by IP address and port; the CM resolves the address to a device and a route and runs its
// REQ/REP/RTU handshake. Each side creates its RC QP the usual way (RESET) and hands it here: the
// endpoints (QP number, PSN, LID, GID) travel in the CM's private data, the QP is connected with
// QueuePair::Connect, and the handshake completes only once both QPs are ready to send.
//
// Applications may add bytes of their own to each side's private data (a client's hello in the
// REQ, a server's answer in the REP: hopscotch's table address and rkey), at most
// kCmRequestAppBytes and kCmReplyAppBytes: what the CM messages leave after the endpoint.
//
// The CM must resolve the address to the device the QP belongs to; when it does not, the error
// names both. The shm fabric has no CM: it is refused with kUnimplemented.
#ifndef HERD_TRANSPORT_CM_H_
#define HERD_TRANSPORT_CM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/fabric.h"

namespace transport {

// Private data the CM carries: 56 bytes in a REQ (an RC connect: the IB CM's 92 less the kernel
// RDMA-CM's 36-byte IP header) and 196 in a REP (InfiniBand CM, which RoCE uses too). The endpoint
// takes kCmEndpointBytes of each (magic, QP number, PSN, LID, GID, application length).
inline constexpr size_t kCmRequestPrivateBytes = 56;
inline constexpr size_t kCmReplyPrivateBytes = 196;
inline constexpr size_t kCmEndpointBytes = 4 + 4 + 4 + 2 + 16 + 1;
inline constexpr size_t kCmRequestAppBytes = kCmRequestPrivateBytes - kCmEndpointBytes;
inline constexpr size_t kCmReplyAppBytes = kCmReplyPrivateBytes - kCmEndpointBytes;
static_assert(kCmReplyAppBytes <= 255, "the application length travels in one byte");

// One CM connection. Keep it as long as the QP is used: destroying it disconnects (the peer sees
// a DREQ; so it does when this process dies, the kernel disconnecting for it).
class CmConnection {
 public:
  virtual ~CmConnection() = default;
  // The peer disconnected or the connection failed (its handshake included); never blocks.
  // Once true it stays true.
  virtual bool Disconnected() = 0;
  // The handshake finished (an accepted connection: the requester's last step arrived; a
  // connection CmConnect made: at once). Never blocks.
  virtual bool Established() = 0;
  // The peer's address ("a.b.c.d:port"), for logs.
  virtual std::string peer() const = 0;
};

// A connection request a listener received and has not answered yet. Destroying it unanswered
// rejects it.
class CmRequest {
 public:
  virtual ~CmRequest() = default;
  virtual std::string peer() const = 0;
  // The requester's application bytes (empty when it sent none, or its private data was not a
  // herd endpoint: Accept then fails).
  virtual absl::Span<const uint8_t> app_data() const = 0;
  // Connects `qp` (RC, RESET, on `device`) to the requester's QP and accepts without waiting
  // for the requester's last handshake step: the QP can receive at once, and the connection
  // reports Disconnected() if the handshake never finishes. `reply` (at most kCmReplyAppBytes)
  // travels to the requester in the REP.
  virtual absl::StatusOr<std::unique_ptr<CmConnection>> Accept(
      const Device& device, QueuePair& qp, absl::Span<const uint8_t> reply = {}) = 0;
};

class CmListener {
 public:
  // Listens on `address` (an IPv4/IPv6 address of an RDMA interface) and `port` (0: any free).
  static absl::StatusOr<std::unique_ptr<CmListener>> Listen(std::string_view address,
                                                            uint16_t port);
  virtual ~CmListener() = default;
  virtual uint16_t port() const = 0;
  // Readable (poll) when a connection request may be waiting.
  virtual int fd() const = 0;
  // The oldest waiting connection request, or nullptr when none is; never blocks.
  virtual absl::StatusOr<std::unique_ptr<CmRequest>> NextRequest() = 0;
  // Waits up to `timeout` for one connection request and connects `qp` (RC, RESET, on `device`)
  // to the requester's QP.
  virtual absl::StatusOr<std::unique_ptr<CmConnection>> Accept(const Device& device, QueuePair& qp,
                                                               absl::Duration timeout) = 0;
};

// Connects `qp` (RC, RESET, on `device`) to the QP a listener at host:port accepts it with.
// `request` (at most kCmRequestAppBytes) travels in the REQ; the acceptor's reply bytes are
// stored in `*reply` when it is not null.
absl::StatusOr<std::unique_ptr<CmConnection>> CmConnect(const Device& device, QueuePair& qp,
                                                        std::string_view host, uint16_t port,
                                                        absl::Duration timeout,
                                                        absl::Span<const uint8_t> request = {},
                                                        std::vector<uint8_t>* reply = nullptr);

// Splits "host:port" (host: a name, an IPv4 address or a bracketed IPv6 one) for CmConnect.
absl::Status ParseCmAddress(std::string_view host_port, std::string* host, uint16_t* port);

// The IPv4 address a RoCE v2 GID carries (::ffff:a.b.c.d), by which the CM reaches that device;
// "" when the GID is not one (InfiniBand, IPv6).
std::string Ipv4OfGid(const Gid& gid);

}  // namespace transport

#endif  // HERD_TRANSPORT_CM_H_
