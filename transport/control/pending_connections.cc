#include "transport/control/pending_connections.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "transport/control/frame.h"

namespace transport::control {
namespace {

using internal::Errno;

// epoll's tag for the listening socket (connection ids start at 1).
constexpr uint64_t kListenerTag = 0;
// Ready descriptors taken per epoll_wait; more stay ready (level-triggered) for the next call.
constexpr int kMaxEpollEvents = 256;
// Accepts per Wait: a flood of connections must not keep Wait from reading the pending ones.
constexpr int kMaxAcceptsPerWait = 256;
// Bytes read per recv() of a payload: the buffer grows with what actually arrived, never to a
// claimed length up front.
constexpr size_t kReadChunk = 64 << 10;
// How long accepting pauses after the process ran out of descriptors with nothing to evict.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(10);

std::string PeerName(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return absl::StrFormat("%s:%s", host, port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PendingConnections>> PendingConnections::Create(
    Listener* listener, PendingOptions options) {
  if (listener == nullptr || listener->fd() < 0) {
    return absl::InvalidArgumentError("pending connections need a listening socket");
  }
  if (options.max_pending < 1) {
    return absl::InvalidArgumentError("max_pending must be at least 1");
  }
  if (options.max_payload < 1 || options.max_payload > kMaxControlPayload) {
    return absl::InvalidArgumentError(absl::StrFormat("max_payload %d is outside 1..%d",
                                                      options.max_payload, kMaxControlPayload));
  }
  if (options.first_message_timeout <= absl::ZeroDuration() ||
      options.send_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "first_message_timeout must be positive and send_timeout not negative");
  }
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return Errno("epoll_create1");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerTag;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listener->fd(), &ev) != 0) {
    absl::Status status = Errno("epoll_ctl(listener)");
    close(epoll_fd);
    return status;
  }
  return std::unique_ptr<PendingConnections>(new PendingConnections(listener, options, epoll_fd));
}

PendingConnections::PendingConnections(Listener* listener, PendingOptions options, int epoll_fd)
    : listener_(listener), options_(options), epoll_fd_(epoll_fd) {}

PendingConnections::~PendingConnections() {
  for (auto& [id, connection] : connections_) close(connection.fd);
  // Closing the epoll instance drops its registrations, the listener's included.
  close(epoll_fd_);
}

void PendingConnections::Wait(absl::Duration timeout, std::vector<Event>* events) {
  events->clear();
  ++round_;
  const absl::Time now = absl::Now();
  absl::Time until = now + std::max(timeout, absl::ZeroDuration());
  if (!deadlines_.empty()) until = std::min(until, deadlines_.begin()->first);
  if (!listener_armed_) {
    if (now >= accept_paused_until_) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kListenerTag;
      PCHECK(epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listener_->fd(), &ev) == 0);
      listener_armed_ = true;
    } else {
      until = std::min(until, accept_paused_until_);
    }
  }
  epoll_event ready[kMaxEpollEvents];
  int n = epoll_wait(epoll_fd_, ready, kMaxEpollEvents, internal::MillisUntil(until));
  if (n < 0) {
    // Only a signal can interrupt it; anything else (EBADF, EFAULT, EINVAL) is a bug here.
    PCHECK(errno == EINTR) << "epoll_wait";
    n = 0;
  }
  // Accept first: a connection evicted to make room must not also report a message.
  for (int i = 0; i < n; ++i) {
    if (ready[i].data.u64 == kListenerTag) AcceptReady(events);
  }
  for (int i = 0; i < n; ++i) {
    if (ready[i].data.u64 != kListenerTag) ReadReady(ready[i].data.u64, events);
  }
  ExpireDeadlines(events);
}

void PendingConnections::AcceptReady(std::vector<Event>* events) {
  for (int i = 0; i < kMaxAcceptsPerWait; ++i) {
    const int fd = accept4(listener_->fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // A signal, or a connection that failed before we took it (accept() passes such network
      // errors on): take the next one.
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if ((errno == EMFILE || errno == ENFILE) && handshaking_ > 0) {
        // Out of descriptors: the oldest pending connection makes room, as at max_pending.
        Drop(OldestHandshaking()->first, Event::Kind::kEvicted,
             absl::ResourceExhaustedError(
                 "out of file descriptors: the oldest pending control connection makes room "
                 "(raise RLIMIT_NOFILE)"),
             events);
        continue;
      }
      LOG(WARNING) << Errno("control accept") << "; accepting again in "
                   << absl::FormatDuration(kAcceptPause);
      epoll_event ev{};
      PCHECK(epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listener_->fd(), &ev) == 0);
      listener_armed_ = false;
      accept_paused_until_ = absl::Now() + kAcceptPause;
      return;
    }
    if (handshaking_ >= options_.max_pending) {
      const auto oldest = OldestHandshaking();
      Drop(oldest->first, Event::Kind::kEvicted,
           absl::ResourceExhaustedError(absl::StrFormat(
               "%d control connections pending (the limit): the oldest, pending for %s, makes "
               "room for a new one",
               handshaking_, absl::FormatDuration(absl::Now() - oldest->second.accepted))),
           events);
    }
    const int one = 1;  // replies are tiny and latency-bound
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const uint64_t id = next_id_++;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      LOG(WARNING) << Errno("epoll_ctl(control connection)");
      close(fd);
      continue;
    }
    Connection& connection = connections_[id];
    ++handshaking_;
    connection.fd = fd;
    connection.peer = PeerName(fd);
    connection.accepted = absl::Now();
    connection.deadline = connection.accepted + options_.first_message_timeout;
    deadlines_.emplace(connection.deadline, id);
  }
}

void PendingConnections::ReadReady(uint64_t id, std::vector<Event>* events) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;  // evicted by this call's accepts
  Connection& c = it->second;
  while (true) {
    const bool in_header = c.header_got < kFrameHeaderBytes;
    const size_t payload_got = c.payload.size();
    ssize_t r;
    if (in_header) {
      r = recv(c.fd, c.header + c.header_got, kFrameHeaderBytes - c.header_got, 0);
    } else {
      // Only up to this frame's end: what follows stays in the kernel for the next call, or for
      // the Channel that Release hands over.
      const size_t want = std::min<size_t>(c.payload_bytes - payload_got, kReadChunk);
      c.payload.resize(payload_got + want);
      r = recv(c.fd, c.payload.data() + payload_got, want, 0);
      c.payload.resize(payload_got + static_cast<size_t>(std::max<ssize_t>(r, 0)));
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Drop(id, Event::Kind::kError, Errno("control receive"), events);
      return;
    }
    if (r == 0) {
      if (c.header_got == 0) {
        Drop(id, Event::Kind::kClosed,
             absl::UnavailableError("the control connection was closed by the peer"), events);
      } else {
        Drop(id, Event::Kind::kError,
             absl::DataLossError(
                 absl::StrFormat("truncated control frame: the peer closed after %d of %d bytes",
                                 in_header ? c.header_got : payload_got,
                                 in_header ? kFrameHeaderBytes : c.payload_bytes)),
             events);
      }
      return;
    }
    if (in_header) {
      c.header_got += static_cast<size_t>(r);
      if (c.header_got < kFrameHeaderBytes) continue;
      if (absl::Status s = internal::DecodeFrameHeader(c.header, options_.max_payload, &c.type,
                                                       &c.payload_bytes);
          !s.ok()) {
        Drop(id, Event::Kind::kError, std::move(s), events);
        return;
      }
    }
    if (c.payload.size() < c.payload_bytes) continue;
    Event event;
    event.id = id;
    event.kind = Event::Kind::kMessage;
    event.message.type = c.type;
    event.message.payload = std::move(c.payload);
    event.peer = c.peer;
    events->push_back(std::move(event));
    c.payload = {};
    c.header_got = 0;
    c.payload_bytes = 0;
    c.message_round = round_;
    return;
  }
}

void PendingConnections::ExpireDeadlines(std::vector<Event>* events) {
  const absl::Time now = absl::Now();
  std::vector<uint64_t> expired;
  for (const auto& [deadline, id] : deadlines_) {
    if (deadline > now) break;
    // A message that arrived in this call is answered by the caller, who sets the next deadline.
    if (connections_.at(id).message_round != round_) expired.push_back(id);
  }
  for (const uint64_t id : expired) {
    const Connection& c = connections_.at(id);
    std::string what = "no control message";
    if (c.header_got > 0) {
      const bool in_header = c.header_got < kFrameHeaderBytes;
      what = absl::StrFormat("truncated control frame: %d of %d bytes",
                             in_header ? c.header_got : c.payload.size(),
                             in_header ? kFrameHeaderBytes : c.payload_bytes);
    }
    Drop(id, Event::Kind::kTimedOut,
         absl::DeadlineExceededError(
             absl::StrFormat("%s arrived before the deadline (%s after the accept)", what,
                             absl::FormatDuration(c.deadline - c.accepted))),
         events);
  }
}

absl::Status PendingConnections::Send(uint64_t id, uint16_t type,
                                      const std::vector<uint8_t>& payload) {
  auto it = connections_.find(id);
  if (it == connections_.end()) {
    return absl::NotFoundError(absl::StrFormat("no pending control connection %d", id));
  }
  absl::Status status =
      internal::SendFrame(it->second.fd, type, payload, absl::Now() + options_.send_timeout);
  if (!status.ok()) Forget(it, /*close_fd=*/true);
  return status;
}

absl::Status PendingConnections::SetDeadline(uint64_t id, absl::Time deadline) {
  auto it = connections_.find(id);
  if (it == connections_.end()) {
    return absl::NotFoundError(absl::StrFormat("no pending control connection %d", id));
  }
  deadlines_.erase({it->second.deadline, id});
  it->second.deadline = deadline;
  deadlines_.emplace(deadline, id);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MessageChannel>> PendingConnections::ReleaseChannel(uint64_t id) {
  absl::StatusOr<Channel> channel = Release(id);
  if (!channel.ok()) return channel.status();
  return std::make_unique<Channel>(*std::move(channel));
}

absl::StatusOr<Channel> PendingConnections::Release(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) {
    return absl::NotFoundError(absl::StrFormat("no pending control connection %d", id));
  }
  const Connection& c = it->second;
  if (c.header_got > 0) {
    const size_t got = c.header_got + c.payload.size();
    Forget(it, /*close_fd=*/true);
    return absl::FailedPreconditionError(absl::StrFormat(
        "%d bytes of a next control message arrived before the reply to the last one", got));
  }
  const int fd = c.fd;
  Forget(it, /*close_fd=*/false);
  // Channel's reads and writes expect a blocking socket (they wait with poll, then read or write
  // whatever is ready; Send relies on a blocking write for anything bigger than the buffers).
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    absl::Status status = Errno("fcntl(control connection)");
    close(fd);
    return status;
  }
  return Channel(fd);
}

void PendingConnections::Close(uint64_t id) {
  auto it = connections_.find(id);
  if (it != connections_.end()) Forget(it, /*close_fd=*/true);
}

void PendingConnections::Drop(uint64_t id, Event::Kind kind, absl::Status status,
                              std::vector<Event>* events) {
  auto it = connections_.find(id);
  Event event;
  event.id = id;
  event.kind = kind;
  event.status = std::move(status);
  event.peer = it->second.peer;
  events->push_back(std::move(event));
  Forget(it, /*close_fd=*/true);
}

absl::Status PendingConnections::Establish(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) {
    return absl::NotFoundError(absl::StrFormat("no pending control connection %d", id));
  }
  if (!it->second.established) {
    it->second.established = true;
    --handshaking_;
  }
  return SetDeadline(id, absl::InfiniteFuture());
}

std::map<uint64_t, PendingConnections::Connection>::iterator
PendingConnections::OldestHandshaking() {
  // Sessions are typically the oldest entries: a walk past them, only when one must go.
  auto it = connections_.begin();
  while (it != connections_.end() && it->second.established) ++it;
  return it;
}

void PendingConnections::Forget(std::map<uint64_t, Connection>::iterator it, bool close_fd) {
  if (!it->second.established) --handshaking_;
  // Unregister explicitly: a released descriptor lives on, and epoll would keep reporting it.
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
  if (close_fd) close(it->second.fd);
  deadlines_.erase({it->second.deadline, it->first});
  connections_.erase(it);
}

}  // namespace transport::control
