#include "bench/echo/echo_wire.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "transport/control/wire.h"

namespace bench::echo {

using transport::control::WireReader;
using transport::control::WireWriter;

absl::Status Validate(const EchoConfig& c, uint32_t mtu) {
  if (c.max_clients == 0 || c.window == 0 || c.postlist == 0 || c.unsig_batch == 0) {
    return absl::InvalidArgumentError(
        "--max_clients, --window, --postlist and --unsig_batch must be at least 1");
  }
  if (c.request_bytes < sizeof(Tag) || c.response_bytes < sizeof(Tag) || c.request_bytes % 8 ||
      c.response_bytes % 8) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request (%d B) and response (%d B) must be multiples of 8 of at least %d B",
        c.request_bytes, c.response_bytes, sizeof(Tag)));
  }
  if (c.slot_bytes % 8 != 0 || c.request_bytes > c.slot_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--slot_bytes=%d must be a multiple of 8 holding the %d-byte request",
                        c.slot_bytes, c.request_bytes));
  }
  if (c.response_bytes > mtu) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a %d-byte response does not fit the fabric's %d-byte UD MTU", c.response_bytes, mtu));
  }
  if (c.sq_depth < c.postlist || c.sq_depth < c.unsig_batch) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--sq_depth=%d must hold a postlist (%d) and an unsignalled batch (%d)",
                        c.sq_depth, c.postlist, c.unsig_batch));
  }
  return absl::OkStatus();
}

std::vector<uint8_t> Encode(const Hello& hello) {
  return WireWriter().U32(hello.clients).Endpoint(hello.ud).Endpoint(hello.request).Take();
}

absl::StatusOr<Hello> DecodeHello(const std::vector<uint8_t>& bytes) {
  Hello h;
  WireReader r(bytes, "echo hello");
  r.U32(&h.clients) && r.Endpoint(&h.ud) && r.Endpoint(&h.request);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return h;
}

std::vector<uint8_t> Encode(const Welcome& w) {
  const EchoConfig& c = w.config;
  return WireWriter()
      .U32(c.max_clients)
      .U32(c.window)
      .U32(c.slot_bytes)
      .U32(c.request_bytes)
      .U32(c.response_bytes)
      .U32(c.postlist)
      .U32(c.unsig_batch)
      .U32(c.sq_depth)
      .U32(c.max_inline)
      .U32(w.first_client)
      .U64(w.region_addr)
      .U32(w.region_rkey)
      .Endpoint(w.request)
      .Take();
}

absl::StatusOr<Welcome> DecodeWelcome(const std::vector<uint8_t>& bytes) {
  Welcome w;
  EchoConfig& c = w.config;
  WireReader r(bytes, "echo welcome");
  r.U32(&c.max_clients) && r.U32(&c.window) && r.U32(&c.slot_bytes) && r.U32(&c.request_bytes) &&
      r.U32(&c.response_bytes) && r.U32(&c.postlist) && r.U32(&c.unsig_batch) &&
      r.U32(&c.sq_depth) && r.U32(&c.max_inline) && r.U32(&w.first_client) &&
      r.U64(&w.region_addr) && r.U32(&w.region_rkey) && r.Endpoint(&w.request);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  // A welcome is the server's word, but still checked: the client sizes buffers from it.
  if (absl::Status s = Validate(c, UINT32_MAX); !s.ok()) {
    return absl::DataLossError(absl::StrCat("echo welcome: ", s.message()));
  }
  return w;
}

}  // namespace bench::echo
