#include "transport/join_listener.h"

#include <utility>

#include "absl/status/status.h"

namespace transport {

absl::StatusOr<JoinListener> JoinListener::Open(Device& device, const JoinListenerOptions& options,
                                                std::unique_ptr<control::Listener> bound) {
  JoinListener joins;
  if (options.connect == ConnectMode::kCm) {
    if (bound != nullptr || options.keepalive.has_value()) {
      return absl::InvalidArgumentError(
          "a join listener over RDMA-CM takes neither a bound TCP listener nor TCP keepalive");
    }
    absl::StatusOr<std::unique_ptr<CmHandshakes>> set =
        CmHandshakes::Create(device, options.address, options.port, options.pending);
    if (!set.ok()) return set.status();
    if (options.on_other_request) (*set)->OnOtherRequest(options.on_other_request);
    joins.set_ = *std::move(set);
    return joins;
  }
  if (bound == nullptr) {
    absl::StatusOr<control::Listener> listener =
        control::Listener::Listen(options.address, options.port);
    if (!listener.ok()) return listener.status();
    bound = std::make_unique<control::Listener>(*std::move(listener));
  }
  joins.tcp_ = std::move(bound);
  if (options.keepalive.has_value()) {
    const Keepalive& k = *options.keepalive;
    if (absl::Status s = joins.tcp_->EnableKeepalive(k.idle, k.interval, k.probes); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::unique_ptr<control::PendingConnections>> set =
      control::PendingConnections::Create(joins.tcp_.get(), options.pending);
  if (!set.ok()) return set.status();
  joins.set_ = *std::move(set);
  return joins;
}

}  // namespace transport
