// Every knob of a herd run, in one validated struct. The server owns it; clients receive the
// parts they must agree on at join time, so a sweep changes server flags only.
#ifndef HERD_HERD_CONFIG_H_
#define HERD_HERD_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace herd {

// How a request reaches a worker.
enum class RequestVerb : uint8_t {
  kUcWrite = 0,  // WRITE into the worker's slot over UC (HERD's choice: no ACKs)
  kRcWrite = 1,  // the same over RC
  kUdSend = 2,   // SEND to the worker's UD QP (no slots: receive buffers)
};
// How a response reaches the client.
enum class ResponseVerb : uint8_t {
  kUdSend = 0,   // SEND from one of the worker's shared UD QPs (HERD's choice: scales)
  kUcWrite = 1,  // WRITE into the client's response slot over a per-client UC QP
  kRcWrite = 2,  // the same over RC
};
std::string_view Name(RequestVerb verb);
std::string_view Name(ResponseVerb verb);
absl::StatusOr<RequestVerb> ParseRequestVerb(std::string_view name);
absl::StatusOr<ResponseVerb> ParseResponseVerb(std::string_view name);

// The qkey of the workers' UD QPs (UD requests carry it). Each client's UD QP has a qkey of its
// own, drawn at join, so only its server's workers can answer it.
inline constexpr uint32_t kQkey = 0x48455244;  // "HERD"
// A qkey with this bit set is "controlled" (IB spec): a sender's WR cannot use it.
inline constexpr uint32_t kControlledQkeyBit = 0x80000000;

// Hard bounds (the protocol's field widths and what one worker can poll).
inline constexpr uint32_t kMaxWorkers = 256;    // ResponseHeader::worker is 16 bits; be sane
inline constexpr uint32_t kMaxWindow = 1024;    // outstanding requests per client per worker
inline constexpr uint32_t kMaxClients = 65536;  // logical clients the region is sized for
inline constexpr uint32_t kMaxUdQps = 64;       // response UD QPs per worker
inline constexpr uint32_t kMaxSlotBytes = 1u << 20;
// The largest value (the RDMA KV design's 1 MiB, with room to sweep past it).
inline constexpr uint32_t kMaxLargeValueBytes = 16u << 20;
// Landing buffers per session and worker: the immediate names one in 16 bits.
inline constexpr uint32_t kMaxLandingBuffers = 1024;
// An out-of-line GET's response carries a ValueDescriptor (16 bytes) where the value would be.
inline constexpr uint32_t kMinInlineLimit = 16;

struct Config {
  RequestVerb request_verb = RequestVerb::kUcWrite;
  ResponseVerb response_verb = ResponseVerb::kUdSend;
  uint32_t workers = 1;
  uint32_t ud_qps_per_worker = 1;
  uint32_t window = 4;        // outstanding requests per (client, worker)
  uint32_t postlist = 16;     // most responses chained into one post_send (one doorbell)
  uint32_t unsig_batch = 32;  // one send in this many is signalled
  bool use_inline = true;     // post responses/requests inline when they fit
  uint32_t max_inline = 188;  // inline limit asked of each QP (bytes; NICs round it)
  uint32_t slot_bytes = 256;  // one request slot: header + key + value, multiple of 8
  uint32_t max_key_bytes = 16;
  uint32_t max_clients = 64;   // logical clients the request region has slots for
  uint32_t sq_depth = 256;     // send queue depth of every QP
  uint32_t recv_depth = 1024;  // UD request receives per worker (request_verb=ud_send)
  // Large values (docs/architecture.md, "Large values"): values up to max_value_bytes, those
  // longer than the inline limit out of line (PUT: WRITE_WITH_IMM into a landing buffer at the
  // worker; GET: a one-sided READ of the item the worker names). 0: every value travels inline
  // (at most slot_value_bytes()).
  uint32_t max_value_bytes = 0;
  uint32_t inline_value_limit = 0;  // 0: as much as a slot holds (slot_value_bytes())
  uint32_t landing_buffers = 2;     // per session and worker: large PUTs in flight
  // The largest value a landing buffer is sized for (key and header added); 0: value_limit().
  // Smaller buffers cost less memory (sessions x workers x landing_buffers x landing_bytes());
  // a large PUT/CAS/INSERT that does not fit one fails at the client with NO_MEMORY.
  uint32_t landing_value_bytes = 0;

  // Largest value that fits a slot next to a max-size key (responses carry at most this too).
  uint32_t slot_value_bytes() const;
  // Values longer than this go out of line (when large_values()).
  uint32_t inline_limit() const;
  // The largest value a request may carry, inline or not.
  uint32_t value_limit() const;
  bool large_values() const { return value_limit() > inline_limit(); }
  // The value a landing buffer is sized for: landing_value_bytes, or value_limit().
  uint32_t landing_value_limit() const;
  // One landing buffer: a whole request (key, value, header) with a max-size key and a value of
  // landing_value_limit().
  uint64_t landing_bytes() const;
  // A client's response slot (response_verb = *_write).
  uint32_t response_slot_bytes() const;
  uint64_t region_bytes() const;
  // The request region is [client][worker][window] slots: a client's slots (and a session's,
  // whose client ids are consecutive) are one contiguous block, registered as the session's own
  // memory region so its QPs can write nothing else.
  uint64_t client_block_bytes() const { return uint64_t{workers} * window * slot_bytes; }
  // Offset of slot (worker, client, index) in the request region.
  uint64_t SlotOffset(uint32_t worker, uint32_t client, uint32_t index) const {
    return client * client_block_bytes() + (uint64_t{worker} * window + index) * slot_bytes;
  }
  bool request_uses_slots() const { return request_verb != RequestVerb::kUdSend; }
  bool response_uses_slots() const { return response_verb != ResponseVerb::kUdSend; }
  std::string ToJson() const;
};

// Checks a config against itself and the fabric's path MTU (UD messages must fit it). The
// message names the flags in conflict.
absl::Status Validate(const Config& config, uint32_t mtu);

// A client's side of it: can `clients_per_thread` logical clients of one client thread have
// `window` requests outstanding to every worker? (Their responses need posted receives.)
inline constexpr uint32_t kMaxClientReceives = 16384;
absl::Status ValidateClientLoad(const Config& config, uint32_t clients_per_thread);

}  // namespace herd

#endif  // HERD_HERD_CONFIG_H_
