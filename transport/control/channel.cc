#include "transport/control/channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "transport/control/frame.h"
#include "util/errno_status.h"

namespace transport::control {

using internal::Errno;
using internal::MillisUntil;

namespace {

// Pause between attempts while the server is not listening yet.
constexpr absl::Duration kConnectRetryInterval = absl::Milliseconds(20);
// Connections the kernel queues for accept(): a burst of joins (or a flood of idle connections
// while PendingConnections is between two accepts) must not have SYNs dropped, which a client sees
// as a 1 s retransmission stall. The kernel caps it at net.core.somaxconn.
constexpr int kListenBacklog = SOMAXCONN;

absl::Status SplitHostPort(std::string_view host_port, std::string* host, std::string* port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == host_port.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is not host:port (e.g. 10.0.0.1:31850)", host_port));
  }
  *host = std::string(host_port.substr(0, colon));
  *port = std::string(host_port.substr(colon + 1));
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Channel> Channel::Connect(std::string_view host_port, absl::Duration timeout) {
  std::string host, port;
  if (absl::Status status = SplitHostPort(host_port, &host, &port); !status.ok()) return status;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot resolve '%s': %s", host_port, gai_strerror(rc)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::string last_error = "no address";
  while (true) {
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        freeaddrinfo(found);
        const int one = 1;  // setup messages are tiny and latency-bound
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return Channel(fd);
      }
      last_error = std::strerror(errno);
      close(fd);
    }
    if (absl::Now() + kConnectRetryInterval > deadline) break;
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(kConnectRetryInterval));
  }
  freeaddrinfo(found);
  return absl::UnavailableError(absl::StrFormat("cannot connect to %s within %s: %s", host_port,
                                                absl::FormatDuration(timeout), last_error));
}

Channel& Channel::operator=(Channel&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

Channel::~Channel() {
  if (fd_ >= 0) close(fd_);
}

absl::Status Channel::Send(uint16_t type, const std::vector<uint8_t>& payload) {
  return internal::SendFrame(fd_, type, payload, absl::InfiniteFuture());
}

absl::Status Channel::ReadExactly(uint8_t* out, size_t n, absl::Time deadline, bool frame_started) {
  size_t got = 0;
  while (got < n) {
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, MillisUntil(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Errno("control poll");
    if (ready == 0) {
      if (!frame_started && got == 0) return absl::DeadlineExceededError("no control message");
      return absl::DataLossError(
          absl::StrFormat("truncated control frame: %d of %d bytes arrived in time", got, n));
    }
    const ssize_t r = recv(fd_, out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("control receive");
    if (r == 0) {
      if (!frame_started && got == 0) {
        return absl::UnavailableError("the control connection was closed by the peer");
      }
      return absl::DataLossError(
          absl::StrFormat("truncated control frame: the peer closed after %d of %d bytes", got, n));
    }
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<Message> Channel::Receive(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  uint8_t header[kFrameHeaderBytes];
  if (absl::Status s = ReadExactly(header, sizeof(header), deadline, false); !s.ok()) return s;
  Message message;
  uint32_t length = 0;
  if (absl::Status s =
          internal::DecodeFrameHeader(header, kMaxControlPayload, &message.type, &length);
      !s.ok()) {
    return s;
  }
  message.payload.resize(length);
  if (absl::Status s = ReadExactly(message.payload.data(), length, deadline, true); !s.ok()) {
    return s;
  }
  return message;
}

bool Channel::PeerClosed() const {
  if (fd_ < 0) return true;  // no connection at all
  // POLLRDHUP: the peer's FIN arrived (it closed, or shut its sending side down; a herd peer
  // never half-closes). POLLHUP/POLLERR: reset or both directions shut. Unread bytes do not
  // matter: a peer that sends and then leaves has left.
  pollfd p{fd_, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

namespace {

// SO_KEEPALIVE and its timing on a socket (a listening socket's accepted connections inherit
// them on Linux).
absl::Status SetKeepalive(int fd, absl::Duration idle, absl::Duration interval, int probes) {
  const int on = 1;
  const int idle_s = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Seconds(idle)));
  const int interval_s = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Seconds(interval)));
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes)) != 0) {
    return util::ErrnoStatus(absl::StatusCode::kInternal, "setsockopt(keepalive)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Channel::EnableKeepalive(absl::Duration idle, absl::Duration interval, int probes) {
  return SetKeepalive(fd_, idle, interval, probes);
}

absl::Status Listener::EnableKeepalive(absl::Duration idle, absl::Duration interval, int probes) {
  return SetKeepalive(fd_, idle, interval, probes);
}

std::string Channel::peer_name() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return absl::StrFormat("%s:%s", host, port);
}

absl::StatusOr<Listener> Listener::Listen(std::string_view address, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
  addrinfo* found = nullptr;
  const std::string host(address), service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad listen address '%s': %s", address, gai_strerror(rc)));
  }
  // Non-blocking: a connection can vanish between readiness and accept(), which must then fail
  // with EAGAIN rather than block (Accept here and PendingConnections both wait with poll/epoll).
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(found);
    return Errno("socket");
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = bind(fd, found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  if (!bound || listen(fd, kListenBacklog) != 0) {
    absl::Status status = Errno(absl::StrFormat("listen on %s port %d", address, port));
    close(fd);
    return status;
  }
  sockaddr_storage bound_addr{};
  socklen_t len = sizeof(bound_addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound_addr), &len);
  const uint16_t actual = bound_addr.ss_family == AF_INET6
                              ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound_addr)->sin6_port)
                              : ntohs(reinterpret_cast<sockaddr_in*>(&bound_addr)->sin_port);
  return Listener(fd, actual);
}

Listener::~Listener() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<Channel> Listener::Accept(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, MillisUntil(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Errno("accept poll");
    if (ready == 0) return absl::DeadlineExceededError("no connection");
    // The accepted socket is blocking (accept4 does not inherit O_NONBLOCK).
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Channel(fd);
    }
    // Gone before we took it, or a network error that accept() passes on for that connection:
    // wait for the next one.
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED ||
        errno == EPROTO) {
      continue;
    }
    return Errno("accept");
  }
}

}  // namespace transport::control
