#include "transport/cm.h"

#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "util/errno_status.h"

namespace transport {
namespace {

// Private data: magic, QP number, PSN, LID, GID, the application's length and bytes.
constexpr uint32_t kEndpointMagic = 0x32454348;  // "HCE2" ("HCM1" had no application bytes)
constexpr size_t kAppLengthOffset = kCmEndpointBytes - 1;
constexpr int kListenBacklog = 16;
constexpr uint8_t kRetryCount = 7;
constexpr uint8_t kRnrRetryForever = 7;
// RDMA READ/atomic depth each side grants and asks: what herd's RC paths need.
constexpr uint8_t kReadDepth = 1;

// An encoded private data block (the REP's size: a REQ sends a prefix of it).
struct Wire {
  uint8_t bytes[kCmReplyPrivateBytes];
  size_t length = 0;
};

absl::StatusOr<Wire> Encode(const QpEndpoint& e, absl::Span<const uint8_t> app, size_t limit) {
  if (app.size() > limit - kCmEndpointBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d application bytes for RDMA-CM private data, at most %d fit", app.size(),
                        limit - kCmEndpointBytes));
  }
  Wire w{};
  uint8_t* p = w.bytes;
  std::memcpy(p, &kEndpointMagic, 4);
  std::memcpy(p + 4, &e.qp_num, 4);
  std::memcpy(p + 8, &e.psn, 4);
  std::memcpy(p + 12, &e.lid, 2);
  std::memcpy(p + 14, e.gid.data(), 16);
  p[kAppLengthOffset] = static_cast<uint8_t>(app.size());
  if (!app.empty()) std::memcpy(p + kCmEndpointBytes, app.data(), app.size());
  w.length = kCmEndpointBytes + app.size();
  return w;
}

// The endpoint, and the application's bytes in `*app` (a view into `data`).
absl::StatusOr<QpEndpoint> Decode(const std::vector<uint8_t>& data,
                                  absl::Span<const uint8_t>* app) {
  if (data.size() < kCmEndpointBytes) {
    return absl::DataLossError(
        absl::StrFormat("RDMA-CM private data of %d bytes, expected a herd endpoint of %d",
                        data.size(), kCmEndpointBytes));
  }
  const uint8_t* p = data.data();
  uint32_t magic;
  std::memcpy(&magic, p, 4);
  if (magic != kEndpointMagic) {
    return absl::DataLossError("RDMA-CM private data is not a herd endpoint (another program?)");
  }
  // The CM may pad private data to its fixed size: the length byte says what is the sender's.
  const size_t app_bytes = p[kAppLengthOffset];
  if (kCmEndpointBytes + app_bytes > data.size()) {
    return absl::DataLossError(
        absl::StrFormat("RDMA-CM private data claims %d application bytes, %d arrived", app_bytes,
                        data.size() - kCmEndpointBytes));
  }
  QpEndpoint e;
  std::memcpy(&e.qp_num, p + 4, 4);
  std::memcpy(&e.psn, p + 8, 4);
  std::memcpy(&e.lid, p + 12, 2);
  std::memcpy(e.gid.data(), p + 14, 16);
  if (app != nullptr) *app = absl::MakeConstSpan(p + kCmEndpointBytes, app_bytes);
  return e;
}

absl::Status Errno(std::string_view what) {
  return util::ErrnoStatus(absl::StatusCode::kUnavailable, what);
}

int Milliseconds(absl::Duration d) {
  return static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// What an event carried, copied out before the event is acknowledged.
struct Event {
  rdma_cm_event_type type;
  rdma_cm_id* id;
  int status;
  std::vector<uint8_t> private_data;
};

absl::StatusOr<Event> NextEvent(rdma_event_channel* channel, absl::Time deadline) {
  pollfd p{channel->fd, POLLIN, 0};
  const int ready = poll(&p, 1, Milliseconds(deadline - absl::Now()));
  if (ready < 0) return Errno("poll(RDMA-CM channel)");
  if (ready == 0) return absl::DeadlineExceededError("no RDMA-CM event before the deadline");
  rdma_cm_event* raw = nullptr;
  if (rdma_get_cm_event(channel, &raw) != 0) return Errno("rdma_get_cm_event");
  Event e{raw->event, raw->id, raw->status, {}};
  const auto* data = static_cast<const uint8_t*>(raw->param.conn.private_data);
  if (data != nullptr) {
    e.private_data.assign(data, data + raw->param.conn.private_data_len);
  }
  rdma_ack_cm_event(raw);
  return e;
}

absl::StatusOr<Event> Expect(rdma_event_channel* channel, rdma_cm_event_type want,
                             absl::Time deadline, std::string_view peer) {
  absl::StatusOr<Event> e = NextEvent(channel, deadline);
  if (!e.ok()) {
    return absl::Status(e.status().code(),
                        absl::StrFormat("RDMA-CM with %s, waiting for %s: %s", peer,
                                        rdma_event_str(want), e.status().message()));
  }
  if (e->type != want) {
    return absl::UnavailableError(absl::StrFormat("RDMA-CM with %s: %s (status %d), expected %s",
                                                  peer, rdma_event_str(e->type), e->status,
                                                  rdma_event_str(want)));
  }
  return e;
}

// The CM must have picked the QP's own device.
absl::Status CheckDevice(const rdma_cm_id* id, const Device& device, std::string_view peer) {
  if (id->verbs == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("RDMA-CM resolved %s to no RDMA device", peer));
  }
  const std::string resolved = ibv_get_device_name(id->verbs->device);
  if (resolved != device.name()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RDMA-CM reaches %s through device %s, but the QP is on %s: open %s "
                        "(--device) or use an address of %s",
                        peer, resolved, device.name(), resolved, device.name()));
  }
  return absl::OkStatus();
}

absl::Status CheckQp(const Device& device, const QueuePair& qp) {
  if (device.name() == "shm") {
    return absl::UnimplementedError(
        "RDMA-CM connects verbs devices; on the shm fabric exchange endpoints over the control "
        "plane (transport/control)");
  }
  if (qp.config().type != QpType::kRc) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RDMA-CM connects RC QPs, this one is %s", ToString(qp.config().type)));
  }
  if (qp.state() != QpState::kReset) {
    return absl::FailedPreconditionError("RDMA-CM needs a QP in RESET");
  }
  return absl::OkStatus();
}

absl::StatusOr<addrinfo*> Resolve(std::string_view host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const std::string name(host);
  if (const int rc = getaddrinfo(name.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::NotFoundError(absl::StrFormat("%s: %s", name, gai_strerror(rc)));
  }
  return found;
}

rdma_conn_param ConnParam(const Wire& wire, uint32_t qp_num) {
  rdma_conn_param param{};
  param.private_data = wire.bytes;
  param.private_data_len = static_cast<uint8_t>(wire.length);
  param.responder_resources = kReadDepth;
  param.initiator_depth = kReadDepth;
  param.retry_count = kRetryCount;
  param.rnr_retry_count = kRnrRetryForever;
  param.qp_num = qp_num;  // our own QP: the CM only carries its number
  return param;
}

// The address of an id's peer, for logs.
std::string PeerOf(rdma_cm_id* id) {
  const sockaddr* addr = rdma_get_peer_addr(id);
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  if (addr != nullptr) {
    const socklen_t length =
        addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    getnameinfo(addr, length, host, sizeof(host), port, sizeof(port),
                NI_NUMERICHOST | NI_NUMERICSERV);
  }
  return absl::StrFormat("%s:%s", host, port);
}

// An id and the event channel its events arrive on.
class Connection : public CmConnection {
 public:
  Connection(rdma_event_channel* channel, rdma_cm_id* id) : channel_(channel), id_(id) {}
  ~Connection() override {
    if (id_ != nullptr) {
      rdma_disconnect(id_);
      rdma_destroy_id(id_);
    }
    if (channel_ != nullptr) rdma_destroy_event_channel(channel_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  rdma_event_channel* channel() const { return channel_; }
  rdma_cm_id* id() const { return id_; }

  bool Disconnected() override {
    while (!disconnected_) {
      pollfd p{channel_->fd, POLLIN, 0};
      if (poll(&p, 1, 0) <= 0) break;
      rdma_cm_event* raw = nullptr;
      if (rdma_get_cm_event(channel_, &raw) != 0) {
        disconnected_ = true;  // the channel itself failed: nothing more will be learnt
        break;
      }
      switch (raw->event) {
        case RDMA_CM_EVENT_DISCONNECTED:
        case RDMA_CM_EVENT_CONNECT_ERROR:
        case RDMA_CM_EVENT_UNREACHABLE:
        case RDMA_CM_EVENT_REJECTED:
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
          disconnected_ = true;
          break;
        case RDMA_CM_EVENT_ESTABLISHED:
          established_ = true;
          break;
        default:  // ADDR_CHANGE (a bonding failover), TIMEWAIT_EXIT: still there
          break;
      }
      rdma_ack_cm_event(raw);
    }
    return disconnected_;
  }
  std::string peer() const override { return PeerOf(id_); }
  bool Established() override {
    Disconnected();  // consumes the events, ESTABLISHED among them
    return established_;
  }
  void MarkEstablished() { established_ = true; }

 private:
  rdma_event_channel* channel_;
  rdma_cm_id* id_;
  bool disconnected_ = false;
  bool established_ = false;
};

absl::StatusOr<std::unique_ptr<Connection>> NewId() {
  rdma_event_channel* channel = rdma_create_event_channel();
  if (channel == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rdma_create_event_channel: %s (is the rdma_ucm module loaded?)", std::strerror(errno)));
  }
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP) != 0) {
    const absl::Status s = Errno("rdma_create_id");
    rdma_destroy_event_channel(channel);
    return s;
  }
  return std::make_unique<Connection>(channel, id);
}

class Request : public CmRequest {
 public:
  Request(rdma_cm_id* id, std::vector<uint8_t> private_data)
      : id_(id), private_data_(std::move(private_data)) {
    remote_ = Decode(private_data_, &app_);
  }
  Request(const Request&) = delete;  // app_ points into private_data_
  Request& operator=(const Request&) = delete;
  ~Request() override {
    if (id_ != nullptr) {
      rdma_reject(id_, nullptr, 0);
      rdma_destroy_id(id_);
    }
  }
  std::string peer() const override { return PeerOf(id_); }
  absl::Span<const uint8_t> app_data() const override { return app_; }

  absl::StatusOr<std::unique_ptr<CmConnection>> Accept(const Device& device, QueuePair& qp,
                                                       absl::Span<const uint8_t> reply) override {
    if (absl::Status s = CheckQp(device, qp); !s.ok()) return s;
    if (id_ == nullptr) return absl::FailedPreconditionError("the request was answered already");
    absl::StatusOr<Wire> ours = Encode(qp.endpoint(), reply, kCmReplyPrivateBytes);
    if (!ours.ok()) return ours.status();
    const std::string client = absl::StrFormat("the client at %s", PeerOf(id_));
    if (absl::Status s = CheckDevice(id_, device, client); !s.ok()) return s;
    if (!remote_.ok()) return remote_.status();
    // The request's id becomes the connection's: its events move to a channel of its own.
    rdma_event_channel* channel = rdma_create_event_channel();
    if (channel == nullptr) return Errno("rdma_create_event_channel");
    if (rdma_migrate_id(id_, channel) != 0) {
      const absl::Status s = Errno("rdma_migrate_id");
      rdma_destroy_event_channel(channel);
      return s;
    }
    auto connection = std::make_unique<Connection>(channel, id_);
    id_ = nullptr;  // the connection owns it now, and disconnects or rejects through it
    ConnectConfig config;
    config.remote = *remote_;
    if (absl::Status s = qp.Connect(config); !s.ok()) {
      rdma_reject(connection->id(), nullptr, 0);
      return s;
    }
    rdma_conn_param param = ConnParam(*ours, qp.qp_num());
    if (rdma_accept(connection->id(), &param) != 0) return Errno("rdma_accept");
    return std::unique_ptr<CmConnection>(std::move(connection));
  }

 private:
  rdma_cm_id* id_;
  std::vector<uint8_t> private_data_;
  absl::StatusOr<QpEndpoint> remote_;
  absl::Span<const uint8_t> app_;  // into private_data_
};

class Listener : public CmListener {
 public:
  explicit Listener(std::unique_ptr<Connection> listening) : listening_(std::move(listening)) {}
  uint16_t port() const override { return ntohs(rdma_get_src_port(listening_->id())); }
  int fd() const override { return listening_->channel()->fd; }

  absl::StatusOr<std::unique_ptr<CmRequest>> NextRequest() override {
    pollfd p{fd(), POLLIN, 0};
    const int ready = poll(&p, 1, 0);
    if (ready < 0) return Errno("poll(RDMA-CM listener)");
    if (ready == 0) return nullptr;
    absl::StatusOr<Event> e = NextEvent(listening_->channel(), absl::Now());
    if (!e.ok()) return e.status();
    if (e->type != RDMA_CM_EVENT_CONNECT_REQUEST) {
      return absl::UnavailableError(
          absl::StrFormat("RDMA-CM listener: %s (status %d)", rdma_event_str(e->type), e->status));
    }
    return std::unique_ptr<CmRequest>(new Request(e->id, std::move(e->private_data)));
  }

  absl::StatusOr<std::unique_ptr<CmConnection>> Accept(const Device& device, QueuePair& qp,
                                                       absl::Duration timeout) override {
    if (absl::Status s = CheckQp(device, qp); !s.ok()) return s;
    const absl::Time deadline = absl::Now() + timeout;
    pollfd p{fd(), POLLIN, 0};
    const int ready = poll(&p, 1, Milliseconds(timeout));
    if (ready < 0) return Errno("poll(RDMA-CM listener)");
    if (ready == 0) {
      return absl::DeadlineExceededError(
          "RDMA-CM with a client, waiting for RDMA_CM_EVENT_CONNECT_REQUEST: no RDMA-CM event "
          "before the deadline");
    }
    absl::StatusOr<std::unique_ptr<CmRequest>> request = NextRequest();
    if (!request.ok()) return request.status();
    if (*request == nullptr) return absl::UnavailableError("RDMA-CM: the request vanished");
    absl::StatusOr<std::unique_ptr<CmConnection>> accepted = (*request)->Accept(device, qp);
    if (!accepted.ok()) return accepted.status();
    auto* connection = static_cast<Connection*>(accepted->get());
    absl::StatusOr<Event> established =
        Expect(connection->channel(), RDMA_CM_EVENT_ESTABLISHED, deadline, "the client");
    if (!established.ok()) return established.status();
    connection->MarkEstablished();
    return accepted;
  }

 private:
  std::unique_ptr<Connection> listening_;
};

}  // namespace

absl::Status ParseCmAddress(std::string_view host_port, std::string* host, uint16_t* port) {
  const size_t colon = host_port.rfind(':');
  uint32_t parsed = 0;
  if (colon == std::string_view::npos ||
      !absl::SimpleAtoi(std::string(host_port.substr(colon + 1)), &parsed) || parsed == 0 ||
      parsed > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("\"%s\" is not host:port (an address of the server's RDMA interface)",
                        std::string(host_port)));
  }
  std::string_view name = host_port.substr(0, colon);
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  *host = std::string(name);
  *port = static_cast<uint16_t>(parsed);
  return absl::OkStatus();
}

std::string Ipv4OfGid(const Gid& gid) {
  constexpr int kMappedPrefixZeros = 10;  // ::ffff:a.b.c.d: ten zero bytes, then 0xffff
  for (int i = 0; i < kMappedPrefixZeros; ++i) {
    if (gid[i] != 0) return "";
  }
  if (gid[10] != 0xff || gid[11] != 0xff) return "";
  return absl::StrFormat("%d.%d.%d.%d", gid[12], gid[13], gid[14], gid[15]);
}

absl::StatusOr<std::unique_ptr<CmListener>> CmListener::Listen(std::string_view address,
                                                               uint16_t port) {
  absl::StatusOr<std::unique_ptr<Connection>> listening = NewId();
  if (!listening.ok()) return listening.status();
  absl::StatusOr<addrinfo*> where = Resolve(address, port, /*passive=*/true);
  if (!where.ok()) return where.status();
  const int rc = rdma_bind_addr((*listening)->id(), (*where)->ai_addr);
  freeaddrinfo(*where);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrFormat("rdma_bind_addr(%s:%d): %s (an address of an RDMA interface?)",
                        std::string(address), port, std::strerror(errno)));
  }
  if (rdma_listen((*listening)->id(), kListenBacklog) != 0) return Errno("rdma_listen");
  return std::unique_ptr<CmListener>(new Listener(*std::move(listening)));
}

absl::StatusOr<std::unique_ptr<CmConnection>> CmConnect(const Device& device, QueuePair& qp,
                                                        std::string_view host, uint16_t port,
                                                        absl::Duration timeout,
                                                        absl::Span<const uint8_t> request,
                                                        std::vector<uint8_t>* reply) {
  if (absl::Status s = CheckQp(device, qp); !s.ok()) return s;
  absl::StatusOr<Wire> ours = Encode(qp.endpoint(), request, kCmRequestPrivateBytes);
  if (!ours.ok()) return ours.status();
  const std::string peer = absl::StrFormat("%s:%d", std::string(host), port);
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::unique_ptr<Connection>> connection = NewId();
  if (!connection.ok()) return connection.status();
  rdma_cm_id* id = (*connection)->id();
  rdma_event_channel* channel = (*connection)->channel();
  absl::StatusOr<addrinfo*> where = Resolve(host, port, /*passive=*/false);
  if (!where.ok()) return where.status();
  const int rc = rdma_resolve_addr(id, nullptr, (*where)->ai_addr, Milliseconds(timeout));
  freeaddrinfo(*where);
  if (rc != 0) return Errno("rdma_resolve_addr");
  if (auto e = Expect(channel, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, peer); !e.ok()) {
    return e.status();
  }
  if (absl::Status s = CheckDevice(id, device, peer); !s.ok()) return s;
  if (rdma_resolve_route(id, Milliseconds(deadline - absl::Now())) != 0) {
    return Errno("rdma_resolve_route");
  }
  if (auto e = Expect(channel, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, peer); !e.ok()) {
    return e.status();
  }
  rdma_conn_param param = ConnParam(*ours, qp.qp_num());
  if (rdma_connect(id, &param) != 0) return Errno("rdma_connect");
  // Our QP is not the CM's, so the reply arrives as CONNECT_RESPONSE and we finish the
  // handshake (rdma_establish) once our QP can send.
  absl::StatusOr<Event> response = Expect(channel, RDMA_CM_EVENT_CONNECT_RESPONSE, deadline, peer);
  if (!response.ok()) return response.status();
  absl::Span<const uint8_t> app;
  absl::StatusOr<QpEndpoint> remote = Decode(response->private_data, &app);
  if (!remote.ok()) return remote.status();
  if (reply != nullptr) reply->assign(app.begin(), app.end());
  ConnectConfig config;
  config.remote = *remote;
  if (absl::Status s = qp.Connect(config); !s.ok()) return s;
  if (rdma_establish(id) != 0) return Errno("rdma_establish");
  (*connection)->MarkEstablished();
  return std::unique_ptr<CmConnection>(*std::move(connection));
}

}  // namespace transport
