// rmem's messages. Two links join a client to rmem_server:
//
// 1. The control connection (TCP, transport/control), once per client:
//      Hello(version, the client's RC QP, a credential to resume or none)
//        -> Welcome(the server's RC QP, the client's credential, the pool's limits) [or Error]
//    It stays open for the client's whole stay: its closing is how the server learns the client
//    left or died (its queued, uncommitted ops are then discarded).
// 2. The RC QP pair: commands are two-sided SENDs into the server's receive buffers, answered by
//    a SEND into the client's; data moves by the client's one-sided READs and WRITEs into the
//    regions the server registered for it (nothing on the server's CPU).
//
// A command is a CommandHeader, then `ops` WireOps (kQueue, kTxnGo). A client has at most one
// command outstanding: it sends the next only after the reply to the last (the server keeps
// kCommandSlots receives posted per client, so a well-behaved client never meets an RNR; one
// that sends more only stalls itself).
//   kAlloc   a = bytes, b = tag        -> the region tied to tag (created if none): Reply a = the
//                                         region's remote address, b = bytes, c = tag, d = rkey
//   kQueue   ops                       -> queued behind earlier ones: Reply a = ops queued
//   kTxnGo   ops, a = txn id           -> the queued ops and these, applied all-or-nothing:
//                                         Reply a = bytes copied, b = txn id, d = regions freed,
//                                         e = 1 when the id was answered before (a retry)
//   kForget                            -> the client's record is freed (it leaves for good)
// Any refusal discards every op queued so far (the transaction is over) and the Reply carries
// the absl::StatusCode and a text. Ops name regions by tag, the region's name in the pool.
//
// Sizes are fixed and tied together below; every field a peer sends is checked (wire.cc).
#ifndef HERD_RMEM_WIRE_H_
#define HERD_RMEM_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rmem/types.h"
#include "transport/types.h"

namespace rmem {

enum RmemControl : uint16_t {
  kRmemHello = 1,
  kRmemWelcome = 2,
  kRmemError = 3,  // payload: EncodeError; the server closes the connection after it
};

inline constexpr uint32_t kRmemProtocolVersion = 1;

struct RmemHello {
  uint32_t version = kRmemProtocolVersion;
  transport::QpEndpoint qp;
  ClientCredential resume;  // id 0: a new client
};

struct RmemWelcome {
  transport::QpEndpoint qp;
  ClientCredential credential;
  bool resumed = false;   // the hello's credential was accepted (else: a new identity)
  uint64_t last_txn = 0;  // the client's last transaction id answered (0: none)
  uint64_t pool_bytes = 0;
  uint32_t max_ops = 0;  // per transaction
};

std::vector<uint8_t> Encode(const RmemHello& hello);
std::vector<uint8_t> Encode(const RmemWelcome& welcome);
absl::StatusOr<RmemHello> DecodeHello(const std::vector<uint8_t>& bytes);
absl::StatusOr<RmemWelcome> DecodeWelcome(const std::vector<uint8_t>& bytes);
// A refusal: its absl::StatusCode (u32) and its text.
std::vector<uint8_t> EncodeError(const absl::Status& status);
absl::Status DecodeError(const std::vector<uint8_t>& bytes);

enum class CommandKind : uint16_t { kAlloc = 1, kQueue = 2, kTxnGo = 3, kForget = 4 };
enum class WireOpKind : uint32_t { kCopy = 1, kFree = 2 };

struct CommandHeader {
  uint16_t kind;  // CommandKind
  uint16_t ops;   // WireOps following
  uint32_t zero;
  uint64_t seq;  // echoed by the reply
  uint64_t a, b;
};
static_assert(sizeof(CommandHeader) == 32);

// copy: [src_offset, +bytes) of the region tied to src_tag onto [dst_offset, +bytes) of dst_tag's;
// free: the region tied to src_tag (every other field zero).
struct WireOp {
  uint32_t kind;  // WireOpKind
  uint32_t zero;
  uint64_t src_tag, src_offset, dst_tag, dst_offset, bytes;
};
static_assert(sizeof(WireOp) == 48);

struct ReplyHeader {
  uint16_t kind;        // the command's
  uint16_t code;        // absl::StatusCode
  uint16_t text_bytes;  // the error text following the header
  uint16_t zero;
  uint64_t seq;
  uint64_t a, b, c;
  uint32_t d, e;
};
static_assert(sizeof(ReplyHeader) == 48);

// One command message: the receive buffers the server posts are this big.
inline constexpr uint32_t kCommandBytes = 8192;
inline constexpr uint32_t kMaxOpsPerCommand =
    (kCommandBytes - sizeof(CommandHeader)) / sizeof(WireOp);
static_assert(kMaxOpsPerCommand == 170);
// Receives the server keeps posted per client: one more than a well-behaved client uses, so the
// next command finds a receive while the last one's is being re-posted.
inline constexpr uint32_t kCommandSlots = 2;
// One reply message (the header and up to kMaxReplyText of error text).
inline constexpr uint32_t kReplyBytes = 256;
inline constexpr uint32_t kMaxReplyText = kReplyBytes - sizeof(ReplyHeader);

// Checks a received command of `bytes` (hostile: any length, any field) and appends its ops to
// `*ops` (copied out of the buffer). kInvalidArgument naming the fault; nothing appended then.
absl::StatusOr<CommandHeader> DecodeCommand(const uint8_t* buffer, uint64_t bytes,
                                            std::vector<WireOp>* ops);

// Writes a reply into `out` (kReplyBytes); returns its length. The status's text is cut to
// kMaxReplyText.
uint32_t EncodeReply(const ReplyHeader& header, const absl::Status& status, uint8_t* out);
// Checks a received reply (from the server: still checked, a client must not trust lengths).
// Returns the header, and the server's error (its code and text) as `*refusal`.
absl::StatusOr<ReplyHeader> DecodeReply(const uint8_t* buffer, uint64_t bytes,
                                        absl::Status* refusal);

}  // namespace rmem

#endif  // HERD_RMEM_WIRE_H_
