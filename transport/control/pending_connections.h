// Control connections a server accepted whose handshake is not finished yet, all served together
// from one thread without ever blocking it.
//
// Why: running each handshake to completion with blocking reads lets one TCP connection that never
// sends hold up every other join, and everything else the control thread does, for a whole
// message timeout. Here the set owns the listener's accepts and every pending connection
// (non-blocking, one epoll), reassembles frames per connection with the Channel's frame format and
// checks (magic, version, payload limit, truncation), enforces a deadline per connection, and
// hands a connection whose handshake finished over as an ordinary blocking Channel.
//
// Typical server loop (single-threaded: every method from the same thread):
//
//   std::vector<PendingConnections::Event> events;
//   while (running) {
//     pending->Wait(kPollInterval, &events);
//     for (auto& e : events) {
//       if (e.kind != Kind::kMessage) { log e.status; forget e.id; continue; }  // already closed
//       ... validate; pending->Send(e.id, reply); pending->SetDeadline(e.id, Now() + step);
//       ... or, on the last step: StatusOr<Channel> c = pending->Release(e.id);
//     }
//     ... other periodic work (retiring sessions whose Channel::PeerClosed()).
//   }
#ifndef HERD_TRANSPORT_CONTROL_PENDING_CONNECTIONS_H_
#define HERD_TRANSPORT_CONTROL_PENDING_CONNECTIONS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/control/channel.h"
#include "transport/control/handshake_set.h"

namespace transport::control {

// Enough for a flood of idle connections (1,000 must not keep a real client out) while keeping
// the set's memory bounded; the kernel's accept queue (net.core.somaxconn) is 4096 by default too.
inline constexpr size_t kDefaultMaxPending = 4096;
// Handshake messages carry endpoints and keys: a few KB. Together with max_pending this bounds
// what pending peers can make the set buffer (4096 x 64 KiB = 256 MiB at worst, only if every
// peer actually sends that much).
inline constexpr uint32_t kDefaultPendingMaxPayload = 64 << 10;
// A new connection's first message must be complete within this.
inline constexpr absl::Duration kDefaultFirstMessageTimeout = absl::Seconds(10);

struct PendingOptions {
  // Most connections pending at once (>= 1). A connection accepted at the cap closes the OLDEST
  // pending one (reported as kEvicted): refusing the newest would let anyone who holds `cap` idle
  // connections, renewed once per deadline, keep every real client out; evicting the oldest makes
  // a flood displace a real join only if it opens `cap` connections within that join's few
  // milliseconds.
  size_t max_pending = kDefaultMaxPending;
  // Largest payload a pending connection may send (1..kMaxControlPayload); more is kError.
  uint32_t max_payload = kDefaultPendingMaxPayload;
  // A connection's deadline when accepted; SetDeadline moves it for the next step.
  absl::Duration first_message_timeout = kDefaultFirstMessageTimeout;
  // How long Send may wait when a socket cannot take the whole reply at once. A small reply always
  // fits into a connection's empty socket buffers; one that does not means the peer stopped
  // reading, so the default fails at once and Send never blocks. A positive value bounds the
  // control thread's stall per such Send.
  absl::Duration send_timeout = absl::ZeroDuration();
};

class PendingConnections : public HandshakeSet {
 public:
  using Event = HandshakeEvent;

  // `listener` must outlive the set; the set takes over its accepts (do not call
  // Listener::Accept meanwhile). kInvalidArgument for options out of range.
  static absl::StatusOr<std::unique_ptr<PendingConnections>> Create(Listener* listener,
                                                                    PendingOptions options = {});
  PendingConnections(const PendingConnections&) = delete;
  PendingConnections& operator=(const PendingConnections&) = delete;
  ~PendingConnections() override;  // closes every pending connection

  // Replaces `*events` with what happened: accepts new connections (each gets an id, never reused,
  // and the deadline now + first_message_timeout), reads whatever arrived, and reports complete
  // messages (at most one per connection per call: a next message stays in the kernel, which
  // keeps Release lossless), closes, errors and passed deadlines. Every event but kMessage means
  // the set has closed the connection and forgotten its id. Waits at most `timeout` while nothing
  // is ready; may return early with no events (an accept or part of a frame was progress).
  void Wait(absl::Duration timeout, std::vector<Event>* events) override;

  // Sends one small reply (see PendingOptions::send_timeout). On failure the connection is closed
  // and forgotten (a partly sent frame leaves the stream unusable); kNotFound for an unknown id.
  absl::Status Send(uint64_t id, uint16_t type, const std::vector<uint8_t>& payload) override;

  // Moves a connection's deadline (e.g. now + the next step's timeout after a reply). A message
  // is never timed out in the Wait that reports it, but a deadline left in the past times the
  // connection out at the next Wait: move it after every message you answer.
  absl::Status SetDeadline(uint64_t id, absl::Time deadline) override;

  absl::Status Establish(uint64_t id) override;

  // The handshake finished: the connection leaves the set as a blocking Channel, on which
  // Receive, Send and PeerClosed work as on any Channel. Nothing is lost: the set never reads past
  // the message it reported, unless a later Wait already read part of a next frame, which a
  // request/response peer never sends unasked; then Release refuses (kFailedPrecondition, the
  // connection is closed) rather than drop those bytes. kNotFound for an unknown id.
  absl::StatusOr<Channel> Release(uint64_t id);
  absl::StatusOr<std::unique_ptr<MessageChannel>> ReleaseChannel(uint64_t id) override;

  // Closes and forgets a connection; an unknown id is ignored.
  void Close(uint64_t id) override;
  uint16_t port() const override { return listener_->port(); }

  size_t size() const { return connections_.size(); }

 private:
  struct Connection {
    int fd = -1;
    std::string peer;
    absl::Time accepted;
    absl::Time deadline;
    uint8_t header[kFrameHeaderBytes];
    size_t header_got = 0;
    uint16_t type = 0;
    uint32_t payload_bytes = 0;  // valid once the header is complete
    std::vector<uint8_t> payload;
    uint64_t message_round = 0;  // the Wait call that last reported a message from it
    bool established = false;    // Establish: a session, neither counted nor evicted
  };

  PendingConnections(Listener* listener, PendingOptions options, int epoll_fd);
  void AcceptReady(std::vector<Event>* events);
  // Reads until one message is complete or the socket has nothing more; reports what happened.
  void ReadReady(uint64_t id, std::vector<Event>* events);
  void ExpireDeadlines(std::vector<Event>* events);
  // Reports a non-message event and forgets the connection.
  void Drop(uint64_t id, Event::Kind kind, absl::Status status, std::vector<Event>* events);
  void Forget(std::map<uint64_t, Connection>::iterator it, bool close_fd);
  // The oldest connection not established, or connections_.end().
  std::map<uint64_t, Connection>::iterator OldestHandshaking();

  Listener* listener_;
  PendingOptions options_;
  int epoll_fd_ = -1;
  uint64_t next_id_ = 1;    // 0 marks the listener in epoll
  size_t handshaking_ = 0;  // connections not established: what max_pending bounds
  uint64_t round_ = 0;      // Wait calls so far
  // After accept() ran out of descriptors with nothing to evict: accepting resumes then, instead
  // of spinning on a listener that stays readable.
  absl::Time accept_paused_until_ = absl::InfinitePast();
  bool listener_armed_ = true;
  // Ordered by id = by accept time: begin() is the oldest, the one evicted at the cap.
  std::map<uint64_t, Connection> connections_;
  std::set<std::pair<absl::Time, uint64_t>> deadlines_;
};

}  // namespace transport::control

#endif  // HERD_TRANSPORT_CONTROL_PENDING_CONNECTIONS_H_
