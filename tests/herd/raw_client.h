// A hostile herd client for the adversarial suite. It joins with herd's own control messages
// (Hello -> ServerConfig -> Join -> Welcome) and its own transport objects, so afterwards it holds
// real request QPs connected to its session's server QPs, a UD QP, and the welcome (its region
// address, rkey and secret, the workers' UD endpoints and response QP numbers). When the server
// has large values (Config::large_values()) it also holds one RC large-value QP per worker,
// connected to its session's, and the welcome names its landing buffers. From there it can post
// ANY work request: WRITEs and WRITE_WITH_IMMs of any bytes to any address under any rkey with any
// immediate, READs of any address, UD SENDs of any bytes to any QP under any qkey, and authentic
// requests of its own session built by hand.
#ifndef HERD_TESTS_HERD_RAW_CLIENT_H_
#define HERD_TESTS_HERD_RAW_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
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
  // Local staging for one WR's bytes (a WRITE's source, a READ's destination): room for a
  // landing buffer's worth and then some, for WRITEs past a landing buffer's end.
  uint64_t buffer_bytes = 64 << 10;
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
  // The device, and the registered memory its UD receives land in: what a test rewrites or
  // pulls from under the server, as a hostile client may.
  transport::Device& device() const { return *device_; }
  const transport::SharedMemory& receives() const { return *receives_; }
  const transport::MemoryRegion& receives_mr() const { return *receives_mr_; }
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
  // Posts one signalled WRITE_WITH_IMM of `bytes` with immediate `imm` through the large-value QP
  // to `worker` (Config::large_values()) and waits for its completion.
  absl::StatusOr<transport::CompletionStatus> WriteWithImm(uint32_t worker, uint64_t remote_addr,
                                                           uint32_t rkey, uint32_t imm,
                                                           absl::Span<const uint8_t> bytes);
  // The same through `qp` (one of NewConnectedQp's, e.g. a fresh one to the session's large QP).
  absl::StatusOr<transport::CompletionStatus> WriteWithImmThrough(transport::QueuePair& qp,
                                                                  uint64_t remote_addr,
                                                                  uint32_t rkey, uint32_t imm,
                                                                  absl::Span<const uint8_t> bytes);
  // Posts one signalled READ of `length` bytes and waits for it; `bytes` holds what it read
  // when the status is kSuccess.
  struct ReadResult {
    transport::CompletionStatus status = transport::CompletionStatus::kSuccess;
    std::string bytes;
  };
  // Through the large-value QP to `worker`.
  absl::StatusOr<ReadResult> Read(uint32_t worker, uint64_t remote_addr, uint32_t rkey,
                                  uint32_t length);
  absl::StatusOr<ReadResult> ReadThrough(transport::QueuePair& qp, uint64_t remote_addr,
                                         uint32_t rkey, uint32_t length);
  // A plain WRITE through the large-value QP to `worker`.
  absl::StatusOr<transport::CompletionStatus> WriteLarge(uint32_t worker, uint64_t remote_addr,
                                                         uint32_t rkey,
                                                         absl::Span<const uint8_t> bytes);
  // Server address of landing buffer `buffer` at `worker` (the welcome's landing_addr, laid out
  // [worker][landing_buffers] x Config::landing_bytes()); not bounds-checked.
  uint64_t LandingAddress(uint32_t worker, uint64_t buffer) const;
  // Posts one signalled UD SEND of `bytes` from the UD QP to `to` under `qkey` (a SEND_WITH_IMM
  // when `imm` is set: how a request names its client); waits for it.
  absl::StatusOr<transport::CompletionStatus> SendUd(const transport::QpEndpoint& to, uint32_t qkey,
                                                     absl::Span<const uint8_t> bytes,
                                                     std::optional<uint32_t> imm = std::nullopt);

  // An authentic request of THIS session, signed with `secret` (default: the session's); a UD
  // SEND of it names `client_id` in its immediate (default: the session's id for `client`). In a
  // slot, the slot alone names the client.
  struct Request {
    uint32_t client = 0;  // logical client of this session (which slots it goes to)
    uint32_t worker = 0;
    uint64_t seq = 1;
    uint32_t attempt = 0;
    Op op = Op::kGet;
    std::string key;
    std::string value;
    uint64_t expected_version = 0;
    int64_t client_id = -1;  // UD SENDs' immediate; -1: first_client_id() + client
    uint64_t secret = 0;     // 0: the session's
    // >= 0: a GET that asks for its value to be copied into this landing buffer
    // (kRequestCopyToLanding; any index, in range or not).
    int64_t copy_to_landing = -1;
    // >= 0: sent as a large request: a WRITE_WITH_IMM of the whole request to the start of this
    // landing buffer at `worker`, immediate LandingImmediate(session id of `client`, landing).
    int32_t landing = -1;
  };
  std::vector<uint8_t> Encode(const Request& request) const;
  // Sends `request` as this session's QPs would: an end-aligned WRITE into its own slot
  // (seq % window) with its own rkey, or a UD SEND to the worker under kQkey; with `landing` set,
  // a WRITE_WITH_IMM into that landing buffer.
  absl::StatusOr<transport::CompletionStatus> Send(const Request& request);

  // Waits up to `timeout` for the next UD response on the UD QP (kDeadlineExceeded when none).
  absl::StatusOr<RawResponse> Receive(absl::Duration timeout);
  // Sends `request` and waits for the response that answers it (its seq, and this session's id
  // for request.client), skipping others, retransmitting it (next attempt) every 100 ms;
  // kDeadlineExceeded when none came within `timeout`.
  absl::StatusOr<RawResponse> Call(const Request& request,
                                   absl::Duration timeout = absl::Seconds(10));
  // Responses Call received that answer nothing Send ever sent (no (client id, seq) of a request
  // this client sent): answers to bytes it wrote by hand. A late answer to an earlier Call's
  // retransmission is not counted.
  uint64_t unexpected_responses() const { return unexpected_responses_; }

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
  // Posts `wr` (one SGE over the staging buffer: `bytes` copied in, or `length` bytes to read
  // into) and waits for its completion.
  absl::StatusOr<transport::CompletionStatus> PostAndWait(transport::QueuePair& qp,
                                                          transport::SendWr& wr,
                                                          absl::Span<const uint8_t> bytes);
  absl::StatusOr<transport::CompletionStatus> PostAndWait(transport::QueuePair& qp,
                                                          transport::SendWr& wr, uint64_t length);
  transport::QueuePair* LargeQp(uint32_t worker) const;
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
  std::vector<std::unique_ptr<transport::QueuePair>> request_qps_, response_qps_, large_qps_;
  std::vector<std::unique_ptr<transport::AddressHandle>> worker_ahs_;
  std::unique_ptr<transport::SharedMemory> buffer_, receives_, responses_;
  std::unique_ptr<transport::MemoryRegion> buffer_mr_, receives_mr_, responses_mr_;
  std::vector<std::unique_ptr<transport::AddressHandle>> extra_ahs_;
  uint64_t next_wr_id_ = 1;
  std::set<std::pair<uint32_t, uint64_t>> sent_;  // (client id answered, seq) of every Send
  uint64_t unexpected_responses_ = 0;
};

}  // namespace herd::testing

#endif  // HERD_TESTS_HERD_RAW_CLIENT_H_
