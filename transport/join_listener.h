// Where a server takes joins, set up one way for every service (herd_server, hop_server,
// rmem_server): a TCP listener and the PendingConnections over it (ConnectMode::kTcp), or RDMA-CM
// handshakes on the server's device (CmHandshakes, ConnectMode::kCm). A client reaches either
// with ConnectControl (cm_channel.h).
//
//   transport::JoinListenerOptions options;
//   options.connect = mode;  options.address = "0.0.0.0";  options.port = 0;  // any free port
//   options.pending.first_message_timeout = absl::Seconds(10);
//   absl::StatusOr<transport::JoinListener> joins = transport::JoinListener::Open(*device,
//   options); if (!joins.ok()) return joins.status(); joins_ = *std::move(joins);
//   joins_->Wait(timeout, &events);  // the handshake set: control::HandshakeSet
#ifndef HERD_TRANSPORT_JOIN_LISTENER_H_
#define HERD_TRANSPORT_JOIN_LISTENER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/cm_channel.h"
#include "transport/control/channel.h"
#include "transport/control/handshake_set.h"
#include "transport/control/pending_connections.h"
#include "transport/fabric.h"
#include "transport/types.h"

namespace transport {

// TCP keepalive on every accepted connection: a peer whose machine died or was cut off (no FIN
// ever comes) is found closed after about idle + interval x probes of silence.
struct Keepalive {
  absl::Duration idle = absl::Seconds(2);
  absl::Duration interval = absl::Seconds(1);
  int probes = 3;
};

struct JoinListenerOptions {
  ConnectMode connect = ConnectMode::kTcp;
  std::string address;  // to listen on (kCm: an address of the device's interface)
  uint16_t port = 0;    // 0: any free one (port() says which)
  control::PendingOptions pending;
  std::optional<Keepalive> keepalive;  // kTcp only; none by default
  // kCm: what a connection request carrying application bytes is handed to (a connection made
  // by the CM alone, e.g. hop_server's lookup QPs); without one such requests are rejected.
  CmHandshakes::OtherRequestHandler on_other_request;
};

class JoinListener {
 public:
  JoinListener() = default;
  JoinListener(JoinListener&&) = default;
  // The set goes before the listener it accepts from (a defaulted assignment would free the
  // listener first).
  JoinListener& operator=(JoinListener&& other) noexcept {
    if (this == &other) return *this;
    reset();
    tcp_ = std::move(other.tcp_);
    set_ = std::move(other.set_);
    return *this;
  }
  ~JoinListener() { reset(); }
  // Stops listening: every pending connection closes.
  void reset() {
    set_.reset();
    tcp_.reset();
  }
  // Listens as `options` say. `bound`: a TCP listener the server bound earlier (to refuse a port
  // in use before it opens devices); else kTcp binds here. `device` (kCm) must outlive this.
  // kInvalidArgument for a keepalive or a bound listener asked of kCm.
  static absl::StatusOr<JoinListener> Open(Device& device, const JoinListenerOptions& options,
                                           std::unique_ptr<control::Listener> bound = nullptr);

  // The handshake set the server waits on and answers through.
  control::HandshakeSet* operator->() const { return set_.get(); }
  control::HandshakeSet& set() const { return *set_; }
  explicit operator bool() const { return set_ != nullptr; }
  uint16_t port() const { return set_->port(); }

 private:
  // Declared before set_, which accepts from it: destroyed after it.
  std::unique_ptr<control::Listener> tcp_;
  std::unique_ptr<control::HandshakeSet> set_;
};

}  // namespace transport

#endif  // HERD_TRANSPORT_JOIN_LISTENER_H_
