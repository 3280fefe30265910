#include "herd/join.h"

#include "absl/strings/str_format.h"
#include "transport/cm_channel.h"
#include "transport/control/channel.h"
#include "transport/control/wire.h"

namespace herd {
namespace {

using transport::QpEndpoint;
using transport::control::WireReader;
using transport::control::WireWriter;

constexpr uint32_t kMaxErrorBytes = 4096;

void PutEndpoints(WireWriter& w, const std::vector<QpEndpoint>& endpoints) {
  w.U32(static_cast<uint32_t>(endpoints.size()));
  for (const QpEndpoint& e : endpoints) w.Endpoint(e);
}

// A list must be empty or have one entry per worker.
bool GetEndpoints(WireReader& r, uint32_t workers, std::vector<QpEndpoint>* out,
                  absl::Status* error) {
  uint32_t n = 0;
  if (!r.U32(&n)) return false;
  if (n != 0 && n != workers) {
    *error = absl::DataLossError(
        absl::StrFormat("endpoint list of %d entries for %d workers", n, workers));
    return false;
  }
  out->resize(n);
  for (QpEndpoint& e : *out) {
    if (!r.Endpoint(&e)) return false;
  }
  return true;
}

}  // namespace

std::vector<uint8_t> Encode(const Hello& hello) {
  return WireWriter().U32(hello.clients).U32(hello.wire_version).Take();
}

std::vector<uint8_t> Encode(const Config& c) {
  return WireWriter()
      .U8(static_cast<uint8_t>(c.request_verb))
      .U8(static_cast<uint8_t>(c.response_verb))
      .U8(c.use_inline ? 1 : 0)
      .U32(c.workers)
      .U32(c.ud_qps_per_worker)
      .U32(c.window)
      .U32(c.postlist)
      .U32(c.unsig_batch)
      .U32(c.max_inline)
      .U32(c.slot_bytes)
      .U32(c.max_key_bytes)
      .U32(c.max_clients)
      .U32(c.sq_depth)
      .U32(c.recv_depth)
      .U32(c.max_value_bytes)
      .U32(c.inline_value_limit)
      .U32(c.landing_buffers)
      .U32(c.landing_value_bytes)
      .Take();
}

std::vector<uint8_t> Encode(const Join& join) {
  WireWriter w;
  w.Endpoint(join.ud).U32(join.ud_qkey);
  PutEndpoints(w, join.request_qps);
  PutEndpoints(w, join.response_qps);
  w.U64(join.response_region_addr).U32(join.response_region_rkey);
  PutEndpoints(w, join.large_qps);
  w.U32(join.resume_first_client_id).U64(join.resume_session);
  return w.Take();
}

std::vector<uint8_t> Encode(const Welcome& welcome) {
  WireWriter w;
  w.U32(welcome.first_client_id).U64(welcome.region_addr).U32(welcome.region_rkey);
  w.U64(welcome.secret);
  PutEndpoints(w, welcome.worker_ud);
  w.U32(static_cast<uint32_t>(welcome.worker_response_qpns.size()));
  for (uint32_t qpn : welcome.worker_response_qpns) w.U32(qpn);
  PutEndpoints(w, welcome.request_qps);
  PutEndpoints(w, welcome.response_qps);
  PutEndpoints(w, welcome.large_qps);
  w.U64(welcome.landing_addr).U32(welcome.landing_rkey);
  w.U8(welcome.takes_writes ? 1 : 0).U8(welcome.resumed ? 1 : 0).U64(welcome.epoch);
  return w.Take();
}

absl::StatusOr<Hello> DecodeHello(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "hello");
  Hello hello;
  r.U32(&hello.clients);
  // A client of wire format 1 sent the client count alone.
  hello.wire_version = bytes.size() == sizeof(uint32_t) ? 1 : 0;
  if (hello.wire_version == 0) r.U32(&hello.wire_version);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (hello.wire_version != kWireVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "hello: the client speaks herd wire format %d, this server %d: rebuild the client",
        hello.wire_version, kWireVersion));
  }
  return hello;
}

absl::StatusOr<Config> DecodeConfig(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "server config");
  Config c;
  uint8_t request = 0, response = 0, use_inline = 0;
  r.U8(&request) && r.U8(&response) && r.U8(&use_inline) && r.U32(&c.workers) &&
      r.U32(&c.ud_qps_per_worker) && r.U32(&c.window) && r.U32(&c.postlist) &&
      r.U32(&c.unsig_batch) && r.U32(&c.max_inline) && r.U32(&c.slot_bytes) &&
      r.U32(&c.max_key_bytes) && r.U32(&c.max_clients) && r.U32(&c.sq_depth) &&
      r.U32(&c.recv_depth) && r.U32(&c.max_value_bytes) && r.U32(&c.inline_value_limit) &&
      r.U32(&c.landing_buffers) && r.U32(&c.landing_value_bytes);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (request > static_cast<uint8_t>(RequestVerb::kUdSend) ||
      response > static_cast<uint8_t>(ResponseVerb::kRcWrite)) {
    return absl::DataLossError("server config names an unknown verb");
  }
  c.request_verb = static_cast<RequestVerb>(request);
  c.response_verb = static_cast<ResponseVerb>(response);
  c.use_inline = use_inline != 0;
  return c;
}

absl::StatusOr<Join> DecodeJoin(const std::vector<uint8_t>& bytes, uint32_t workers) {
  WireReader r(bytes, "join");
  Join join;
  absl::Status error;
  r.Endpoint(&join.ud) && r.U32(&join.ud_qkey) &&
      GetEndpoints(r, workers, &join.request_qps, &error) &&
      GetEndpoints(r, workers, &join.response_qps, &error) && r.U64(&join.response_region_addr) &&
      r.U32(&join.response_region_rkey) && GetEndpoints(r, workers, &join.large_qps, &error) &&
      r.U32(&join.resume_first_client_id) && r.U64(&join.resume_session);
  if (!error.ok()) return error;
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return join;
}

absl::StatusOr<Welcome> DecodeWelcome(const std::vector<uint8_t>& bytes, uint32_t workers,
                                      uint32_t ud_qps_per_worker) {
  WireReader r(bytes, "welcome");
  Welcome w;
  absl::Status error;
  uint32_t qpns = 0;
  uint8_t takes_writes = 0, resumed = 0;
  r.U32(&w.first_client_id) && r.U64(&w.region_addr) && r.U32(&w.region_rkey) && r.U64(&w.secret) &&
      GetEndpoints(r, workers, &w.worker_ud, &error) && r.U32(&qpns);
  if (!error.ok()) return error;
  if (qpns != uint64_t{workers} * ud_qps_per_worker) {
    return absl::DataLossError(
        absl::StrFormat("welcome: %d response QP numbers for %d workers x %d UD QPs", qpns, workers,
                        ud_qps_per_worker));
  }
  w.worker_response_qpns.resize(qpns);
  for (uint32_t& qpn : w.worker_response_qpns) r.U32(&qpn);
  GetEndpoints(r, workers, &w.request_qps, &error) &&
      GetEndpoints(r, workers, &w.response_qps, &error) &&
      GetEndpoints(r, workers, &w.large_qps, &error) && r.U64(&w.landing_addr) &&
      r.U32(&w.landing_rkey) && r.U8(&takes_writes) && r.U8(&resumed) && r.U64(&w.epoch);
  if (!error.ok()) return error;
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (takes_writes > 1 || resumed > 1) {
    return absl::DataLossError("welcome: takes_writes or resumed is neither 0 nor 1");
  }
  w.takes_writes = takes_writes == 1;
  w.resumed = resumed == 1;
  return w;
}

absl::StatusOr<transport::control::Message> Expect(transport::control::MessageChannel& channel,
                                                   MessageType type, absl::Duration timeout) {
  absl::StatusOr<transport::control::Message> message = channel.Receive(timeout);
  if (!message.ok()) return message.status();
  if (message->type == kError) {
    WireReader r(message->payload, "error");
    std::string text;
    r.Bytes(&text, kMaxErrorBytes);
    return absl::FailedPreconditionError(absl::StrCat("server refused: ", text));
  }
  if (message->type != type) {
    return absl::DataLossError(
        absl::StrFormat("expected control message %d, got %d", type, message->type));
  }
  return message;
}

namespace {

// One request on a connection of its own, answered by one message carrying a JSON string.
absl::StatusOr<std::string> AskForJson(std::string_view host_port, absl::Duration timeout,
                                       transport::ConnectMode mode, transport::Device* device,
                                       MessageType request, MessageType answer,
                                       std::string_view what) {
  absl::StatusOr<std::unique_ptr<transport::control::MessageChannel>> channel =
      ConnectControl(mode, device, host_port, timeout);
  if (!channel.ok()) return channel.status();
  if (absl::Status s = (*channel)->Send(request, {}); !s.ok()) return s;
  absl::StatusOr<transport::control::Message> message = Expect(**channel, answer, timeout);
  if (!message.ok()) return message.status();
  WireReader r(message->payload, what);
  std::string json;
  r.Bytes(&json, transport::control::kMaxControlPayload);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return json;
}

}  // namespace

absl::StatusOr<std::string> FetchServerStats(std::string_view host_port, absl::Duration timeout,
                                             transport::ConnectMode mode,
                                             transport::Device* device) {
  return AskForJson(host_port, timeout, mode, device, kStatsRequest, kStats, "stats");
}

absl::StatusOr<std::string> RequestPromotion(std::string_view host_port, absl::Duration timeout) {
  return AskForJson(host_port, timeout, transport::ConnectMode::kTcp, nullptr, kPromoteRequest,
                    kPromoted, "promoted");
}

}  // namespace herd
