// RDMA-CM (librdmacm) connection setup for RC queue pairs on the verbs backend: the alternative
// to exchanging endpoints over the TCP control plane (transport/control). Peers name each other
// by IP address and port; the CM resolves the address to a device and a route and runs its
// REQ/REP/RTU handshake. Each side creates its RC QP the usual way (RESET) and hands it here: the
// endpoints (QP number, PSN, LID, GID) travel in the CM's private data, the QP is connected with
// QueuePair::Connect, and the handshake completes only once both QPs are ready to send.
//
// The CM must resolve the address to the device the QP belongs to; when it does not, the error
// names both. The shm fabric has no CM: it is refused with kUnimplemented.
#ifndef HERD_TRANSPORT_CM_H_
#define HERD_TRANSPORT_CM_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/fabric.h"

namespace transport {

// One established CM connection. Keep it as long as the QP is used: destroying it disconnects.
class CmConnection {
 public:
  virtual ~CmConnection() = default;
};

class CmListener {
 public:
  // Listens on `address` (an IPv4/IPv6 address of an RDMA interface) and `port` (0: any free).
  static absl::StatusOr<std::unique_ptr<CmListener>> Listen(std::string_view address,
                                                            uint16_t port);
  virtual ~CmListener() = default;
  virtual uint16_t port() const = 0;
  // Waits up to `timeout` for one connection request and connects `qp` (RC, RESET, on `device`)
  // to the requester's QP.
  virtual absl::StatusOr<std::unique_ptr<CmConnection>> Accept(const Device& device, QueuePair& qp,
                                                               absl::Duration timeout) = 0;
};

// Connects `qp` (RC, RESET, on `device`) to the QP a listener at host:port accepts it with.
absl::StatusOr<std::unique_ptr<CmConnection>> CmConnect(const Device& device, QueuePair& qp,
                                                        std::string_view host, uint16_t port,
                                                        absl::Duration timeout);

}  // namespace transport

#endif  // HERD_TRANSPORT_CM_H_
