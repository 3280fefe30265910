#include "tests/herd/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace herd::testing {
namespace {

constexpr size_t kChunkBytes = 64 * 1024;

sockaddr_in Loopback(const std::string& host, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  return a;
}

void NonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// One forwarded connection: bytes read from one end wait in `pending[i]` until written to the
// other.
struct Link {
  int fd[2] = {-1, -1};    // [0] the accepted client, [1] the upstream
  std::string pending[2];  // pending[i]: read from fd[i], to be written to fd[1 - i]
  bool closed = false;
  ~Link() {
    for (int f : fd) {
      if (f >= 0) close(f);
    }
  }
};

}  // namespace

uint16_t UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = Loopback("127.0.0.1", 0);
  socklen_t len = sizeof(a);
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

TcpProxy::TcpProxy(std::string host, uint16_t target_port)
    : host_(std::move(host)), target_port_(target_port) {
  listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = Loopback("127.0.0.1", 0);
  socklen_t len = sizeof(a);
  if (listener_ < 0 || bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(listener_, 64) != 0 ||
      getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    status_ = absl::InternalError(absl::StrCat("tcp proxy: listen: ", strerror(errno)));
    return;
  }
  port_ = ntohs(a.sin_port);
  NonBlocking(listener_);
  thread_ = std::thread([this] { Run(); });
}

TcpProxy::~TcpProxy() {
  stop_.store(true);
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (int f : {listener_, wake_[0], wake_[1]}) {
    if (f >= 0) close(f);
  }
}

void TcpProxy::Set(bool cut) {
  cut_.store(cut);
  (void)!write(wake_[1], "x", 1);
}

void TcpProxy::Run() {
  std::vector<std::unique_ptr<Link>> links;
  std::vector<pollfd> fds;
  char buffer[kChunkBytes];
  while (!stop_.load()) {
    const bool cut = cut_.load();
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listener_, POLLIN, 0});
    // Cut: the links are not polled at all, so their bytes wait in the kernel's buffers.
    if (!cut) {
      for (const auto& link : links) {
        for (int i = 0; i < 2; ++i) {
          short events = 0;
          if (link->pending[i].empty()) events |= POLLIN;        // room to read from fd[i]
          if (!link->pending[1 - i].empty()) events |= POLLOUT;  // bytes to write to fd[i]
          fds.push_back({link->fd[i], events, 0});
        }
      }
    }
    const size_t polled = cut ? 0 : links.size();  // links accepted below wait for the next poll
    if (poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents & POLLIN) {
      while (read(wake_[0], buffer, sizeof(buffer)) > 0) {
      }
    }
    if (fds[1].revents & POLLIN) {
      for (int client; (client = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) {
        if (cut_.load()) {
          close(client);  // an unreachable host: the connection goes nowhere
          continue;
        }
        auto link = std::make_unique<Link>();
        link->fd[0] = client;
        link->fd[1] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in target = Loopback(host_, target_port_);
        if (link->fd[1] < 0 ||
            connect(link->fd[1], reinterpret_cast<sockaddr*>(&target), sizeof(target)) != 0) {
          continue;  // nothing listens there now: the client sees its connection closed
        }
        const int one = 1;
        for (int f : link->fd) {
          setsockopt(f, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          NonBlocking(f);
        }
        links.push_back(std::move(link));
      }
    }
    size_t at = 2;
    for (size_t l = 0; l < polled; ++l) {
      Link* link = links[l].get();
      for (int i = 0; i < 2; ++i, ++at) {
        const short revents = fds[at].revents;
        if (revents & (POLLIN | POLLHUP | POLLERR)) {
          const ssize_t n = read(link->fd[i], buffer, sizeof(buffer));
          if (n > 0) {
            link->pending[i].append(buffer, static_cast<size_t>(n));
          } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            link->closed = true;  // one end went: so does the other (its bytes may be lost)
          }
        }
        if ((revents & POLLOUT) && !link->pending[1 - i].empty()) {
          // MSG_NOSIGNAL: an end that closed must not SIGPIPE the test process.
          const ssize_t n = send(link->fd[i], link->pending[1 - i].data(),
                                 link->pending[1 - i].size(), MSG_NOSIGNAL);
          if (n > 0) {
            link->pending[1 - i].erase(0, static_cast<size_t>(n));
          } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
            link->closed = true;
          }
        }
      }
    }
    std::erase_if(links, [](const std::unique_ptr<Link>& l) { return l->closed; });
  }
}

}  // namespace herd::testing
