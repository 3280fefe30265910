#include "herd/config.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "herd/protocol.h"
#include "mica/limits.h"

namespace herd {

std::string_view Name(RequestVerb verb) {
  switch (verb) {
    case RequestVerb::kUcWrite:
      return "uc_write";
    case RequestVerb::kRcWrite:
      return "rc_write";
    case RequestVerb::kUdSend:
      return "ud_send";
  }
  return "?";
}

std::string_view Name(ResponseVerb verb) {
  switch (verb) {
    case ResponseVerb::kUdSend:
      return "ud_send";
    case ResponseVerb::kUcWrite:
      return "uc_write";
    case ResponseVerb::kRcWrite:
      return "rc_write";
  }
  return "?";
}

absl::StatusOr<RequestVerb> ParseRequestVerb(std::string_view name) {
  for (RequestVerb v : {RequestVerb::kUcWrite, RequestVerb::kRcWrite, RequestVerb::kUdSend}) {
    if (Name(v) == name) return v;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--request_verb=%s: use uc_write, rc_write or ud_send", name));
}

absl::StatusOr<ResponseVerb> ParseResponseVerb(std::string_view name) {
  for (ResponseVerb v : {ResponseVerb::kUdSend, ResponseVerb::kUcWrite, ResponseVerb::kRcWrite}) {
    if (Name(v) == name) return v;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--response_verb=%s: use ud_send, uc_write or rc_write", name));
}

uint32_t Config::slot_value_bytes() const {
  const uint64_t fixed = uint64_t{kRequestHeaderMaxBytes} + Pad8(max_key_bytes);
  if (slot_bytes < fixed) return 0;
  return (slot_bytes - static_cast<uint32_t>(fixed)) & ~(kWireAlign - 1);
}

uint32_t Config::inline_limit() const {
  const uint32_t slot = slot_value_bytes();
  return inline_value_limit == 0 ? slot : std::min(inline_value_limit, slot);
}

uint32_t Config::value_limit() const { return std::max(max_value_bytes, inline_limit()); }

uint32_t Config::landing_value_limit() const {
  return landing_value_bytes == 0 ? value_limit() : std::min(landing_value_bytes, value_limit());
}

uint64_t Config::landing_bytes() const {
  return RequestBytes(Op::kCas, max_key_bytes, landing_value_limit());  // the longest op
}

uint32_t Config::response_slot_bytes() const { return ResponseBytes(slot_value_bytes()); }

uint64_t Config::region_bytes() const {
  return uint64_t{workers} * max_clients * window * slot_bytes;
}

std::string Config::ToJson() const {
  return absl::StrFormat(
      "{\"request_verb\":\"%s\",\"response_verb\":\"%s\",\"workers\":%d,\"ud_qps_per_worker\":%d,"
      "\"window\":%d,\"postlist\":%d,\"unsig_batch\":%d,\"inline\":%s,\"max_inline\":%d,"
      "\"slot_bytes\":%d,\"max_key_bytes\":%d,\"slot_value_bytes\":%d,\"max_clients\":%d,"
      "\"sq_depth\":%d,\"recv_depth\":%d,\"max_value_bytes\":%d,\"inline_value_limit\":%d,"
      "\"landing_buffers\":%d,\"landing_value_bytes\":%d}",
      Name(request_verb), Name(response_verb), workers, ud_qps_per_worker, window, postlist,
      unsig_batch, use_inline ? "true" : "false", max_inline, slot_bytes, max_key_bytes,
      slot_value_bytes(), max_clients, sq_depth, recv_depth, value_limit(), inline_limit(),
      landing_buffers, landing_value_limit());
}

absl::Status Validate(const Config& c, uint32_t mtu) {
  auto bad = [](auto&&... args) { return absl::InvalidArgumentError(absl::StrFormat(args...)); };
  if (c.workers < 1 || c.workers > kMaxWorkers) {
    return bad("--workers=%d: must be in 1..%d", c.workers, kMaxWorkers);
  }
  if (c.ud_qps_per_worker < 1 || c.ud_qps_per_worker > kMaxUdQps) {
    return bad("--ud_qps_per_worker=%d: must be in 1..%d", c.ud_qps_per_worker, kMaxUdQps);
  }
  if (c.window < 1 || c.window > kMaxWindow) {
    return bad("--window=%d: must be in 1..%d", c.window, kMaxWindow);
  }
  if (c.max_clients < 1 || c.max_clients > kMaxClients) {
    return bad("--max_clients=%d: must be in 1..%d", c.max_clients, kMaxClients);
  }
  if (c.postlist < 1) return bad("--postlist must be at least 1");
  if (c.unsig_batch < 1) return bad("--unsig_batch must be at least 1");
  if (c.postlist > c.unsig_batch) {
    return bad(
        "--postlist=%d > --unsig_batch=%d: a chain longer than the signalling interval would "
        "need several signalled sends per doorbell; raise --unsig_batch or lower --postlist",
        c.postlist, c.unsig_batch);
  }
  // Room for one unsignalled run plus the signalled send that retires it, twice over: the
  // sender polls for the older signal while the newer batch is in flight.
  if (uint64_t{c.unsig_batch} * 2 > c.sq_depth) {
    return bad("--unsig_batch=%d needs --sq_depth of at least %d (it is %d)", c.unsig_batch,
               2 * c.unsig_batch, c.sq_depth);
  }
  if (c.max_key_bytes < 1 || c.max_key_bytes > mica::kMaxKeyBytes) {
    return bad("--max_key_bytes=%d: must be in 1..%d", c.max_key_bytes, mica::kMaxKeyBytes);
  }
  if (c.slot_bytes % kWireAlign != 0 || c.slot_bytes > kMaxSlotBytes) {
    return bad("--slot_bytes=%d: must be a multiple of %d, at most %d", c.slot_bytes, kWireAlign,
               kMaxSlotBytes);
  }
  if (c.slot_bytes < kRequestHeaderMaxBytes + Pad8(c.max_key_bytes)) {
    return bad("--slot_bytes=%d cannot hold the %d-byte header and a %d-byte key", c.slot_bytes,
               kRequestHeaderMaxBytes, c.max_key_bytes);
  }
  if (c.response_verb == ResponseVerb::kUdSend && ResponseBytes(c.slot_value_bytes()) > mtu) {
    return bad(
        "a %d-byte value (what --slot_bytes=%d allows) makes a %d-byte UD response, over the "
        "%d-byte MTU: lower --slot_bytes or answer with --response_verb=uc_write/rc_write",
        c.slot_value_bytes(), c.slot_bytes, ResponseBytes(c.slot_value_bytes()), mtu);
  }
  if (c.request_verb == RequestVerb::kUdSend && c.slot_bytes > mtu) {
    return bad("--request_verb=ud_send: --slot_bytes=%d exceeds the %d-byte MTU", c.slot_bytes,
               mtu);
  }
  if (c.max_value_bytes > kMaxLargeValueBytes) {
    return bad("--max_value_bytes=%d: at most %d", c.max_value_bytes, kMaxLargeValueBytes);
  }
  if (c.large_values() && (c.landing_buffers < 1 || c.landing_buffers > kMaxLandingBuffers)) {
    return bad("--landing_buffers=%d: must be in 1..%d", c.landing_buffers, kMaxLandingBuffers);
  }
  if (c.large_values() && c.landing_value_bytes != 0 &&
      (c.landing_value_bytes <= c.inline_limit() || c.landing_value_bytes > c.value_limit())) {
    return bad(
        "--landing_value_bytes=%d: must be 0 (landing buffers for the largest value) or in "
        "%d..%d (over the inline limit, where out-of-line values start; at most "
        "--max_value_bytes)",
        c.landing_value_bytes, c.inline_limit() + 1, c.value_limit());
  }
  if (c.large_values() && c.inline_limit() < kMinInlineLimit) {
    return bad(
        "--inline_value_limit=%d (or --slot_bytes=%d): an out-of-line GET is answered with a "
        "%d-byte descriptor, so responses must carry at least that",
        c.inline_limit(), c.slot_bytes, kMinInlineLimit);
  }
  if (c.request_verb == RequestVerb::kUdSend && c.recv_depth < c.postlist) {
    return bad("--recv_depth=%d is below --postlist=%d", c.recv_depth, c.postlist);
  }
  return absl::OkStatus();
}

absl::Status ValidateClientLoad(const Config& c, uint32_t clients_per_thread) {
  const uint64_t outstanding = uint64_t{clients_per_thread} * c.workers * c.window;
  if (outstanding > kMaxClientReceives) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d clients per thread x %d workers x window %d = %d outstanding requests, but one "
        "thread's receive queue holds %d: lower --clients_per_thread or --window, or add threads",
        clients_per_thread, c.workers, c.window, outstanding, kMaxClientReceives));
  }
  return absl::OkStatus();
}

}  // namespace herd
