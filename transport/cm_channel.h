// The control plane over RDMA-CM instead of TCP, for verbs devices: a client joins a server by
// IP address and port with no TCP connection at all.
//
// Design. The CM connects one RC "control QP" per connection (address and route resolution and
// the REQ/REP/RTU handshake, as transport/cm.h does for any RC QP); control messages then travel
// as RC SENDs over it, each message one SEND: [magic u32][type u16][zero u16][payload]. The CM's
// private data (56 bytes in a REQ) cannot carry a herd join (a server config, and per worker the
// endpoints of several QPs and keys), so it carries only the control QP's endpoint and the join
// messages follow on the connected QP. The connection's end (a DREQ when the peer closes it or
// its process dies, a failed handshake, an RC error) is how a server learns that a client left,
// as a TCP close is on the other control plane.
//
// Limits: a message is at most kCmMaxMessageBytes (a larger Send fails; a peer that sends more
// breaks the RC connection, which is then reported failed). kCmReceiveSlots receives are posted
// ahead and one goes back only when its message is taken, so a peer that floods messages holds
// at most that many here and then stalls itself (RNR), whether or not anyone reads. Sends never
// wait for the peer: at most kCmSendSlots are in flight, and a Send finding none free fails (the
// peer is not receiving).
#ifndef HERD_TRANSPORT_CM_CHANNEL_H_
#define HERD_TRANSPORT_CM_CHANNEL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/cm.h"
#include "transport/control/handshake_set.h"
#include "transport/control/message_channel.h"
#include "transport/control/pending_connections.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

namespace transport {

// Join and stats messages are a few KB (endpoints and keys; the stats JSON).
inline constexpr uint32_t kCmMaxMessageBytes = 64 << 10;
inline constexpr uint32_t kCmReceiveSlots = 2;  // a request/response peer has one message ahead
inline constexpr uint32_t kCmSendSlots = 2;
inline constexpr uint32_t kCmMagic = 0x324d4348;  // "HCM2"
inline constexpr uint32_t kCmHeaderBytes = 8;
// Pending joins a server holds at once: each holds ~256 KiB of pinned memory and a QP.
inline constexpr size_t kCmDefaultMaxPending = 256;
inline constexpr uint32_t kCmAcceptsPerStep = 16;

class CmChannel : public control::MessageChannel {
 public:
  // Connects to the CM listener at "host:port" (host: an address of the server's RDMA
  // interface) from `device` (a verbs device; the shm fabric is refused with kUnimplemented).
  // `device` must outlive the channel.
  static absl::StatusOr<std::unique_ptr<CmChannel>> Connect(Device& device,
                                                            std::string_view host_port,
                                                            absl::Duration timeout);
  // The server's end: accepts `request` on `device`.
  static absl::StatusOr<std::unique_ptr<CmChannel>> Accept(Device& device, CmRequest& request);
  ~CmChannel() override;

  absl::Status Send(uint16_t type, const std::vector<uint8_t>& payload) override;
  absl::StatusOr<control::Message> Receive(absl::Duration timeout) override;
  bool PeerClosed() const override;
  std::string peer_name() const override { return peer_; }

  // Receive without waiting: true and *message when one arrived, false when none did, the
  // link's failure (or a malformed message) otherwise.
  absl::StatusOr<bool> TryReceive(control::Message* message);
  // The peer disconnected (as opposed to the link failing or sending garbage).
  bool Disconnected() const;
  // No send of ours is still in flight (Close can then drop the connection without losing a
  // reply).
  bool SendsDone() const;

 private:
  CmChannel() = default;
  absl::Status CreateResources(Device& device);
  absl::Status PostReceive(uint32_t slot);
  // Reaps completions: sends free their slots, receives queue their messages.
  void Reap() const;

  struct State;
  std::unique_ptr<State> state_;
  std::string peer_;
};

// Joins served over RDMA-CM: the HandshakeSet of a server whose clients join with
// CmChannel::Connect. Accepts never block (a request is answered at once; a client that never
// finishes the handshake is timed out like one that never sends), at most kCmAcceptsPerStep per
// pass so a flood of requests cannot keep pending joins from being served. A request that carries
// application bytes (CmRequest::app_data: a CmChannel sends none) is not a control connection:
// it goes to the handler set by OnOtherRequest (e.g. hop_server's lookup QPs, connected by the CM
// alone), or is rejected when none is set. A CM connection costs
// far more than a socket (a PD, CQ, QP and pinned buffers), so a server should cap max_pending
// well below the TCP default (kCmDefaultMaxPending).
class CmHandshakes : public control::HandshakeSet {
 public:
  // Listens on `address` (an address of `device`'s interface) and `port` (0: any free one).
  // `device` must outlive the set. options.send_timeout is ignored (sends never wait).
  static absl::StatusOr<std::unique_ptr<CmHandshakes>> Create(Device& device,
                                                              std::string_view address,
                                                              uint16_t port,
                                                              control::PendingOptions options = {});
  ~CmHandshakes() override;

  void Wait(absl::Duration timeout, std::vector<control::HandshakeEvent>* events) override;
  absl::Status Send(uint64_t id, uint16_t type, const std::vector<uint8_t>& payload) override;
  absl::Status SetDeadline(uint64_t id, absl::Time deadline) override;
  absl::StatusOr<std::unique_ptr<control::MessageChannel>> ReleaseChannel(uint64_t id) override;
  absl::Status Establish(uint64_t id) override;
  void Close(uint64_t id) override;
  uint16_t port() const override { return listener_->port(); }
  size_t size() const { return pending_.size(); }

  // Called from Wait with each request that carries application bytes; it owns the request
  // (destroying it unanswered rejects it). Counts towards kCmAcceptsPerStep.
  using OtherRequestHandler = std::function<void(std::unique_ptr<CmRequest>)>;
  void OnOtherRequest(OtherRequestHandler handler) { other_request_ = std::move(handler); }

 private:
  struct Pending {
    std::unique_ptr<CmChannel> channel;
    absl::Time deadline;
    bool established = false;  // Establish: a session, neither counted nor evicted
  };
  CmHandshakes(Device& device, std::unique_ptr<CmListener> listener,
               control::PendingOptions options)
      : device_(device), listener_(std::move(listener)), options_(options) {}
  // One pass over everything; true when something happened.
  bool Step(std::vector<control::HandshakeEvent>* events);
  void Drop(uint64_t id, control::HandshakeEvent::Kind kind, absl::Status status,
            std::vector<control::HandshakeEvent>* events);
  void ReapClosing(bool all);

  Device& device_;
  std::unique_ptr<CmListener> listener_;
  control::PendingOptions options_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Pending> pending_;  // by id = by accept time: begin() is the oldest
  // Closed connections whose last reply may still be in flight, dropped once it completed or by
  // their deadline.
  std::deque<std::pair<absl::Time, std::unique_ptr<CmChannel>>> closing_;
  OtherRequestHandler other_request_;
};

// Opens a control link to the server at `host_port`: a TCP connection (ConnectMode::kTcp), or an
// RDMA-CM connection from `device` (kCm; a verbs device, which must outlive the link).
absl::StatusOr<std::unique_ptr<control::MessageChannel>> ConnectControl(ConnectMode mode,
                                                                        Device* device,
                                                                        std::string_view host_port,
                                                                        absl::Duration timeout);

}  // namespace transport

#endif  // HERD_TRANSPORT_CM_CHANNEL_H_
