// Test access to a herd::Client's internals (client.h names this class its friend): what a
// hostile or broken client does that the public API never lets a user do.
#ifndef HERD_TESTS_HERD_CLIENT_TEST_PEER_H_
#define HERD_TESTS_HERD_CLIENT_TEST_PEER_H_

#include <chrono>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "herd/client.h"
#include "transport/types.h"

namespace herd {

class ClientTestPeer {
 public:
  // A hostile client: puts `bytes` into request slot `slot` of logical client `client` at
  // `worker` exactly as a request would go (end-aligned WRITE, or a UD SEND), with no checks.
  static absl::Status SendRaw(Client& c, uint32_t client, uint32_t worker, uint32_t slot,
                              absl::Span<const uint8_t> bytes) {
    if (client >= c.options_.clients || worker >= c.config_.workers || slot >= c.config_.window ||
        bytes.size() > c.config_.slot_bytes) {
      return absl::InvalidArgumentError("SendRaw: no such slot, or more bytes than a slot holds");
    }
    const uint64_t index = c.SlotIndex(client, worker, slot);
    Client::Outstanding& o = c.slots_[index];
    if (o.active) return absl::FailedPreconditionError("SendRaw: slot in use");
    if (!c.BufferFree(o)) return absl::FailedPreconditionError("SendRaw: slot buffer in flight");
    std::memcpy(c.staging_->data() + index * c.config_.slot_bytes, bytes.data(), bytes.size());
    o.client = client;
    o.worker = worker;
    o.slot = slot;
    o.queue = c.config_.request_uses_slots() ? 1 + worker : 0;
    o.large_body = false;
    o.buffer_in_flight = false;
    o.sends = 0;  // sent as is: no attempt number is rewritten into raw bytes
    o.length = static_cast<uint32_t>(bytes.size());
    if (absl::Status s = c.Send(o, /*wait_for_room=*/true); !s.ok()) return s;
    return c.Flush();
  }
  // The session's checksum key, to build requests by hand.
  static uint64_t SessionSecret(const Client& c) { return c.welcome_.secret; }
  // A forger that learned them: the client's UD QP, where UD responses land, and its qkey.
  static transport::QpEndpoint UdEndpoint(const Client& c) { return c.ud_qp_->endpoint(); }
  static uint32_t UdQkey(const Client& c) { return c.ud_qkey_; }
  // The one active request of logical client `client` at `worker` (its seq and slot), as an
  // answer would name it; false if there is none.
  static bool ActiveRequest(const Client& c, uint32_t client, uint32_t worker, uint64_t* seq) {
    for (uint32_t slot = 0; slot < c.config_.window; ++slot) {
      const Client::Outstanding& o = c.slots_[c.SlotIndex(client, worker, slot)];
      if (o.active) {
        *seq = o.seq;
        return true;
      }
    }
    return false;
  }
  // Hands `response` to the client as if it had arrived; true if it was delivered into *out
  // (false: dropped as stray, or deferred for an out-of-line read).
  static bool Accept(Client& c, const ParsedResponse& response, Result* out) {
    return c.Accept(response, out) == Client::Accepted::kDelivered;
  }
  // The wire id of logical client 0 (answers name their client by it).
  static uint32_t FirstClientId(const Client& c) { return c.first_client_id_; }
  // Whether `worker`'s retransmission timer has measured a round trip yet.
  static bool TimerHasSample(const Client& c, uint32_t worker) {
    return c.timers_[worker].has_sample();
  }
  // Time moved back by `ago` for what a test names: every outstanding request as if submitted
  // (or last sent) that much earlier, its deadline too, and the next retransmission check;
  // the client's last look at its responses; every worker's last answer.
  static void BackdateRequests(Client& c, std::chrono::nanoseconds ago) {
    c.next_retry_check_ -= ago;
    for (Client::Outstanding& o : c.slots_) {
      if (!o.active) continue;
      o.submitted -= ago;
      o.deadline -= ago;
    }
  }
  static void BackdateWatch(Client& c, std::chrono::nanoseconds ago) { c.last_watch_ -= ago; }
  // The client's last look at its responses: now (what a test did before was no absence).
  static void WatchNow(Client& c) { c.last_watch_ = std::chrono::steady_clock::now(); }
  static void BackdateAnswers(Client& c, std::chrono::nanoseconds ago) {
    for (auto& last : c.last_answer_) last -= ago;
  }
  // A broken NIC path while the server lives on: the client's QPs forced into the error state.
  static void BreakQps(Client& c) {
    c.ud_qp_->SetError();
    for (auto& qp : c.request_qps_) qp->SetError();
  }
};

}  // namespace herd

#endif  // HERD_TESTS_HERD_CLIENT_TEST_PEER_H_
