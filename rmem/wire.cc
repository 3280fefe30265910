#include "rmem/wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "transport/control/wire.h"

namespace rmem {

using transport::control::WireReader;
using transport::control::WireWriter;

namespace {

constexpr uint32_t kWelcomeResumed = 1;

}  // namespace

std::vector<uint8_t> Encode(const RmemHello& hello) {
  return WireWriter()
      .U32(hello.version)
      .Endpoint(hello.qp)
      .U64(hello.resume.id)
      .U64(hello.resume.secret)
      .Take();
}

std::vector<uint8_t> Encode(const RmemWelcome& w) {
  return WireWriter()
      .Endpoint(w.qp)
      .U64(w.credential.id)
      .U64(w.credential.secret)
      .U32(w.resumed ? kWelcomeResumed : 0)
      .U64(w.last_txn)
      .U64(w.pool_bytes)
      .U32(w.max_ops)
      .Take();
}

absl::StatusOr<RmemHello> DecodeHello(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "rmem hello");
  RmemHello hello;
  r.U32(&hello.version);
  r.Endpoint(&hello.qp);
  r.U64(&hello.resume.id);
  r.U64(&hello.resume.secret);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (hello.version != kRmemProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rmem protocol version %u, this server speaks %u", hello.version, kRmemProtocolVersion));
  }
  return hello;
}

absl::StatusOr<RmemWelcome> DecodeWelcome(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "rmem welcome");
  RmemWelcome w;
  uint32_t flags = 0;
  r.Endpoint(&w.qp);
  r.U64(&w.credential.id);
  r.U64(&w.credential.secret);
  r.U32(&flags);
  r.U64(&w.last_txn);
  r.U64(&w.pool_bytes);
  r.U32(&w.max_ops);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (w.credential.id == 0 || (flags & ~kWelcomeResumed) != 0 || w.max_ops == 0) {
    return absl::DataLossError("rmem welcome: no client id, unknown flags or no ops allowed");
  }
  w.resumed = (flags & kWelcomeResumed) != 0;
  return w;
}

std::vector<uint8_t> EncodeError(const absl::Status& status) {
  return WireWriter()
      .U32(static_cast<uint32_t>(status.code()))
      .Bytes(std::string(status.message()).substr(0, kMaxReplyText))
      .Take();
}

absl::Status DecodeError(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "rmem error");
  uint32_t code = 0;
  std::string text;
  r.U32(&code);
  r.Bytes(&text, kMaxReplyText);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (code == 0 || code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(absl::StrFormat("an rmem error with code %u", code));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), "rmem_server refused: " + text);
}

absl::StatusOr<CommandHeader> DecodeCommand(const uint8_t* buffer, uint64_t bytes,
                                            std::vector<WireOp>* ops) {
  CommandHeader h;
  if (bytes < sizeof(h) || bytes > kCommandBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("a command of %u bytes: want %u..%u", bytes,
                                                      sizeof(CommandHeader), kCommandBytes));
  }
  std::memcpy(&h, buffer, sizeof(h));
  const auto kind = static_cast<CommandKind>(h.kind);
  const bool takes_ops = kind == CommandKind::kQueue || kind == CommandKind::kTxnGo;
  if (kind != CommandKind::kAlloc && !takes_ops && kind != CommandKind::kForget) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown command kind %u", h.kind));
  }
  // Fields a kind does not use are reserved: zero.
  const bool b_used = kind == CommandKind::kAlloc;
  const bool a_used = b_used || kind == CommandKind::kTxnGo;
  if (h.zero != 0 || (!a_used && h.a != 0) || (!b_used && h.b != 0)) {
    return absl::InvalidArgumentError("a command's reserved field is not zero");
  }
  if (!takes_ops && h.ops != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("command kind %u carries no ops", h.kind));
  }
  // 64-bit: h.ops is 16 bits from the peer, bytes a 32-bit receive length.
  const uint64_t want = sizeof(CommandHeader) + uint64_t{h.ops} * sizeof(WireOp);
  if (h.ops > kMaxOpsPerCommand || want != bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a command of %u bytes claims %u ops (%u bytes; at most %u ops)", bytes,
                        h.ops, want, kMaxOpsPerCommand));
  }
  const size_t first = ops->size();
  ops->resize(first + h.ops);
  if (h.ops > 0) {
    std::memcpy(ops->data() + first, buffer + sizeof(CommandHeader), h.ops * sizeof(WireOp));
  }
  for (size_t i = first; i < ops->size(); ++i) {
    const WireOp& op = (*ops)[i];
    const auto op_kind = static_cast<WireOpKind>(op.kind);
    const bool bad_free = op_kind == WireOpKind::kFree && (op.src_offset != 0 || op.dst_tag != 0 ||
                                                           op.dst_offset != 0 || op.bytes != 0);
    if ((op_kind != WireOpKind::kCopy && op_kind != WireOpKind::kFree) || op.zero != 0 ||
        bad_free) {
      ops->resize(first);
      return absl::InvalidArgumentError(
          absl::StrFormat("op %u: unknown kind %u or a reserved field set", i - first, op.kind));
    }
  }
  return h;
}

uint32_t EncodeReply(const ReplyHeader& header, const absl::Status& status, uint8_t* out) {
  ReplyHeader h = header;
  const absl::string_view text = status.message();
  h.code = static_cast<uint16_t>(status.code());
  h.text_bytes = static_cast<uint16_t>(std::min<size_t>(text.size(), kMaxReplyText));
  h.zero = 0;
  std::memcpy(out, &h, sizeof(h));
  if (h.text_bytes > 0) std::memcpy(out + sizeof(h), text.data(), h.text_bytes);
  return static_cast<uint32_t>(sizeof(h) + h.text_bytes);
}

absl::StatusOr<ReplyHeader> DecodeReply(const uint8_t* buffer, uint64_t bytes,
                                        absl::Status* refusal) {
  ReplyHeader h;
  if (bytes < sizeof(h) || bytes > kReplyBytes) {
    return absl::DataLossError(absl::StrFormat("a reply of %u bytes", bytes));
  }
  std::memcpy(&h, buffer, sizeof(h));
  if (h.text_bytes != bytes - sizeof(h) ||
      h.code > static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(absl::StrFormat(
        "a reply of %u bytes claims %u bytes of text, code %u", bytes, h.text_bytes, h.code));
  }
  *refusal =
      absl::Status(static_cast<absl::StatusCode>(h.code),
                   std::string(reinterpret_cast<const char*>(buffer + sizeof(h)), h.text_bytes));
  return h;
}

}  // namespace rmem
