// A hostile herd client for the adversarial suite. It joins with herd's own control messages
// (Hello -> ServerConfig -> Join -> Welcome) and its own transport objects, so afterwards it holds
// real request QPs connected to its session's server QPs, a UD QP, and the welcome (its region
// address, rkey and secret, the workers' UD endpoints and response QP numbers). From there it can
// post ANY work request: WRITEs of any bytes to any address under any rkey, UD SENDs of any bytes
// to any QP under any qkey, and authentic requests of its own session built by hand.
#ifndef HERD_TESTS_HERD_RAW_CLIENT_H_
#define HERD_TESTS_HERD_RAW_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "herd/config.h"
#include "herd/join.h"
#include "herd/protocol.h"
#include "transport/control/channel.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

namespace herd::testing {

struct RawClientOptions {
  std::string server;  // host:port
  std::string fabric;  // shm fabric name
  uint32_t clients = 1;
  uint32_t delay_us = 0;  // > 0: the asynchronous shm fabric
  absl::Duration timeout = absl::Seconds(10);
  // Rewrites the (honest) join before it is sent: wrong QP lists, controlled qkeys, garbage GIDs.
  std::function<void(Join&)> tamper;
};

// A response received on the raw client's UD QP, copied out of its receive buffer.
struct RawResponse {
  ResponseHeader header{};
  std::string value;
  uint32_t src_qp = 0;
};

class RawClient {
 public:
  // Joins; fails with the server's refusal (or any local error).
  static absl::StatusOr<std::unique_ptr<RawClient>> Connect(const RawClientOptions& options);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  const Config& config() const { return config_; }
  const Welcome& welcome() const { return welcome_; }
  uint32_t first_client_id() const { return welcome_.first_client_id; }
  uint32_t ud_qkey() const { return ud_qkey_; }
  transport::QpEndpoint ud_endpoint() const { return ud_qp_->endpoint(); }
  transport::control::Channel& channel() { return channel_; }
  // The worker that owns `key`.
  uint32_t WorkerOf(std::string_view key) const;

  // Server address of slot (worker, client, slot) of this session's block: its first byte.
  uint64_t SlotAddress(uint32_t client, uint32_t worker, uint32_t slot) const;

  // Posts one signalled WRITE of `bytes` through the request QP to `worker` and waits for its
  // completion; returns the completion's status (RC: kRemoteAccessError where it may not write).
  absl::StatusOr<transport::CompletionStatus> Write(uint32_t worker, uint64_t remote_addr,
                                                    uint32_t rkey, absl::Span<const uint8_t> bytes);
  // Posts one signalled UD SEND of `bytes` from the UD QP to `to` under `qkey`; waits for it.
  absl::StatusOr<transport::CompletionStatus> SendUd(const transport::QpEndpoint& to, uint32_t qkey,
                                                     absl::Span<const uint8_t> bytes);

  // An authentic request of THIS session, signed with `secret` (default: the session's), naming
  // `client_id` (default: the session's id for `client`).
  struct Request {
    uint32_t client = 0;  // logical client of this session (which slots it goes to)
    uint32_t worker = 0;
    uint64_t seq = 1;
    uint32_t attempt = 0;
    Op op = Op::kGet;
    std::string key;
    std::string value;
    uint64_t expected_version = 0;
    int64_t client_id = -1;  // -1: first_client_id() + client
    uint64_t secret = 0;     // 0: the session's
  };
  std::vector<uint8_t> Encode(const Request& request) const;
  // Sends `request` as this session's QPs would: an end-aligned WRITE into its own slot
  // (seq % window) with its own rkey, or a UD SEND to the worker under kQkey.
  absl::StatusOr<transport::CompletionStatus> Send(const Request& request);

  // Waits up to `timeout` for the next UD response on the UD QP (kDeadlineExceeded when none).
  absl::StatusOr<RawResponse> Receive(absl::Duration timeout);
  // Sends `request` and waits for the response that answers it (its seq, and this session's id
  // for request.client), skipping others, retransmitting it (next attempt) every 100 ms;
  // kDeadlineExceeded when none came within `timeout`.
  absl::StatusOr<RawResponse> Call(const Request& request,
                                   absl::Duration timeout = absl::Seconds(10));

  // Creates another QP of `type` in this client's PD, connected to `remote` (RC/UC): a fresh
  // attacker QP once an RC one went to the error state. Destroy it before this client.
  absl::StatusOr<std::unique_ptr<transport::QueuePair>> NewConnectedQp(
      transport::QpType type, const transport::QpEndpoint& remote);
  // Posts one signalled WRITE through `qp` (one of NewConnectedQp's) and waits for it.
  absl::StatusOr<transport::CompletionStatus> WriteThrough(transport::QueuePair& qp,
                                                           uint64_t remote_addr, uint32_t rkey,
                                                           absl::Span<const uint8_t> bytes);

 private:
  explicit RawClient(const RawClientOptions& options) : options_(options) {}
  absl::Status Handshake();
  absl::StatusOr<transport::CompletionStatus> PostAndWait(transport::QueuePair& qp,
                                                          transport::SendWr& wr,
                                                          absl::Span<const uint8_t> bytes);
  void RepostReceive(uint64_t buffer);

  const RawClientOptions options_;
  Config config_;
  Welcome welcome_;
  transport::control::Channel channel_{-1};
  uint32_t ud_qkey_ = 0;
  std::unique_ptr<transport::Device> device_;
  std::unique_ptr<transport::ProtectionDomain> pd_;
  std::unique_ptr<transport::CompletionQueue> send_cq_, recv_cq_;
  std::unique_ptr<transport::QueuePair> ud_qp_;
  std::vector<std::unique_ptr<transport::QueuePair>> request_qps_, response_qps_;
  std::vector<std::unique_ptr<transport::AddressHandle>> worker_ahs_;
  std::unique_ptr<transport::SharedMemory> buffer_, receives_, responses_;
  std::unique_ptr<transport::MemoryRegion> buffer_mr_, receives_mr_, responses_mr_;
  std::vector<std::unique_ptr<transport::AddressHandle>> extra_ahs_;
  uint64_t next_wr_id_ = 1;
};

}  // namespace herd::testing

#endif  // HERD_TESTS_HERD_RAW_CLIENT_H_
