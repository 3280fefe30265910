// rmem_server against a hostile client (issue 18). A raw client speaks the wire format by hand
// (wire.h: hello/welcome over TCP, then commands as RC SENDs) and sends what a real client never
// would: malformed and forbidden commands, bad control messages, one-sided accesses outside its
// regions, more commands than the server has receives, and a departure mid-transaction. After
// each attack:
//   - the refusal carries the expected absl code (or the connection is refused or closed);
//   - no byte of the pool changed that should not have (the whole data area is compared, and the
//     region table's totals);
//   - a victim's region, allocated and filled by a separate good client, keeps its bytes;
//   - a good rmem::Client still joins, allocates, puts, commits and gets.
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "rmem/client.h"
#include "rmem/server.h"
#include "rmem/wire.h"
#include "tests/rmem/rmem_fixture.h"
#include "transport/control/channel.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

namespace rmem {
namespace {

using testing::ServerThread;
using testing::TestClient;
using testing::TestDevice;
using testing::TestServer;
using transport::CompletionStatus;
using transport::control::Channel;
using transport::control::Message;

// How long anything that must happen may take (replies, closes, counters).
constexpr absl::Duration kWait = absl::Seconds(20);
constexpr uint32_t kMaxOps = 8;  // the pool's ops per transaction in these tests
constexpr uint64_t kRegionBytes = 4096;
constexpr uint64_t kVictimTag = 0x71c7;                 // the victim's region
constexpr uint64_t kOwnA = 0xa, kOwnB = 0xb;            // the attacker's own regions
constexpr uint64_t kUnknownTag = 0xdead;                // never allocated
constexpr uint64_t kGoodA = 0x600d0, kGoodB = 0x600d1;  // the good client's (freed after use)

std::vector<uint8_t> Pattern(uint64_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (uint64_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

// ------------------------------------------------------------------------------ commands

// A command as the attacker sends it: a header, ops, and how many bytes of that go out (past the
// ops: filler).
struct Cmd {
  CommandHeader header{};
  std::vector<WireOp> ops;
  std::optional<size_t> length;  // none: the header and every op

  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> out(sizeof(header) + ops.size() * sizeof(WireOp));
    std::memcpy(out.data(), &header, sizeof(header));
    if (!ops.empty()) {
      std::memcpy(out.data() + sizeof(header), ops.data(), ops.size() * sizeof(WireOp));
    }
    out.resize(length.value_or(out.size()), 0x5a);
    return out;
  }
};

Cmd MakeCmd(CommandKind kind, uint64_t a, uint64_t b, std::vector<WireOp> ops) {
  Cmd c;
  c.header.kind = static_cast<uint16_t>(kind);
  c.header.ops = static_cast<uint16_t>(ops.size());
  c.header.a = a;
  c.header.b = b;
  c.ops = std::move(ops);
  return c;
}
Cmd AllocCmd(uint64_t bytes, uint64_t tag) { return MakeCmd(CommandKind::kAlloc, bytes, tag, {}); }
Cmd QueueCmd(std::vector<WireOp> ops = {}) {
  return MakeCmd(CommandKind::kQueue, 0, 0, std::move(ops));
}
Cmd GoCmd(uint64_t txn_id, std::vector<WireOp> ops = {}) {
  return MakeCmd(CommandKind::kTxnGo, txn_id, 0, std::move(ops));
}
Cmd ForgetCmd() { return MakeCmd(CommandKind::kForget, 0, 0, {}); }

WireOp CopyOp(uint64_t src_tag, uint64_t src_offset, uint64_t dst_tag, uint64_t dst_offset,
              uint64_t bytes) {
  WireOp op{};
  op.kind = static_cast<uint32_t>(WireOpKind::kCopy);
  op.src_tag = src_tag;
  op.src_offset = src_offset;
  op.dst_tag = dst_tag;
  op.dst_offset = dst_offset;
  op.bytes = bytes;
  return op;
}
WireOp FreeOp(uint64_t tag) {
  WireOp op{};
  op.kind = static_cast<uint32_t>(WireOpKind::kFree);
  op.src_tag = tag;
  return op;
}

// `value` changed by `edit`: the table's way to spoil one field.
template <typename T, typename Edit>
T With(T value, Edit edit) {
  edit(value);
  return value;
}

// What the server answered a command.
struct Reply {
  ReplyHeader header{};
  absl::Status status;  // its refusal; OK when it accepted the command
};

// What the server made of a control message.
struct ControlAnswer {
  std::optional<RmemWelcome> welcome;
  absl::Status refusal;  // its kRmemError, decoded
  bool closed = false;   // it closed the connection without a word
};

ControlAnswer ReadAnswer(Channel& channel) {
  ControlAnswer answer;
  absl::StatusOr<Message> m = channel.Receive(kWait);
  if (!m.ok()) {
    answer.closed = m.status().code() == absl::StatusCode::kUnavailable;
    answer.refusal = m.status();
  } else if (m->type == kRmemError) {
    answer.refusal = DecodeError(m->payload);
  } else if (m->type == kRmemWelcome) {
    absl::StatusOr<RmemWelcome> welcome = DecodeWelcome(m->payload);
    if (welcome.ok()) {
      answer.welcome = *welcome;
    } else {
      answer.refusal = welcome.status();
    }
  } else {
    answer.refusal = absl::DataLossError(absl::StrFormat("control message type %u", m->type));
  }
  return answer;
}

// A control frame's header as it travels (channel.h): magic, version, type, payload length.
std::vector<uint8_t> Frame(uint32_t magic, uint16_t version, uint16_t type, uint32_t length) {
  std::vector<uint8_t> out(transport::control::kFrameHeaderBytes);
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &version, 2);
  std::memcpy(out.data() + 6, &type, 2);
  std::memcpy(out.data() + 8, &length, 4);
  return out;
}

bool SendRaw(const Channel& channel, const std::vector<uint8_t>& bytes) {
  return ::send(channel.fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
         static_cast<ssize_t>(bytes.size());
}

// ------------------------------------------------------------------------------ the raw client

// A client that says whatever it likes: its own device, PD, CQ and RC QP, one registered buffer
// ([send slots | reply slots | data]), and the control connection.
class RawClient {
 public:
  static constexpr uint32_t kSendSlots = 16;  // SENDs in flight at once (a flood)
  static constexpr uint64_t kSendSlotBytes = 2 * kCommandBytes;
  static constexpr uint32_t kMaxReplySlots = 16;
  static constexpr uint64_t kDataBytes = 64 << 10;  // one-sided READs and WRITEs

  static absl::StatusOr<std::unique_ptr<RawClient>> Open(const transport::DeviceOptions& device) {
    std::unique_ptr<RawClient> c(new RawClient);
    if (absl::Status s = c->Init(device); !s.ok()) return s;
    return c;
  }

  ~RawClient() {
    channel_.reset();
    qp_.reset();  // before the CQ and the MR
  }

  // Connects the control channel; sends nothing.
  absl::Status Dial(const std::string& server) {
    absl::StatusOr<Channel> channel = Channel::Connect(server, kWait);
    if (!channel.ok()) return channel.status();
    channel_ = std::make_unique<Channel>(*std::move(channel));
    return absl::OkStatus();
  }
  // A well-formed hello naming this client's QP.
  RmemHello Hello(ClientCredential resume = {}) const {
    RmemHello hello;
    hello.qp = qp_->endpoint();
    hello.resume = resume;
    return hello;
  }
  // Sends one control message and reads the server's answer.
  ControlAnswer Control(uint16_t type, const std::vector<uint8_t>& payload) {
    if (absl::Status s = channel_->Send(type, payload); !s.ok()) {
      ControlAnswer answer;
      answer.refusal = s;
      return answer;
    }
    return ReadAnswer(*channel_);
  }
  // Joins as a good client would: hello, welcome, the QP connected, `reply_slots` receives
  // posted for replies.
  absl::Status Join(const std::string& server, uint32_t reply_slots = kCommandSlots) {
    if (absl::Status s = Dial(server); !s.ok()) return s;
    ControlAnswer answer = Control(kRmemHello, Encode(Hello()));
    if (!answer.welcome.has_value()) return answer.refusal;
    transport::ConnectConfig connect;
    connect.remote = answer.welcome->qp;
    if (absl::Status s = qp_->Connect(connect); !s.ok()) return s;
    for (uint32_t i = 0; i < reply_slots; ++i) {
      if (absl::Status s = PostReceive(i); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  Channel* channel() const { return channel_.get(); }
  void CloseControl() { channel_.reset(); }

  // Posts one SEND of `bytes` (any length up to kSendSlotBytes); does not wait for anything.
  absl::Status Post(const std::vector<uint8_t>& bytes) {
    if (bytes.size() > kSendSlotBytes) return absl::InvalidArgumentError("past a send slot");
    const uint32_t slot = next_send_++ % kSendSlots;
    uint8_t* buffer = memory_->data() + slot * kSendSlotBytes;
    if (!bytes.empty()) std::memcpy(buffer, bytes.data(), bytes.size());
    transport::Sge sge{reinterpret_cast<uint64_t>(buffer), static_cast<uint32_t>(bytes.size()),
                       mr_->lkey()};
    transport::SendWr wr;
    wr.wr_id = kSendWr | slot;
    wr.sg_list = &sge;
    wr.num_sge = bytes.empty() ? 0 : 1;
    wr.opcode = transport::Opcode::kSend;
    wr.flags = transport::kSignaled;
    transport::SendWr* bad = nullptr;
    return qp_->PostSend(&wr, &bad);
  }
  // The next reply, its receive posted again. Unavailable once a work request failed (the QP
  // broke) or the server closed the control connection; DeadlineExceeded when none came.
  absl::StatusOr<Reply> NextReply(absl::Duration timeout = kWait) {
    const absl::Time deadline = absl::Now() + timeout;
    while (replies_.empty()) {
      if (Poll()) continue;
      if (!broken_.ok()) return broken_;
      if (channel_ != nullptr && channel_->PeerClosed() && !Poll() && replies_.empty()) {
        return absl::UnavailableError("rmem_server closed the control connection");
      }
      if (absl::Now() > deadline) return absl::DeadlineExceededError("no reply");
    }
    if (!replies_.front().ok()) {
      const absl::Status error = replies_.front().status();
      replies_.pop_front();
      return error;
    }
    const Reply r = *replies_.front();
    replies_.pop_front();
    return r;
  }
  // Sends `cmd` (a fresh seq unless it names one) and awaits its reply, which must name it.
  absl::StatusOr<Reply> Exchange(Cmd cmd) {
    if (cmd.header.seq == 0) cmd.header.seq = ++seq_;
    const std::vector<uint8_t> bytes = cmd.Bytes();
    if (absl::Status s = Post(bytes); !s.ok()) return s;
    absl::StatusOr<Reply> r = NextReply();
    if (!r.ok()) return r;
    const bool named = bytes.size() >= sizeof(CommandHeader);
    if (r->header.seq != (named ? cmd.header.seq : 0) ||
        r->header.kind != (named ? cmd.header.kind : 0)) {
      return absl::DataLossError(
          absl::StrFormat("a reply (seq %u, kind %u) to command %u (kind %u)", r->header.seq,
                          r->header.kind, cmd.header.seq, cmd.header.kind));
    }
    return r;
  }
  // An alloc that must succeed: the region as the reply describes it.
  absl::StatusOr<RemoteRegion> Alloc(uint64_t bytes, uint64_t tag) {
    absl::StatusOr<Reply> r = Exchange(AllocCmd(bytes, tag));
    if (!r.ok()) return r.status();
    if (!r->status.ok()) return r->status;
    return RemoteRegion{r->header.c, r->header.a, r->header.d, r->header.b};
  }

  // One-sided, from or into the data area; the WR's completion status.
  CompletionStatus Write(uint64_t addr, uint32_t rkey, const void* src, uint64_t bytes) {
    if (bytes > kDataBytes) return CompletionStatus::kLocalLengthError;
    std::memcpy(data(), src, bytes);
    return OneSided(transport::Opcode::kWrite, addr, rkey, bytes);
  }
  // A WRITE_WITH_IMM: it consumes one of the server's receives without writing a command.
  CompletionStatus WriteWithImm(uint64_t addr, uint32_t rkey, uint64_t bytes) {
    if (bytes > kDataBytes) return CompletionStatus::kLocalLengthError;
    return OneSided(transport::Opcode::kWriteWithImm, addr, rkey, bytes);
  }
  CompletionStatus Read(uint64_t addr, uint32_t rkey, uint64_t bytes) {
    if (bytes > kDataBytes) return CompletionStatus::kLocalLengthError;
    return OneSided(transport::Opcode::kRead, addr, rkey, bytes);
  }
  uint8_t* data() const {
    return memory_->data() + kSendSlots * kSendSlotBytes + kMaxReplySlots * kReplyBytes;
  }

 private:
  static constexpr uint64_t kSendWr = uint64_t{1} << 32;
  static constexpr uint64_t kRecvWr = uint64_t{2} << 32;
  static constexpr uint64_t kDataWr = uint64_t{3} << 32;

  RawClient() = default;

  absl::Status Init(const transport::DeviceOptions& options) {
    absl::StatusOr<std::unique_ptr<transport::Device>> device = transport::OpenDevice(options);
    if (!device.ok()) return device.status();
    device_ = *std::move(device);
    absl::StatusOr<std::unique_ptr<transport::ProtectionDomain>> pd = device_->AllocatePd();
    if (!pd.ok()) return pd.status();
    pd_ = *std::move(pd);
    absl::StatusOr<std::unique_ptr<transport::CompletionQueue>> cq = device_->CreateCq(256);
    if (!cq.ok()) return cq.status();
    cq_ = *std::move(cq);
    absl::StatusOr<transport::SharedMemory> memory = transport::SharedMemory::Allocate(
        kSendSlots * kSendSlotBytes + kMaxReplySlots * kReplyBytes + kDataBytes, "rmem-raw");
    if (!memory.ok()) return memory.status();
    memory_ = std::make_unique<transport::SharedMemory>(*std::move(memory));
    absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> mr =
        pd_->RegisterMemory(memory_->data(), memory_->size(), transport::kLocalWrite);
    if (!mr.ok()) return mr.status();
    mr_ = *std::move(mr);
    transport::QpConfig config;
    config.type = transport::QpType::kRc;
    config.send_cq = cq_.get();
    config.recv_cq = cq_.get();
    config.max_send_wr = 2 * kSendSlots;
    config.max_recv_wr = kMaxReplySlots;
    absl::StatusOr<std::unique_ptr<transport::QueuePair>> qp = pd_->CreateQp(config);
    if (!qp.ok()) return qp.status();
    qp_ = *std::move(qp);
    return absl::OkStatus();
  }

  uint8_t* reply(uint32_t slot) const {
    return memory_->data() + kSendSlots * kSendSlotBytes + uint64_t{slot} * kReplyBytes;
  }

  absl::Status PostReceive(uint32_t slot) {
    transport::Sge sge{reinterpret_cast<uint64_t>(reply(slot)), kReplyBytes, mr_->lkey()};
    transport::RecvWr wr;
    wr.wr_id = kRecvWr | slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    transport::RecvWr* bad = nullptr;
    return qp_->PostRecv(&wr, &bad);
  }

  // Takes in what completed; whether anything did.
  bool Poll() {
    std::array<transport::Completion, 16> batch;
    const size_t n = cq_->Poll(absl::MakeSpan(batch));
    for (size_t i = 0; i < n; ++i) {
      const transport::Completion& c = batch[i];
      const uint64_t what = c.wr_id & ~uint64_t{0xffffffff};
      if (what == kDataWr) data_status_ = c.status;
      if (c.status != CompletionStatus::kSuccess) {
        if (broken_.ok()) {
          broken_ = absl::UnavailableError(
              absl::StrFormat("a work request failed: %s", transport::ToString(c.status)));
        }
        continue;
      }
      if (what != kRecvWr) continue;
      const uint32_t slot = static_cast<uint32_t>(c.wr_id);
      Reply r;
      absl::StatusOr<ReplyHeader> h = DecodeReply(reply(slot), c.byte_len, &r.status);
      if (h.ok()) {
        r.header = *h;
        replies_.push_back(std::move(r));
      } else {
        replies_.push_back(h.status());  // the server sent what no reply may be
      }
      if (absl::Status s = PostReceive(slot); !s.ok() && broken_.ok()) broken_ = s;
    }
    return n > 0;
  }

  CompletionStatus OneSided(transport::Opcode opcode, uint64_t addr, uint32_t rkey,
                            uint64_t bytes) {
    transport::Sge sge{reinterpret_cast<uint64_t>(data()), static_cast<uint32_t>(bytes),
                       mr_->lkey()};
    transport::SendWr wr;
    wr.wr_id = kDataWr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.flags = transport::kSignaled;
    wr.remote_addr = addr;
    wr.rkey = rkey;
    transport::SendWr* bad = nullptr;
    if (!qp_->PostSend(&wr, &bad).ok()) return CompletionStatus::kOtherError;
    data_status_.reset();
    const absl::Time deadline = absl::Now() + kWait;
    while (!data_status_.has_value() && absl::Now() < deadline) Poll();
    return data_status_.value_or(CompletionStatus::kOtherError);
  }

  std::unique_ptr<transport::Device> device_;
  std::unique_ptr<transport::ProtectionDomain> pd_;
  std::unique_ptr<transport::CompletionQueue> cq_;
  std::unique_ptr<transport::SharedMemory> memory_;
  std::unique_ptr<transport::MemoryRegion> mr_;
  std::unique_ptr<transport::QueuePair> qp_;
  std::unique_ptr<Channel> channel_;
  uint32_t next_send_ = 0;
  uint64_t seq_ = 0;
  std::deque<absl::StatusOr<Reply>> replies_;
  std::optional<CompletionStatus> data_status_;
  absl::Status broken_;
};

// ------------------------------------------------------------------------------ the fixture

// The whole data area and the region table's totals, as of one instant.
struct PoolImage {
  std::vector<uint8_t> data;
  uint32_t regions = 0;
  uint64_t allocated_bytes = 0;
};

// A server (max_ops kMaxOps), and a victim: a good client holding a region full of its bytes.
class HostileClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ServerOptions options = TestServer(name_);
    options.pool.max_ops = kMaxOps;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    pool_bytes_ = options.pool.pool_bytes;
    server_ = std::make_unique<ServerThread>(*std::move(server));
    address_ = absl::StrFormat("127.0.0.1:%u", server_->server().port());
    victim_ = ConnectGood();
    ASSERT_NE(victim_, nullptr);
    absl::StatusOr<RemoteRegion> region = victim_->Alloc(kRegionBytes, kVictimTag);
    ASSERT_TRUE(region.ok()) << region.status();
    victim_region_ = *region;
    ASSERT_TRUE(victim_->Put(victim_region_, 0, victim_bytes_.data(), kRegionBytes).ok());
  }

  std::unique_ptr<Client> ConnectGood(ClientCredential resume = {}) {
    ClientOptions o = TestClient(server_->server(), name_);
    o.resume = resume;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  std::unique_ptr<RawClient> OpenRaw() {
    absl::StatusOr<std::unique_ptr<RawClient>> raw = RawClient::Open(TestDevice(name_));
    EXPECT_TRUE(raw.ok()) << raw.status();
    return raw.ok() ? *std::move(raw) : nullptr;
  }

  // An attacker joined as a new identity, with its own regions A and B (kRegionBytes each,
  // filled with its patterns), or null (a failure recorded).
  std::unique_ptr<RawClient> JoinAttacker(uint32_t reply_slots = kCommandSlots) {
    std::unique_ptr<RawClient> raw = OpenRaw();
    if (raw == nullptr) return nullptr;
    if (absl::Status s = raw->Join(address_, reply_slots); !s.ok()) {
      ADD_FAILURE() << "the attacker could not join: " << s;
      return nullptr;
    }
    for (const auto& [tag, bytes] : {std::pair{kOwnA, &own_a_bytes_}, {kOwnB, &own_b_bytes_}}) {
      absl::StatusOr<RemoteRegion> region = raw->Alloc(kRegionBytes, tag);
      if (!region.ok()) {
        ADD_FAILURE() << "the attacker's alloc of tag " << tag << ": " << region.status();
        return nullptr;
      }
      own_[tag] = *region;
      if (raw->Write(region->addr, region->rkey, bytes->data(), kRegionBytes) !=
          CompletionStatus::kSuccess) {
        ADD_FAILURE() << "the attacker could not fill its own region";
        return nullptr;
      }
    }
    return raw;
  }

  // Runs `f` on the server, stopped.
  template <typename F>
  auto OnServer(F f) {
    server_->Stop();
    auto result = f(server_->server());
    server_->Start();
    return result;
  }

  PoolImage Snapshot() {
    return OnServer([](const Server& s) {
      const Pool& p = s.pool();
      return PoolImage{std::vector<uint8_t>(p.data(), p.data() + p.data_bytes()), p.stats().regions,
                       p.stats().allocated_bytes};
    });
  }

  // No byte of the data area changed since `before`, but in the regions tied to `may_change`.
  void ExpectPoolUnchanged(const PoolImage& before, std::vector<uint64_t> may_change = {}) {
    std::vector<Region> allowed;
    PoolImage now = OnServer([&](const Server& s) {
      for (uint64_t tag : may_change) {
        if (std::optional<Region> r = s.pool().FindTag(tag)) allowed.push_back(*r);
      }
      const Pool& p = s.pool();
      return PoolImage{std::vector<uint8_t>(p.data(), p.data() + p.data_bytes()), p.stats().regions,
                       p.stats().allocated_bytes};
    });
    EXPECT_EQ(now.regions, before.regions);
    EXPECT_EQ(now.allocated_bytes, before.allocated_bytes);
    for (const Region& r : allowed) {
      std::memcpy(now.data.data() + r.offset, before.data.data() + r.offset, r.bytes);
    }
    ASSERT_EQ(now.data.size(), before.data.size());
    const auto diff = std::mismatch(now.data.begin(), now.data.end(), before.data.begin());
    EXPECT_TRUE(diff.first == now.data.end())
        << "the pool's data changed at offset " << (diff.first - now.data.begin());
  }

  ServerCounters Counters() {
    return OnServer([](const Server& s) { return s.counters(); });
  }

  void WaitForClients(size_t n) {
    EXPECT_TRUE(server_->WaitFor([n](const Server& s) { return s.clients() == n; }))
        << "the server never came back to " << n << " client(s)";
  }

  // A good client joins, allocates, puts, copies and commits, gets, frees, forgets and leaves.
  void ExpectServesGoodClients() {
    std::unique_ptr<Client> c = ConnectGood();
    ASSERT_NE(c, nullptr);
    absl::StatusOr<RemoteRegion> a = c->Alloc(256, kGoodA), b = c->Alloc(256, kGoodB);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    const std::vector<uint8_t> data = Pattern(256, 0x3c);
    ASSERT_TRUE(c->Put(*a, 0, data.data(), data.size()).ok());
    ASSERT_TRUE(c->Cp(*b, 0, *a, 0, data.size()).ok());
    absl::StatusOr<TxnResult> done = c->TxnGo();
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->bytes_copied, data.size());
    std::vector<uint8_t> back(data.size());
    ASSERT_TRUE(c->Get(*b, 0, back.data(), back.size()).ok());
    EXPECT_EQ(back, data);
    ASSERT_TRUE(c->Free(*a).ok());
    ASSERT_TRUE(c->Free(*b).ok());
    absl::StatusOr<TxnResult> freed = c->TxnGo();
    ASSERT_TRUE(freed.ok()) << freed.status();
    EXPECT_EQ(freed->freed, 2u);
    EXPECT_TRUE(c->Forget().ok());
  }

  void ExpectVictimIntact() {
    std::vector<uint8_t> back(kRegionBytes);
    ASSERT_TRUE(victim_->Get(victim_region_, 0, back.data(), back.size()).ok());
    EXPECT_EQ(back, victim_bytes_) << "the victim's region changed";
  }

  // What every attack ends with: the attacker gone, good clients served, the victim intact.
  void AfterAttack() {
    WaitForClients(1);
    ExpectServesGoodClients();
    WaitForClients(1);
    ExpectVictimIntact();
  }

  std::string name_;
  std::string address_;
  uint64_t pool_bytes_ = 0;
  std::unique_ptr<ServerThread> server_;
  std::unique_ptr<Client> victim_;
  RemoteRegion victim_region_;
  const std::vector<uint8_t> victim_bytes_ = Pattern(kRegionBytes, 0x71);
  const std::vector<uint8_t> own_a_bytes_ = Pattern(kRegionBytes, 0xa0);
  const std::vector<uint8_t> own_b_bytes_ = Pattern(kRegionBytes, 0xb0);
  std::map<uint64_t, RemoteRegion> own_;  // the last attacker's regions, by tag
};

// ------------------------------------------------------------------------------ commands

struct CommandCase {
  std::string name;
  std::vector<Cmd> commands;  // sent in order, each awaited: all but the last are accepted
  absl::StatusCode want;      // the last one's refusal
};

std::vector<CommandCase> CommandCases(uint64_t pool_bytes) {
  using absl::StatusCode;
  const WireOp good = CopyOp(kOwnA, 0, kOwnB, 0, 64);
  const std::vector<WireOp> full(kMaxOpsPerCommand, good);  // a receive buffer's worth
  auto length = [](size_t n) { return [n](Cmd& c) { c.length = n; }; };
  auto ops = [](uint16_t n) { return [n](Cmd& c) { c.header.ops = n; }; };
  auto kind = [](uint16_t k) { return [k](Cmd& c) { c.header.kind = k; }; };
  auto op_kind = [](uint32_t k) { return [k](WireOp& op) { op.kind = k; }; };
  return {
      // Malformed (DecodeCommand): InvalidArgument, whatever the rest says.
      {"an empty SEND", {With(QueueCmd(), length(0))}, StatusCode::kInvalidArgument},
      {"a 1-byte command", {With(QueueCmd(), length(1))}, StatusCode::kInvalidArgument},
      {"a header cut short (31 bytes)",
       {With(QueueCmd(), length(sizeof(CommandHeader) - 1))},
       StatusCode::kInvalidArgument},
      {"2 ops claimed, 1 sent", {With(QueueCmd({good}), ops(2))}, StatusCode::kInvalidArgument},
      {"1 op claimed, 2 sent",
       {With(QueueCmd({good, good}), ops(1))},
       StatusCode::kInvalidArgument},
      {"no op claimed, 1 sent", {With(QueueCmd({good}), ops(0))}, StatusCode::kInvalidArgument},
      {"an op cut short",
       {With(QueueCmd({good}), length(sizeof(CommandHeader) + sizeof(WireOp) - 1))},
       StatusCode::kInvalidArgument},
      {"kMaxOpsPerCommand + 1 ops claimed in a full buffer",
       {With(QueueCmd(full), ops(kMaxOpsPerCommand + 1))},
       StatusCode::kInvalidArgument},
      {"65535 ops claimed", {With(QueueCmd(full), ops(0xffff))}, StatusCode::kInvalidArgument},
      {"command kind 0", {With(QueueCmd(), kind(0))}, StatusCode::kInvalidArgument},
      {"command kind 5", {With(QueueCmd(), kind(5))}, StatusCode::kInvalidArgument},
      {"command kind 0xffff", {With(QueueCmd(), kind(0xffff))}, StatusCode::kInvalidArgument},
      {"a non-zero reserved field",
       {With(QueueCmd({good}), [](Cmd& c) { c.header.zero = 1; })},
       StatusCode::kInvalidArgument},
      {"a txn_go with its reserved field set",
       {With(GoCmd(1, {good}), [](Cmd& c) { c.header.zero = 0x80000000; })},
       StatusCode::kInvalidArgument},
      {"an op of kind 0", {QueueCmd({With(good, op_kind(0))})}, StatusCode::kInvalidArgument},
      {"an op of kind 3", {QueueCmd({With(good, op_kind(3))})}, StatusCode::kInvalidArgument},
      {"an op of kind ~0",
       {QueueCmd({With(good, op_kind(0xffffffff))})},
       StatusCode::kInvalidArgument},
      {"an op's reserved field set",
       {QueueCmd({With(good, [](WireOp& op) { op.zero = 1; })})},
       StatusCode::kInvalidArgument},
      {"a bad op after five good ones (none of them kept)",
       {QueueCmd({good, good, good, good, good, With(good, op_kind(7))})},
       StatusCode::kInvalidArgument},
      {"a free with a source offset",
       {QueueCmd({With(FreeOp(kOwnA), [](WireOp& op) { op.src_offset = 64; })})},
       StatusCode::kInvalidArgument},
      {"a free with a destination tag",
       {QueueCmd({With(FreeOp(kOwnA), [](WireOp& op) { op.dst_tag = kOwnB; })})},
       StatusCode::kInvalidArgument},
      {"a free with a destination offset",
       {QueueCmd({With(FreeOp(kOwnA), [](WireOp& op) { op.dst_offset = 1; })})},
       StatusCode::kInvalidArgument},
      {"a free with a length",
       {GoCmd(1, {With(FreeOp(kOwnA), [](WireOp& op) { op.bytes = kRegionBytes; })})},
       StatusCode::kInvalidArgument},
      {"an alloc that carries an op",
       {With(AllocCmd(64, 0x77),
             [&](Cmd& c) {
               c.ops = {good};
               c.header.ops = 1;
             })},
       StatusCode::kInvalidArgument},
      {"an alloc that claims an op it does not carry",
       {With(AllocCmd(64, 0x77), ops(1))},
       StatusCode::kInvalidArgument},
      {"a forget that carries an op",
       {With(ForgetCmd(),
             [&](Cmd& c) {
               c.ops = {FreeOp(kVictimTag)};
               c.header.ops = 1;
             })},
       StatusCode::kInvalidArgument},

      // Alloc (Pool::Alloc).
      {"an alloc of tag 0", {AllocCmd(64, 0)}, StatusCode::kInvalidArgument},
      {"an alloc of 0 bytes", {AllocCmd(0, 0x77)}, StatusCode::kInvalidArgument},
      {"an alloc past the pool", {AllocCmd(pool_bytes + 1, 0x77)}, StatusCode::kInvalidArgument},
      {"an alloc of ~0 bytes", {AllocCmd(~uint64_t{0}, 0x77)}, StatusCode::kInvalidArgument},
      {"an alloc of ~0 bytes at tag ~0",
       {AllocCmd(~uint64_t{0}, ~uint64_t{0})},
       StatusCode::kInvalidArgument},
      {"an alloc of the whole pool (no room left)",
       {AllocCmd(pool_bytes, 0x77)},
       StatusCode::kResourceExhausted},
      {"the victim's tag with another size",
       {AllocCmd(2 * kRegionBytes, kVictimTag)},
       StatusCode::kFailedPrecondition},
      {"its own tag with another size", {AllocCmd(64, kOwnA)}, StatusCode::kFailedPrecondition},

      // Copies: bounds and grants (Server::Translate), overlaps (Pool::Validate).
      {"a source offset of ~0",
       {QueueCmd({CopyOp(kOwnA, ~uint64_t{0}, kOwnB, 0, 64)}), GoCmd(1)},
       StatusCode::kOutOfRange},
      {"a destination offset of ~0",
       {GoCmd(1, {CopyOp(kOwnA, 0, kOwnB, ~uint64_t{0}, 64)})},
       StatusCode::kOutOfRange},
      {"a length of ~0",
       {GoCmd(1, {CopyOp(kOwnA, 0, kOwnB, 0, ~uint64_t{0})})},
       StatusCode::kOutOfRange},
      {"a source offset + length that wraps",
       {GoCmd(1, {CopyOp(kOwnA, ~uint64_t{0} - 63, kOwnB, 0, 128)})},
       StatusCode::kOutOfRange},
      {"a destination offset + length that wraps",
       {GoCmd(1, {CopyOp(kOwnA, 0, kOwnB, ~uint64_t{0} - 63, 128)})},
       StatusCode::kOutOfRange},
      {"offset + length exactly 2^64 (wraps to 0)",
       {GoCmd(1, {CopyOp(kOwnA, 64, kOwnB, 64, ~uint64_t{0} - 63)})},
       StatusCode::kOutOfRange},
      {"one byte past the source's end",
       {GoCmd(1, {CopyOp(kOwnA, kRegionBytes - 63, kOwnB, 0, 64)})},
       StatusCode::kOutOfRange},
      {"one byte past the destination's end",
       {GoCmd(1, {CopyOp(kOwnA, 0, kOwnB, kRegionBytes - 63, 64)})},
       StatusCode::kOutOfRange},
      {"a copy longer than its regions",
       {GoCmd(1, {CopyOp(kOwnA, 0, kOwnB, 0, kRegionBytes + 1)})},
       StatusCode::kOutOfRange},
      {"a copy of zero bytes",
       {GoCmd(1, {CopyOp(kOwnA, 0, kOwnB, 0, 0)})},
       StatusCode::kOutOfRange},
      {"a copy from the victim's region",
       {QueueCmd({CopyOp(kVictimTag, 0, kOwnB, 0, 64)}), GoCmd(1)},
       StatusCode::kPermissionDenied},
      {"a copy onto the victim's region",
       {GoCmd(1, {CopyOp(kOwnA, 0, kVictimTag, 0, 64)})},
       StatusCode::kPermissionDenied},
      {"a copy from a tag never allocated",
       {GoCmd(1, {CopyOp(kUnknownTag, 0, kOwnB, 0, 64)})},
       StatusCode::kPermissionDenied},
      {"a copy from tag 0",
       {GoCmd(1, {CopyOp(0, 0, kOwnB, 0, 64)})},
       StatusCode::kPermissionDenied},
      {"a good copy, then one onto the victim's region (nothing applied)",
       {QueueCmd({good}), GoCmd(1, {CopyOp(kOwnA, 0, kVictimTag, 0, kRegionBytes)})},
       StatusCode::kPermissionDenied},
      {"overlapping destinations",
       {GoCmd(1, {CopyOp(kOwnA, 0, kOwnB, 0, 128), CopyOp(kOwnA, 1024, kOwnB, 64, 128)})},
       StatusCode::kInvalidArgument},
      {"the same destination twice", {GoCmd(1, {good, good})}, StatusCode::kInvalidArgument},
      {"a destination overlapping its own source",
       {GoCmd(1, {CopyOp(kOwnA, 0, kOwnA, 64, 128)})},
       StatusCode::kInvalidArgument},
      {"a destination overlapping another copy's source",
       {QueueCmd({CopyOp(kOwnA, 0, kOwnB, 0, 64)}), GoCmd(1, {CopyOp(kOwnB, 32, kOwnA, 1024, 64)})},
       StatusCode::kInvalidArgument},

      // Frees.
      {"a free of a tag never allocated",
       {GoCmd(1, {FreeOp(kUnknownTag)})},
       StatusCode::kPermissionDenied},
      {"a free of the victim's region",
       {GoCmd(1, {FreeOp(kVictimTag)})},
       StatusCode::kPermissionDenied},
      {"a free of tag 0", {GoCmd(1, {FreeOp(0)})}, StatusCode::kPermissionDenied},
      {"a double free in one command",
       {GoCmd(1, {FreeOp(kOwnA), FreeOp(kOwnA)})},
       StatusCode::kInvalidArgument},
      {"a double free across batches",
       {QueueCmd({FreeOp(kOwnA)}), GoCmd(1, {FreeOp(kOwnA)})},
       StatusCode::kInvalidArgument},

      // Transactions.
      {"a txn_go with nothing queued", {GoCmd(1)}, StatusCode::kFailedPrecondition},
      {"txn id 0", {GoCmd(0, {good})}, StatusCode::kInvalidArgument},
      {"max_ops + 1 ops in one command",
       {QueueCmd(std::vector<WireOp>(kMaxOps + 1, good))},
       StatusCode::kResourceExhausted},
      {"max_ops queued, then one more with txn_go",
       {QueueCmd(std::vector<WireOp>(kMaxOps, good)), GoCmd(1, {good})},
       StatusCode::kResourceExhausted},
      {"max_ops + 1 over three batches",
       {QueueCmd(std::vector<WireOp>(kMaxOps / 2, good)),
        QueueCmd(std::vector<WireOp>(kMaxOps / 2, good)), QueueCmd({good})},
       StatusCode::kResourceExhausted},

      // Forget.
      {"a forget twice", {ForgetCmd(), ForgetCmd()}, StatusCode::kUnauthenticated},
      {"a txn_go after forget", {ForgetCmd(), GoCmd(1, {good})}, StatusCode::kFailedPrecondition},
  };
}

// Every malformed or forbidden command is refused with its code, changes nothing, ends the open
// transaction (nothing stays queued) and leaves the attacker's session usable.
TEST_F(HostileClientTest, MalformedAndForbiddenCommandsAreRefusedAndChangeNothing) {
  for (const CommandCase& c : CommandCases(pool_bytes_)) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<RawClient> attacker = JoinAttacker();
    ASSERT_NE(attacker, nullptr);
    const PoolImage before = Snapshot();
    for (size_t i = 0; i < c.commands.size(); ++i) {
      absl::StatusOr<Reply> r = attacker->Exchange(c.commands[i]);
      ASSERT_TRUE(r.ok()) << "command " << i << ": " << r.status();
      const bool last = i + 1 == c.commands.size();
      EXPECT_EQ(r->status.code(), last ? c.want : absl::StatusCode::kOk)
          << "command " << i << ": " << r->status;
    }
    absl::StatusOr<Reply> ping = attacker->Exchange(QueueCmd());
    ASSERT_TRUE(ping.ok()) << ping.status();
    EXPECT_TRUE(ping->status.ok()) << ping->status;
    EXPECT_EQ(ping->header.a, 0u) << "ops stayed queued after a refusal";
    ExpectPoolUnchanged(before);
    attacker.reset();
    AfterAttack();
  }
}

// Transaction ids must increase: an older id is refused and applies nothing; the last id again
// is answered as it was the first time (applied: a duplicate; refused: the same refusal) and
// never applied again, whatever is queued with it.
TEST_F(HostileClientTest, TxnIdsGoingBackwardsAreRefusedAndRetriesAreAnsweredNotApplied) {
  std::unique_ptr<RawClient> attacker = JoinAttacker();
  ASSERT_NE(attacker, nullptr);
  const RemoteRegion a = own_[kOwnA], b = own_[kOwnB];
  const PoolImage before = Snapshot();
  auto b_holds = [&](const std::vector<uint8_t>& want) {
    EXPECT_EQ(attacker->Read(b.addr, b.rkey, kRegionBytes), CompletionStatus::kSuccess);
    return std::equal(want.begin(), want.end(), attacker->data());
  };
  auto expect = [&](const Cmd& cmd, absl::StatusCode code) -> ReplyHeader {
    absl::StatusOr<Reply> r = attacker->Exchange(cmd);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return ReplyHeader{};
    EXPECT_EQ(r->status.code(), code) << r->status;
    return r->header;
  };
  const WireOp a_to_b = CopyOp(kOwnA, 0, kOwnB, 0, kRegionBytes);

  ReplyHeader h = expect(GoCmd(10, {a_to_b}), absl::StatusCode::kOk);
  EXPECT_EQ(h.a, kRegionBytes);
  EXPECT_EQ(h.b, 10u);
  EXPECT_EQ(h.e, 0u);
  EXPECT_TRUE(b_holds(own_a_bytes_));
  const std::vector<uint8_t> later = Pattern(kRegionBytes, 0xee);
  ASSERT_EQ(attacker->Write(a.addr, a.rkey, later.data(), later.size()),
            CompletionStatus::kSuccess);

  expect(GoCmd(9, {a_to_b}), absl::StatusCode::kFailedPrecondition);
  expect(GoCmd(9), absl::StatusCode::kFailedPrecondition);
  expect(GoCmd(1), absl::StatusCode::kFailedPrecondition);
  h = expect(GoCmd(10), absl::StatusCode::kOk);  // the retry
  EXPECT_EQ(h.e, 1u) << "a retry must be answered as a duplicate";
  EXPECT_EQ(h.a, 0u);
  h = expect(GoCmd(10, {a_to_b}), absl::StatusCode::kOk);  // a retry with new ops: not applied
  EXPECT_EQ(h.e, 1u);
  EXPECT_EQ(expect(QueueCmd(), absl::StatusCode::kOk).a, 0u);
  EXPECT_TRUE(b_holds(own_a_bytes_)) << "an older or retried id applied a copy";

  // A refused id is answered the same again, even with good ops queued.
  expect(GoCmd(11, {CopyOp(kOwnA, 0, kOwnA, 64, 128)}), absl::StatusCode::kInvalidArgument);
  expect(GoCmd(11), absl::StatusCode::kInvalidArgument);
  expect(GoCmd(11, {a_to_b}), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(b_holds(own_a_bytes_));

  // The session goes on with the next id.
  h = expect(GoCmd(12, {a_to_b}), absl::StatusCode::kOk);
  EXPECT_EQ(h.e, 0u);
  EXPECT_TRUE(b_holds(later));
  ExpectPoolUnchanged(before, {kOwnA, kOwnB});
  attacker.reset();
  AfterAttack();
}

// ------------------------------------------------------------------------------ control

struct ControlCase {
  std::string name;
  // What goes out on a fresh connection: a message of `type` whose payload is made from a
  // well-formed hello naming the attacker's QP, or (raw) these bytes as they are.
  std::function<std::vector<uint8_t>(const RmemHello& hello)> payload;
  uint16_t type;
  bool raw;
  std::optional<absl::StatusCode> want;  // the refusal's code; none: closed without a word
  bool shm_only;                         // the code comes from the shm fabric's QP connect
};

TEST_F(HostileClientTest, BadControlMessagesAreRefusedAndCreateNoSession) {
  auto hello_with = [](auto edit) {
    return [edit](const RmemHello& good) {
      RmemHello h = good;
      edit(h);
      return Encode(h);
    };
  };
  auto bytes = [](std::vector<uint8_t> b) { return [b](const RmemHello&) { return b; }; };
  const std::vector<ControlCase> cases = {
      {"an empty hello", bytes({}), kRmemHello, false, absl::StatusCode::kDataLoss, false},
      {"a garbage hello", bytes({1, 2, 3, 4, 5, 6, 7}), kRmemHello, false,
       absl::StatusCode::kDataLoss, false},
      {"a hello cut short",
       [](const RmemHello& good) {
         std::vector<uint8_t> b = Encode(good);
         b.pop_back();
         return b;
       },
       kRmemHello, false, absl::StatusCode::kDataLoss, false},
      {"a hello with a trailing byte",
       [](const RmemHello& good) {
         std::vector<uint8_t> b = Encode(good);
         b.push_back(0);
         return b;
       },
       kRmemHello, false, absl::StatusCode::kDataLoss, false},
      {"protocol version 0", hello_with([](RmemHello& h) { h.version = 0; }), kRmemHello, false,
       absl::StatusCode::kFailedPrecondition, false},
      {"protocol version 2", hello_with([](RmemHello& h) { h.version = 2; }), kRmemHello, false,
       absl::StatusCode::kFailedPrecondition, false},
      {"protocol version ~0", hello_with([](RmemHello& h) { h.version = ~0u; }), kRmemHello, false,
       absl::StatusCode::kFailedPrecondition, false},
      {"a resume with a made-up id and secret", hello_with([](RmemHello& h) {
         h.resume = {0x0123456789abcdef, 0xfedcba9876543210};
       }),
       kRmemHello, false, absl::StatusCode::kUnauthenticated, false},
      {"a welcome sent to the server", bytes({}), kRmemWelcome, false,
       absl::StatusCode::kInvalidArgument, false},
      {"an error sent to the server", bytes(EncodeError(absl::InternalError("x"))), kRmemError,
       false, absl::StatusCode::kInvalidArgument, false},
      {"message type 0x7777", bytes({0}), 0x7777, false, absl::StatusCode::kInvalidArgument, false},
      {"a hello naming no QP", hello_with([](RmemHello& h) { h.qp = {}; }), kRmemHello, false,
       absl::StatusCode::kInvalidArgument, true},
      {"a hello naming a QP that does not exist",
       hello_with([](RmemHello& h) { h.qp.qp_num ^= 0x5a5a; }), kRmemHello, false,
       absl::StatusCode::kNotFound, true},
      {"a frame with a bad magic",
       bytes(Frame(0x58585858, transport::control::kControlVersion, kRmemHello, 0)), 0, true,
       std::nullopt, false},
      {"a frame of another version",
       bytes(Frame(transport::control::kControlMagic, 2, kRmemHello, 0)), 0, true, std::nullopt,
       false},
      {"a frame claiming 4 GiB",
       bytes(Frame(transport::control::kControlMagic, transport::control::kControlVersion,
                   kRmemHello, ~0u)),
       0, true, std::nullopt, false},
      {"a frame claiming more than a pending connection may send",
       bytes(Frame(transport::control::kControlMagic, transport::control::kControlVersion,
                   kRmemHello, (64 << 10) + 1)),
       0, true, std::nullopt, false},
  };
  const bool shm =
      std::getenv("HERD_VERBS_DEVICE") == nullptr || *std::getenv("HERD_VERBS_DEVICE") == 0;
  for (const ControlCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<RawClient> attacker = OpenRaw();
    ASSERT_NE(attacker, nullptr);
    ASSERT_TRUE(attacker->Dial(address_).ok());
    const std::vector<uint8_t> payload = c.payload(attacker->Hello());
    ControlAnswer answer;
    if (c.raw) {
      ASSERT_TRUE(SendRaw(*attacker->channel(), payload));
      answer = ReadAnswer(*attacker->channel());
    } else {
      answer = attacker->Control(c.type, payload);
    }
    // On verbs a QP connects to any QP number (nothing is checked until traffic flows): such a
    // hello is welcomed, and its session ends with its connection.
    if (shm || !c.shm_only) {
      EXPECT_FALSE(answer.welcome.has_value()) << "welcomed";
    }
    if (!c.want.has_value()) {
      EXPECT_TRUE(answer.closed) << answer.refusal;
    } else if (shm || !c.shm_only) {
      EXPECT_EQ(answer.refusal.code(), *c.want) << answer.refusal;
      // The refusal is the last word: the connection closes.
      EXPECT_EQ(attacker->channel()->Receive(kWait).status().code(),
                absl::StatusCode::kUnavailable);
    }
    attacker.reset();
    AfterAttack();
  }
}

// A hello on a connection that has its session already: refused, and the session ends (its QP
// with it).
TEST_F(HostileClientTest, ASecondHelloEndsTheSession) {
  std::unique_ptr<RawClient> attacker = JoinAttacker();
  ASSERT_NE(attacker, nullptr);
  WaitForClients(2);
  const PoolImage before = Snapshot();
  ControlAnswer answer = attacker->Control(kRmemHello, Encode(attacker->Hello()));
  EXPECT_FALSE(answer.welcome.has_value());
  EXPECT_EQ(answer.refusal.code(), absl::StatusCode::kInvalidArgument) << answer.refusal;
  EXPECT_EQ(attacker->channel()->Receive(kWait).status().code(), absl::StatusCode::kUnavailable);
  WaitForClients(1);
  EXPECT_FALSE(attacker->Exchange(GoCmd(1, {CopyOp(kOwnA, 0, kOwnB, 0, 64)})).ok())
      << "a session that ended still answers";
  ExpectPoolUnchanged(before);
  attacker.reset();
  AfterAttack();
}

// A forged resume of a client that left is Unauthenticated and leaves its identity intact.
TEST_F(HostileClientTest, AForgedResumeIsUnauthenticatedAndLeavesTheIdentityAlone) {
  std::unique_ptr<Client> carol = ConnectGood();
  ASSERT_NE(carol, nullptr);
  RemoteRegion a = *carol->Alloc(64, 0xca1), b = *carol->Alloc(64, 0xca2);
  ASSERT_TRUE(carol->Cp(b, 0, a, 0, 64).ok());
  absl::StatusOr<TxnResult> done = carol->TxnGo();
  ASSERT_TRUE(done.ok()) << done.status();
  const ClientCredential carols = carol->credential();
  carol.reset();
  WaitForClients(1);
  for (const ClientCredential forged :
       {ClientCredential{carols.id, carols.secret ^ 1}, ClientCredential{carols.id, 0},
        ClientCredential{carols.id + 1, carols.secret}}) {
    std::unique_ptr<RawClient> attacker = OpenRaw();
    ASSERT_NE(attacker, nullptr);
    ASSERT_TRUE(attacker->Dial(address_).ok());
    ControlAnswer answer = attacker->Control(kRmemHello, Encode(attacker->Hello(forged)));
    EXPECT_FALSE(answer.welcome.has_value());
    EXPECT_EQ(answer.refusal.code(), absl::StatusCode::kUnauthenticated) << answer.refusal;
  }
  AfterAttack();
  // The real carol is still herself: resumed, her last transaction remembered.
  std::unique_ptr<Client> again = ConnectGood(carols);
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(again->resumed());
  EXPECT_EQ(again->last_txn(), done->txn_id);
}

// Found by this test (then fixed): a resume naming a connected client's id was refused as
// "connected already" before its secret was checked, telling any peer that knew an id whether
// that client was connected.
TEST_F(HostileClientTest, AForgedResumeOfAConnectedClientIsUnauthenticated) {
  const ClientCredential victim = victim_->credential();
  for (const ClientCredential forged :
       {ClientCredential{victim.id, victim.secret ^ 1}, ClientCredential{victim.id, 0}}) {
    std::unique_ptr<RawClient> attacker = OpenRaw();
    ASSERT_NE(attacker, nullptr);
    ASSERT_TRUE(attacker->Dial(address_).ok());
    ControlAnswer answer = attacker->Control(kRmemHello, Encode(attacker->Hello(forged)));
    EXPECT_FALSE(answer.welcome.has_value());
    EXPECT_EQ(answer.refusal.code(), absl::StatusCode::kUnauthenticated) << answer.refusal;
  }
  AfterAttack();
}

// Connections that never finish a hello (silent, half a frame header, a header whose payload
// never comes, and more of them than the server keeps pending) do not keep a good client out.
TEST_F(HostileClientTest, ConnectionsThatNeverSayHelloDoNotKeepAGoodClientOut) {
  std::vector<Channel> idle;
  auto dial = [&]() -> Channel* {
    absl::StatusOr<Channel> c = Channel::Connect(address_, kWait);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    idle.push_back(*std::move(c));
    return &idle.back();
  };
  ASSERT_NE(dial(), nullptr);  // silent
  const std::vector<uint8_t> header =
      Frame(transport::control::kControlMagic, transport::control::kControlVersion, kRmemHello, 46);
  Channel* half = dial();
  ASSERT_NE(half, nullptr);
  ASSERT_TRUE(SendRaw(*half, std::vector<uint8_t>(header.begin(), header.begin() + 6)));
  Channel* promised = dial();
  ASSERT_NE(promised, nullptr);
  ASSERT_TRUE(SendRaw(*promised, header));
  idle.reserve(idle.size() + 2 * 32);  // more than max_clients (TestServer), the pending limit
  for (int i = 0; i < 2 * 32; ++i) ASSERT_NE(dial(), nullptr);
  const absl::Time start = absl::Now();
  ExpectServesGoodClients();
  EXPECT_LT(absl::Now() - start, kHelloTimeout / 2) << "a good client waited for idle ones";
  idle.clear();
  AfterAttack();
}

// ------------------------------------------------------------------------------ the fabric

// One-sided accesses outside the attacker's own regions: refused by the fabric (the attacker's
// QP fails), nothing written, nothing read.
TEST_F(HostileClientTest, OneSidedAccessOutsideItsRegionsFailsAndChangesNothing) {
  struct Access {
    std::string name;
    bool write;
    std::function<std::pair<uint64_t, uint32_t>(const RemoteRegion& own)> target;
    uint64_t bytes;
  };
  const RemoteRegion v = victim_region_;
  const std::vector<Access> accesses = {
      {"a WRITE with the victim's address and rkey", true,
       [v](const RemoteRegion&) {
         return std::pair{v.addr, v.rkey};
       },
       64},
      {"a READ with the victim's address and rkey", false,
       [v](const RemoteRegion&) {
         return std::pair{v.addr, v.rkey};
       },
       64},
      {"a WRITE of the victim's address with its own rkey", true,
       [v](const RemoteRegion& own) {
         return std::pair{v.addr, own.rkey};
       },
       64},
      {"a READ of the victim's address with its own rkey", false,
       [v](const RemoteRegion& own) {
         return std::pair{v.addr, own.rkey};
       },
       64},
      {"a WRITE of the line before its region", true,
       [](const RemoteRegion& own) {
         return std::pair{own.addr - 64, own.rkey};
       },
       64},
      {"a WRITE across its region's end", true,
       [](const RemoteRegion& own) {
         return std::pair{own.addr + own.bytes - 32, own.rkey};
       },
       64},
      {"a WRITE longer than its region", true,
       [](const RemoteRegion& own) {
         return std::pair{own.addr, own.rkey};
       },
       kRegionBytes + 64},
      {"a WRITE at an address that wraps", true,
       [](const RemoteRegion& own) {
         return std::pair{~uint64_t{0} - 31, own.rkey};
       },
       64},
      {"a WRITE with rkey 0", true,
       [v](const RemoteRegion&) {
         return std::pair{v.addr, uint32_t{0}};
       },
       64},
      {"a WRITE with a guessed rkey", true,
       [v](const RemoteRegion& own) {
         return std::pair{v.addr, own.rkey + 1};
       },
       64},
  };
  for (const Access& access : accesses) {
    SCOPED_TRACE(access.name);
    std::unique_ptr<RawClient> attacker = JoinAttacker();
    ASSERT_NE(attacker, nullptr);
    const PoolImage before = Snapshot();
    const auto [addr, rkey] = access.target(own_[kOwnA]);
    const std::vector<uint8_t> junk(access.bytes, 0xee);
    CompletionStatus status;
    if (access.write) {
      status = attacker->Write(addr, rkey, junk.data(), junk.size());
    } else {
      std::memset(attacker->data(), 0xee, access.bytes);
      status = attacker->Read(addr, rkey, access.bytes);
      EXPECT_TRUE(std::equal(junk.begin(), junk.end(), attacker->data())) << "it read something";
    }
    EXPECT_NE(status, CompletionStatus::kSuccess);
    EXPECT_FALSE(attacker->Exchange(QueueCmd()).ok()) << "its QP should have failed";
    ExpectPoolUnchanged(before);
    attacker.reset();
    AfterAttack();
  }
}

// More commands than the server keeps receives for, without waiting for replies: the flooder
// gets at most one answer per command (fewer when it has no receive for one: the server gives up
// on it), in order; the server goes on serving everyone else.
TEST_F(HostileClientTest, AFloodOfCommandsPastTheReceivesStallsOnlyTheFlooder) {
  constexpr uint32_t kFlood = kCommandSlots + 6;
  for (const uint32_t reply_slots : {RawClient::kMaxReplySlots, kCommandSlots, 0u}) {
    SCOPED_TRACE(absl::StrFormat("%u receives posted for replies", reply_slots));
    std::unique_ptr<RawClient> flooder = OpenRaw();
    ASSERT_NE(flooder, nullptr);
    ASSERT_TRUE(flooder->Join(address_, reply_slots).ok());
    const PoolImage before = Snapshot();
    for (uint32_t i = 0; i < kFlood; ++i) {
      Cmd cmd = QueueCmd({CopyOp(kOwnA, 64 * i, kOwnB, 64 * i, 64)});
      cmd.header.seq = 1000 + i;
      ASSERT_TRUE(flooder->Post(cmd.Bytes()).ok());
    }
    std::vector<Reply> replies;
    while (replies.size() < kFlood) {
      absl::StatusOr<Reply> r = flooder->NextReply();
      if (!r.ok()) break;  // the connection broke (or, on verbs, no receive took a reply)
      replies.push_back(*std::move(r));
    }
    EXPECT_LE(replies.size(), kFlood);
    if (reply_slots >= kFlood) {
      EXPECT_EQ(replies.size(), kFlood) << "a flooder that keeps receives posted is owed all";
    }
    if (reply_slots == 0) {
      EXPECT_EQ(replies.size(), 0u) << "answers without a receive";
    }
    for (size_t i = 0; i < replies.size(); ++i) {
      EXPECT_EQ(replies[i].header.seq, 1000 + i) << "answers out of order or twice";
      EXPECT_TRUE(replies[i].status.ok()) << replies[i].status;
      EXPECT_EQ(replies[i].header.a, i + 1) << "ops queued";
    }
    flooder.reset();
    ExpectPoolUnchanged(before);
    AfterAttack();
  }
}

// Found by this test (then fixed): with the default RNR retries, a reply to a client with no
// receive posted waited inside the server thread's PostSend on the shm fabric (about 1 s per
// reply, every client stalled). The server's QPs now take no RNR retries: such a client loses
// its session at once.
TEST_F(HostileClientTest, AClientThatPostsNoReceivesStallsOnlyItself) {
  constexpr uint64_t kTag = 0x600d2;
  std::unique_ptr<Client> good = ConnectGood();
  ASSERT_NE(good, nullptr);
  absl::StatusOr<RemoteRegion> region = good->Alloc(64, kTag);
  ASSERT_TRUE(region.ok()) << region.status();
  std::atomic<bool> done{false};
  std::atomic<int64_t> worst_us{0};
  std::thread timer([&] {
    while (!done.load()) {
      const absl::Time start = absl::Now();
      if (!good->Alloc(64, kTag).ok()) return;
      worst_us = std::max<int64_t>(worst_us.load(), absl::ToInt64Microseconds(absl::Now() - start));
    }
  });
  for (int round = 0; round < 2; ++round) {
    std::unique_ptr<RawClient> mute = OpenRaw();
    if (mute == nullptr || !mute->Join(address_, /*reply_slots=*/0).ok() ||
        !mute->Post(QueueCmd().Bytes()).ok()) {
      ADD_FAILURE() << "the mute client could not join and send";
      break;
    }
    EXPECT_FALSE(mute->NextReply().ok());  // until its connection broke
  }
  done = true;
  timer.join();
  EXPECT_LT(absl::Microseconds(worst_us.load()), absl::Milliseconds(250))
      << "a good client's alloc waited for a client that reads no replies";
  ASSERT_TRUE(good->Free(*region).ok());
  ASSERT_TRUE(good->TxnGo().ok());
  good.reset();
  AfterAttack();
}

// A SEND longer than the server's receive buffers breaks the sender's QP pair only: the server
// drops that session and serves the others.
TEST_F(HostileClientTest, ACommandLongerThanAReceiveEndsOnlyItsSendersSession) {
  std::unique_ptr<RawClient> attacker = JoinAttacker();
  ASSERT_NE(attacker, nullptr);
  const PoolImage before = Snapshot();
  const uint64_t left = Counters().left;
  ASSERT_TRUE(attacker
                  ->Post(With(QueueCmd({CopyOp(kOwnA, 0, kOwnB, 0, 64)}),
                              [](Cmd& c) { c.length = kCommandBytes + 1; })
                             .Bytes())
                  .ok());
  EXPECT_FALSE(attacker->NextReply().ok());
  EXPECT_TRUE(server_->WaitFor([&](const Server& s) { return s.counters().left == left + 1; }));
  EXPECT_EQ(attacker->channel()->Receive(kWait).status().code(), absl::StatusCode::kUnavailable)
      << "the server should close the session's control connection";
  ExpectPoolUnchanged(before);
  attacker.reset();
  AfterAttack();
}

// ------------------------------------------------------------------------------ departures

// A client that closes its control connection with ops queued: they are discarded (counted), not
// applied, and its QP reaches nothing any more.
TEST_F(HostileClientTest, AClientThatLeavesWithOpsQueuedHasThemDiscarded) {
  std::unique_ptr<RawClient> attacker = JoinAttacker();
  ASSERT_NE(attacker, nullptr);
  const PoolImage before = Snapshot();
  absl::StatusOr<Reply> queued = attacker->Exchange(
      QueueCmd({CopyOp(kOwnA, 0, kOwnB, 0, 64), CopyOp(kOwnA, 64, kOwnB, 64, 64), FreeOp(kOwnA)}));
  ASSERT_TRUE(queued.ok()) << queued.status();
  ASSERT_TRUE(queued->status.ok()) << queued->status;
  EXPECT_EQ(queued->header.a, 3u);
  const ServerCounters counters = Counters();
  attacker->CloseControl();
  EXPECT_TRUE(server_->WaitFor([&](const Server& s) {
    return s.counters().ops_discarded == counters.ops_discarded + 3 &&
           s.counters().left == counters.left + 1;
  })) << "ops_discarded "
      << Counters().ops_discarded << ", was " << counters.ops_discarded;
  EXPECT_FALSE(attacker->Exchange(GoCmd(1)).ok()) << "a session that ended still answers";
  ExpectPoolUnchanged(before);
  attacker.reset();
  AfterAttack();
}

// ------------------------------------------------------------------------------ findings

// A region freed by one client and allocated by another: the new owner must not read the old
// owner's bytes.
// Found by this test (then fixed): a new region's extent was handed out as its previous owner
// left it. Pool::Alloc now zeroes it.
TEST_F(HostileClientTest, AFreedRegionDoesNotLeakItsBytesToTheNextOwner) {
  std::unique_ptr<Client> alice = ConnectGood();
  ASSERT_NE(alice, nullptr);
  absl::StatusOr<RemoteRegion> secret = alice->Alloc(kRegionBytes, 0x5ec);
  ASSERT_TRUE(secret.ok()) << secret.status();
  const uint64_t offset = OnServer([](const Server& s) { return s.pool().FindTag(0x5ec)->offset; });
  const std::vector<uint8_t> secret_bytes = Pattern(kRegionBytes, 0x5e);
  ASSERT_TRUE(alice->Put(*secret, 0, secret_bytes.data(), kRegionBytes).ok());
  ASSERT_TRUE(alice->Free(*secret).ok());
  ASSERT_TRUE(alice->TxnGo().ok());
  std::unique_ptr<RawClient> attacker = OpenRaw();
  ASSERT_NE(attacker, nullptr);
  ASSERT_TRUE(attacker->Join(address_).ok());
  absl::StatusOr<RemoteRegion> fresh = attacker->Alloc(kRegionBytes, 0xf7e5);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_EQ(OnServer([](const Server& s) { return s.pool().FindTag(0xf7e5)->offset; }), offset)
      << "first fit should hand out the freed extent again";
  ASSERT_EQ(attacker->Read(fresh->addr, fresh->rkey, kRegionBytes), CompletionStatus::kSuccess);
  EXPECT_FALSE(std::equal(secret_bytes.begin(), secret_bytes.end(), attacker->data()))
      << "the new region holds the bytes its previous owner left";
  attacker.reset();
  alice.reset();
  AfterAttack();
}

// A WRITE_WITH_IMM consumes a receive of the server's without writing a command into it: the
// server must not serve what that receive buffer held before (its slot's last session's
// commands), and the sender loses its session (reviewer's finding, then fixed).
TEST_F(HostileClientTest, AReceiveTakenByAWriteWithImmediateServesNothing) {
  // A victim leaves with commands in its slot's buffers; the attacker joins into that slot.
  {
    std::unique_ptr<Client> leaver = ConnectGood();
    ASSERT_NE(leaver, nullptr);
    ASSERT_TRUE(leaver->Alloc(kRegionBytes, 0x1eaf).ok());
  }
  WaitForClients(1);
  std::unique_ptr<RawClient> attacker = JoinAttacker();
  ASSERT_NE(attacker, nullptr);
  const PoolImage before = Snapshot();
  const ServerCounters counters = Counters();
  const RemoteRegion& own = own_.at(kOwnA);
  // As long as a stale alloc command (32 bytes) and as long as a queue of one op.
  for (const uint64_t bytes : {uint64_t{32}, uint64_t{32 + 48}}) {
    (void)attacker->WriteWithImm(own.addr, own.rkey, bytes);
  }
  EXPECT_TRUE(server_->WaitFor([&](const Server& s) { return s.counters().left > counters.left; }))
      << "the sender of a WRITE_WITH_IMM kept its session";
  EXPECT_EQ(Counters().allocs, counters.allocs) << "a stale command was served";
  ExpectPoolUnchanged(before, {kOwnA});  // the WRITE itself lands in the attacker's own region
  attacker.reset();
  AfterAttack();
}

}  // namespace
}  // namespace rmem
