// The shm fabric's batched UD path and its rings' cached counters (issue 37):
// - a chain of UD SENDs goes as runs to each receiver (one CAS for a run's receives, one for its
//   completions); whatever the receivers had posted, however short their receives or shallow
//   their CQs, what every receiver sees must be exactly what the same WRs posted one at a time
//   give: a differential test over random chains;
// - a sender trusts `tail_seen`, a producer `head_seen`, only while they say there is room: a
//   stale one (lower than the real counter, as a slow peer can leave it, or an old life's) never
//   lets a sender claim a receive that was not posted or a producer overwrite an unpolled
//   completion.
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/transport/fabric_fixture.h"
#include "transport/shm/shm_internal.h"

namespace transport::testing {
namespace {

constexpr uint32_t kReceivers = 3;
constexpr uint32_t kReceiveSlotBytes = 4096;  // receive i lands at i * this in its node's memory
constexpr uint32_t kMaxReceives = kNodeMemoryBytes / kReceiveSlotBytes;
constexpr uint32_t kMessageSlotBytes = 512;  // message k's bytes start at k * this at the sender
constexpr uint32_t kMaxMessages = kNodeMemoryBytes / kMessageSlotBytes;
constexpr uint32_t kReceiverMtu = 256;  // a longer message is dropped at the receiver

struct Message {
  uint32_t receiver;
  uint32_t length;
  bool with_imm;
  bool inline_data;
};

// What one receiver was given before the chains, and the chains.
struct Scenario {
  std::vector<uint32_t> receive_lengths[kReceivers];
  uint32_t cq_depth[kReceivers];
  std::vector<std::vector<Message>> chains;
  // For each receiver, a receive whose range lies past the end of its region (its key is good):
  // a message placed there puts the receiver in ERR; kNoBadReceive in the random scenarios.
  static constexpr uint32_t kNoBadReceive = UINT32_MAX;
  uint32_t bad_receive[kReceivers] = {kNoBadReceive, kNoBadReceive, kNoBadReceive};
};

// What a receiver saw: each completion, the bytes it placed, and its counts.
struct Seen {
  struct Arrival {
    uint64_t wr_id;
    CompletionStatus status;
    uint32_t byte_len;
    bool has_imm;
    uint32_t imm;
    std::string bytes;
    bool operator==(const Arrival&) const = default;
  };
  std::vector<Arrival> arrivals;
  uint64_t dropped = 0;
  uint64_t overruns = 0;
  bool operator==(const Seen&) const = default;
};

struct Outcome {
  Seen receivers[kReceivers];
  std::vector<CompletionStatus> sends;  // every WR is signalled
};

Scenario RandomScenario(std::mt19937_64& random) {
  auto pick = [&](uint32_t n) { return static_cast<uint32_t>(random() % n); };
  Scenario s;
  constexpr uint32_t kLengths[] = {kGrhBytes + 32, kGrhBytes + 128, kGrhBytes + 256, 16};
  constexpr uint32_t kCqDepths[] = {2, 4, 16, 64};
  for (uint32_t r = 0; r < kReceivers; ++r) {
    const uint32_t count = pick(kMaxReceives + 1);
    for (uint32_t i = 0; i < count; ++i) s.receive_lengths[r].push_back(kLengths[pick(4)]);
    s.cq_depth[r] = kCqDepths[pick(4)];
  }
  constexpr uint32_t kMessageLengths[] = {8, 32, 64, 128, 256, 300};
  uint32_t messages = 0;
  const uint32_t chains = 1 + pick(6);
  uint32_t receiver = pick(kReceivers);
  for (uint32_t c = 0; c < chains && messages < kMaxMessages; ++c) {
    std::vector<Message> chain;
    const uint32_t length = 1 + pick(24);  // past kMaxUdBatch too
    for (uint32_t i = 0; i < length && messages < kMaxMessages; ++i, ++messages) {
      if (pick(10) >= 7) receiver = pick(kReceivers);  // mostly runs to one receiver
      const uint32_t bytes = kMessageLengths[pick(6)];
      chain.push_back(Message{receiver, bytes, pick(2) == 0, bytes <= 60 && pick(2) == 0});
    }
    s.chains.push_back(std::move(chain));
  }
  return s;
}

// Runs `s` on a fabric of its own: each chain posted whole (`chained`) or one WR per PostSend.
Outcome RunScenario(const Scenario& s, bool chained, const std::string& fabric) {
  Outcome out;
  auto sender = MakeNode("shm", kAllAccess, 4096, fabric);
  std::unique_ptr<Node> nodes[kReceivers];
  std::unique_ptr<CompletionQueue> cqs[kReceivers];
  std::unique_ptr<QueuePair> qps[kReceivers];
  std::unique_ptr<AddressHandle> ahs[kReceivers];
  EXPECT_NE(sender, nullptr);
  if (sender == nullptr) return out;
  auto send_qp = MakeQp(*sender, QpType::kUd, 256);
  EXPECT_TRUE(send_qp->Connect(ConnectConfig{}).ok());
  for (uint32_t r = 0; r < kReceivers; ++r) {
    nodes[r] = MakeNode("shm", kAllAccess, kReceiverMtu, fabric);
    EXPECT_NE(nodes[r], nullptr);
    if (nodes[r] == nullptr) return out;
    cqs[r] = *nodes[r]->device->CreateCq(s.cq_depth[r]);
    QpConfig config;
    config.type = QpType::kUd;
    config.send_cq = nodes[r]->send_cq.get();
    config.recv_cq = cqs[r].get();
    config.max_recv_wr = kMaxReceives;
    qps[r] = *nodes[r]->pd->CreateQp(config);
    EXPECT_TRUE(qps[r]->Connect(ConnectConfig{}).ok());
    for (uint32_t i = 0; i < s.receive_lengths[r].size(); ++i) {
      if (i == s.bad_receive[r]) {
        Sge sge = nodes[r]->sge(0, s.receive_lengths[r][i]);
        sge.addr += kNodeMemoryBytes;  // past the region's end
        RecvWr wr;
        wr.wr_id = i;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        RecvWr* bad = nullptr;
        EXPECT_TRUE(qps[r]->PostRecv(&wr, &bad).ok());
        continue;
      }
      EXPECT_TRUE(
          PostRecv(*qps[r], *nodes[r], i, uint64_t{i} * kReceiveSlotBytes, s.receive_lengths[r][i])
              .ok());
    }
    ahs[r] = *sender->pd->CreateAddressHandle(AddressInfo{0, nodes[r]->device->port().gid});
  }
  // Message k's bytes: distinct for every message and offset.
  for (uint32_t k = 0; k < kMaxMessages; ++k) {
    for (uint32_t j = 0; j < kMessageSlotBytes; ++j) {
      sender->bytes()[k * kMessageSlotBytes + j] = static_cast<uint8_t>(k * 31 + j * 7 + 1);
    }
  }
  uint32_t k = 0;
  for (const std::vector<Message>& chain : s.chains) {
    std::vector<Sge> sges(chain.size());
    std::vector<SendWr> wrs(chain.size());
    for (uint32_t i = 0; i < chain.size(); ++i, ++k) {
      const Message& m = chain[i];
      sges[i] = sender->sge(uint64_t{k} * kMessageSlotBytes, m.length);
      SendWr& wr = wrs[i];
      wr.wr_id = k;
      wr.sg_list = &sges[i];
      wr.num_sge = 1;
      wr.opcode = m.with_imm ? Opcode::kSendWithImm : Opcode::kSend;
      wr.imm_data = k * 1000 + 7;
      wr.flags = kSignaled | (m.inline_data ? kInline : 0u);
      wr.ah = ahs[m.receiver].get();
      wr.remote_qpn = qps[m.receiver]->qp_num();
      wr.remote_qkey = ConnectConfig{}.qkey;
      wr.next = chained && i + 1 < chain.size() ? &wrs[i + 1] : nullptr;
    }
    if (chained) {
      EXPECT_TRUE(Post(*send_qp, wrs[0]).ok());
    } else {
      for (SendWr& wr : wrs) EXPECT_TRUE(Post(*send_qp, wr).ok());
    }
    for (const Completion& c : PollN(*sender->send_cq, chain.size())) out.sends.push_back(c.status);
  }
  // The synchronous fabric delivered inside PostSend: everything that will arrive has.
  for (uint32_t r = 0; r < kReceivers; ++r) {
    Completion c[8];
    for (size_t n; (n = cqs[r]->Poll(absl::MakeSpan(c))) > 0;) {
      for (size_t i = 0; i < n; ++i) {
        Seen::Arrival a{c[i].wr_id, c[i].status, c[i].byte_len, c[i].has_imm, c[i].imm_data, {}};
        if (c[i].status == CompletionStatus::kSuccess && c[i].byte_len >= kGrhBytes) {
          const uint8_t* at = nodes[r]->bytes() + c[i].wr_id * kReceiveSlotBytes + kGrhBytes;
          a.bytes.assign(reinterpret_cast<const char*>(at), c[i].byte_len - kGrhBytes);
        }
        out.receivers[r].arrivals.push_back(std::move(a));
      }
    }
    out.receivers[r].dropped = qps[r]->counters().dropped.Get();
    out.receivers[r].overruns = cqs[r]->counters().overruns.Get();
  }
  for (uint32_t r = 0; r < kReceivers; ++r) {
    qps[r].reset();
    ahs[r].reset();
  }
  return out;
}

TEST(ShmUdRuns, ChainsDeliverExactlyWhatOneByOneDelivers) {
  constexpr int kScenarios = 60;
  std::mt19937_64 random(20261127);
  uint64_t delivered = 0, dropped = 0;
  for (int i = 0; i < kScenarios; ++i) {
    const Scenario s = RandomScenario(random);
    const std::string base = absl::StrCat("shm-runs-", getpid(), "-", i);
    const Outcome chained = RunScenario(s, /*chained=*/true, base + "-chained");
    const Outcome single = RunScenario(s, /*chained=*/false, base + "-single");
    ASSERT_EQ(chained.sends, single.sends) << "scenario " << i;
    for (uint32_t r = 0; r < kReceivers; ++r) {
      ASSERT_EQ(chained.receivers[r].arrivals.size(), single.receivers[r].arrivals.size())
          << "scenario " << i << ", receiver " << r;
      EXPECT_TRUE(chained.receivers[r] == single.receivers[r])
          << "scenario " << i << ", receiver " << r;
      delivered += single.receivers[r].arrivals.size();
      dropped += single.receivers[r].dropped;
    }
  }
  // The scenarios reach both outcomes often (else the comparison proves little).
  EXPECT_GT(delivered, 200u);
  EXPECT_GT(dropped, 200u);
}

// A run to a receiver with fewer receives posted than the run: the first ones land in order, the
// rest are dropped and counted; the sender's WRs all succeed (UD).
TEST(ShmUdRuns, ARunLongerThanThePostedReceivesDropsTheRestCounted) {
  Scenario s;
  s.receive_lengths[0] = {kGrhBytes + 64, kGrhBytes + 64, kGrhBytes + 64};
  s.cq_depth[0] = s.cq_depth[1] = s.cq_depth[2] = 64;
  s.chains.push_back(std::vector<Message>(6, Message{0, 64, false, false}));
  const Outcome o = RunScenario(s, true, absl::StrCat("shm-runs-short-", getpid()));
  ASSERT_EQ(o.receivers[0].arrivals.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(o.receivers[0].arrivals[i].wr_id, i);  // receive i took message i
    EXPECT_EQ(o.receivers[0].arrivals[i].byte_len, kGrhBytes + 64);
    EXPECT_EQ(static_cast<uint8_t>(o.receivers[0].arrivals[i].bytes[0]),
              static_cast<uint8_t>(i * 31 + 1));
  }
  EXPECT_EQ(o.receivers[0].dropped, 3u);
  EXPECT_EQ(o.sends, std::vector<CompletionStatus>(6, CompletionStatus::kSuccess));
}

// A run whose receiver's CQ has room for part of it: the completions that fit arrive, the rest
// are overruns, counted at the CQ and as drops at the QP.
TEST(ShmUdRuns, ARunLargerThanTheRoomInTheCqOverrunsTheRestCounted) {
  Scenario s;
  s.receive_lengths[0] = std::vector<uint32_t>(5, kGrhBytes + 64);
  s.cq_depth[0] = 2;
  s.cq_depth[1] = s.cq_depth[2] = 64;
  s.chains.push_back(std::vector<Message>(5, Message{0, 64, true, false}));
  const Outcome o = RunScenario(s, true, absl::StrCat("shm-runs-cq-", getpid()));
  EXPECT_EQ(o.receivers[0].arrivals.size(), 2u);
  EXPECT_EQ(o.receivers[0].overruns, 3u);
  EXPECT_EQ(o.receivers[0].dropped, 3u);
}

// One batch claims for all of its runs before it places any bytes. The one outcome that differs
// from one by one: a receiver that a placement puts in ERR (a receive past the end of its region)
// after a later run of the same batch claimed its next receive. That receive completes flushed,
// as a NIC flushes an ERR QP's receives; one by one, the later message would have found the QP in
// ERR and been dropped without taking it. Either way the message is lost and counted.
TEST(ShmUdRuns, AReceiverInErrBeforeItsClaimedReceiveIsFilledFlushesIt) {
  Scenario s;
  s.receive_lengths[0] = {kGrhBytes + 64, kGrhBytes + 64, kGrhBytes + 64};
  s.receive_lengths[1] = {kGrhBytes + 64, kGrhBytes + 64};
  s.bad_receive[0] = 1;
  s.cq_depth[0] = s.cq_depth[1] = s.cq_depth[2] = 64;
  // First a message to each receiver (the sender maps their regions: a run that maps one ends a
  // batch's claims); then receiver 0, 1 and 0 again: three runs of one batch.
  s.chains.push_back({Message{0, 64, false, false}});
  s.chains.push_back({Message{1, 64, false, false}});
  s.chains.push_back(
      {Message{0, 64, false, false}, Message{1, 64, false, false}, Message{0, 64, false, false}});
  const Outcome batched = RunScenario(s, true, absl::StrCat("shm-runs-err-", getpid()));
  ASSERT_EQ(batched.receivers[0].arrivals.size(), 3u);
  EXPECT_EQ(batched.receivers[0].arrivals[0].status, CompletionStatus::kSuccess);
  EXPECT_EQ(batched.receivers[0].arrivals[1].status, CompletionStatus::kLocalProtectionError);
  EXPECT_EQ(batched.receivers[0].arrivals[2].wr_id, 2u);
  EXPECT_EQ(batched.receivers[0].arrivals[2].status, CompletionStatus::kFlushed);
  EXPECT_EQ(batched.receivers[0].dropped, 1u);
  ASSERT_EQ(batched.receivers[1].arrivals.size(), 2u);
  EXPECT_EQ(batched.receivers[1].arrivals[1].status, CompletionStatus::kSuccess);
  EXPECT_EQ(batched.sends, std::vector<CompletionStatus>(5, CompletionStatus::kSuccess));
  // One by one: the last message finds receiver 0 in ERR and is dropped, its receive untaken.
  const Outcome single = RunScenario(s, false, absl::StrCat("shm-runs-err1-", getpid()));
  ASSERT_EQ(single.receivers[0].arrivals.size(), 2u);
  EXPECT_EQ(single.receivers[0].arrivals[1].status, CompletionStatus::kLocalProtectionError);
  EXPECT_EQ(single.receivers[0].dropped, 1u);
  EXPECT_EQ(single.receivers[1], batched.receivers[1]);
}

}  // namespace
}  // namespace transport::testing

namespace transport::shm {
// Holds a peer's mapping lock: a placement that must map one of the peer's regions waits on it, as
// it would on an owner's file that is slow to open or map.
class PeerTestAccess {
 public:
  static util::Mutex& map_mutex(Peer& peer) { return peer.map_mutex_; }
};
}  // namespace transport::shm

namespace transport::testing {
namespace {

// Whether thread `tid` of this process waits on a lock: asleep in the kernel, in futex(2) (a
// sanitizer's own lock could be that too, but only a lock the test holds keeps it there).
bool WaitsOnALock(pid_t tid) {
  std::ifstream stat(absl::StrCat("/proc/self/task/", tid, "/stat"));
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');  // the name, in parentheses, may hold anything
  if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'S') {
    return false;
  }
  std::ifstream syscall(absl::StrCat("/proc/self/task/", tid, "/syscall"));
  long number = -1;
  syscall >> number;
  return number == SYS_futex;
}

// A batch to receivers X then Y, where X's region is not mapped by the sender yet and mapping it
// waits: X's run is the last one claimed, so Y's CQ holds no completion reserved by the waiting
// batch, and what another sender delivers to Y meanwhile shows at once. (Claimed with the rest,
// Y's completion was reserved before X's bytes were placed; the other sender's came after it in
// Y's CQ, unseen until X's mapping was done.)
TEST(ShmUdRuns, APlacementThatMapsAReceiversRegionHoldsUpNoOtherReceiver) {
  const std::string fabric = absl::StrCat("shm-runs-map-", getpid());
  auto sender = MakeNode("shm", kAllAccess, 4096, fabric);
  auto other_sender = MakeNode("shm", kAllAccess, 4096, fabric);
  auto x = MakeNode("shm", kAllAccess, 4096, fabric);
  auto y = MakeNode("shm", kAllAccess, 4096, fabric);
  ASSERT_TRUE(sender && other_sender && x && y);
  auto send_qp = MakeQp(*sender, QpType::kUd);
  auto other_qp = MakeQp(*other_sender, QpType::kUd);
  auto x_qp = MakeQp(*x, QpType::kUd);
  auto y_qp = MakeQp(*y, QpType::kUd);
  for (QueuePair* qp : {send_qp.get(), other_qp.get(), x_qp.get(), y_qp.get()}) {
    ASSERT_TRUE(qp->Connect(ConnectConfig{}).ok());
  }
  ASSERT_TRUE(PostRecv(*x_qp, *x, 0, 0, kGrhBytes + 64).ok());
  ASSERT_TRUE(PostRecv(*y_qp, *y, 1, 0, kGrhBytes + 64).ok());
  ASSERT_TRUE(PostRecv(*y_qp, *y, 2, kReceiveSlotBytes, kGrhBytes + 64).ok());
  auto to_x = *sender->pd->CreateAddressHandle(AddressInfo{0, x->device->port().gid});
  auto to_y = *sender->pd->CreateAddressHandle(AddressInfo{0, y->device->port().gid});
  auto other_to_y = *other_sender->pd->CreateAddressHandle(AddressInfo{0, y->device->port().gid});
  SendWr wrs[3];
  Sge sges[3];
  auto fill_send = [&](SendWr& wr, Sge& sge, Node& from, uint64_t wr_id, AddressHandle* ah,
                       const QueuePair& to) {
    sge = from.sge(0, 64);
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = Opcode::kSend;
    wr.flags = kSignaled;
    wr.ah = ah;
    wr.remote_qpn = to.qp_num();
    wr.remote_qkey = ConnectConfig{}.qkey;
  };
  fill_send(wrs[0], sges[0], *sender, 10, to_x.get(), *x_qp);
  fill_send(wrs[1], sges[1], *sender, 11, to_y.get(), *y_qp);
  wrs[0].next = &wrs[1];  // one batch: a run to X, then a run to Y
  fill_send(wrs[2], sges[2], *other_sender, 20, other_to_y.get(), *y_qp);

  util::Mutex& x_mapping =
      shm::PeerTestAccess::map_mutex(*static_cast<shm::ShmAh*>(to_x.get())->peer());
  x_mapping.Lock();
  std::atomic<pid_t> batch_tid{0};
  std::thread batch([&] {
    batch_tid.store(gettid());
    EXPECT_TRUE(Post(*send_qp, wrs[0]).ok());
  });
  // Until the batch waits to map X's region.
  const absl::Time give_up = absl::Now() + kCompletionDeadline;
  while ((batch_tid.load() == 0 || !WaitsOnALock(batch_tid.load())) && absl::Now() < give_up) {
    std::this_thread::yield();
  }
  const bool waiting = WaitsOnALock(batch_tid.load());
  const bool posted = waiting && Post(*other_qp, wrs[2]).ok();
  const std::vector<Completion> meanwhile =
      posted ? PollN(*y->recv_cq, 1) : std::vector<Completion>{};
  x_mapping.Unlock();  // before any ASSERT can end the test with the batch's thread waiting
  batch.join();
  ASSERT_TRUE(waiting) << "the batch never reached X's mapping";
  ASSERT_TRUE(posted);
  ASSERT_EQ(meanwhile.size(), 1u) << "Y's CQ showed nothing while X's region was being mapped";
  EXPECT_EQ(meanwhile[0].wr_id, 1u);  // Y's first receive: the other sender's message
  EXPECT_EQ(meanwhile[0].status, CompletionStatus::kSuccess);
  // Then the batch's two, each at its receiver.
  const std::vector<Completion> at_x = PollN(*x->recv_cq, 1);
  ASSERT_EQ(at_x.size(), 1u);
  EXPECT_EQ(at_x[0].status, CompletionStatus::kSuccess);
  const std::vector<Completion> at_y = PollN(*y->recv_cq, 1);
  ASSERT_EQ(at_y.size(), 1u);
  EXPECT_EQ(at_y[0].wr_id, 2u);
  EXPECT_EQ(at_y[0].status, CompletionStatus::kSuccess);
  EXPECT_EQ(PollN(*sender->send_cq, 2).size(), 2u);
}

// ------------------------------------------------------------------------ cached counters
struct OneQp {
  std::unique_ptr<Node> node;
  std::unique_ptr<QueuePair> qp;
  shm::RecvRing* ring = nullptr;
};

OneQp MakeReceiver(uint32_t depth) {
  OneQp r;
  r.node = MakeNode("shm", kAllAccess, 4096, absl::StrCat("shm-rings-", getpid()));
  QpConfig config;
  config.type = QpType::kUd;
  config.send_cq = r.node->send_cq.get();
  config.recv_cq = r.node->recv_cq.get();
  config.max_recv_wr = depth;
  r.qp = *r.node->pd->CreateQp(config);
  EXPECT_TRUE(r.qp->Connect(ConnectConfig{}).ok());
  auto& device = dynamic_cast<shm::ShmDevice&>(*r.node->device);
  const shm::QpEntry& entry =
      device.segment().header()->qps[r.qp->qp_num() & ((1u << shm::kQpIndexBits) - 1)];
  r.ring = device.segment().At<shm::RecvRing>(entry.recv_ring_offset);
  return r;
}

// tail_seen below the head (a slow sender's late store, or an old life's): the next sender
// reads the owner's tail and finds nothing posted; with ">=" read as "==" it would claim the
// entry past the tail, a receive the owner never posted.
TEST(ShmRings, ASenderWithAStaleTailClaimsNothingThatWasNotPosted) {
  constexpr uint32_t kDepth = 8;
  OneQp r = MakeReceiver(kDepth);
  ASSERT_TRUE(PostRecv(*r.qp, *r.node, 1, 0, 256).ok());
  shm::RecvEntry taken;
  ASSERT_EQ(shm::PopReceive(r.ring, kDepth, r.qp->qp_num(), &taken), shm::Pop::kTaken);
  EXPECT_EQ(taken.wr_id, 1u);
  r.ring->tail_seen.store(0);  // below head (1): what a stale store leaves
  EXPECT_EQ(shm::PopReceive(r.ring, kDepth, r.qp->qp_num(), &taken), shm::Pop::kEmpty);
  EXPECT_EQ(r.ring->head.load(), 1u);
  // And one posted after is found, however stale the cache was.
  r.ring->tail_seen.store(0);
  ASSERT_TRUE(PostRecv(*r.qp, *r.node, 2, 256, 256).ok());
  EXPECT_EQ(shm::PopReceive(r.ring, kDepth, r.qp->qp_num(), &taken), shm::Pop::kTaken);
  EXPECT_EQ(taken.wr_id, 2u);
}

// A multi-claim takes only what is posted, and stops before a receive too short for its message.
TEST(ShmRings, AClaimOfManyTakesWhatIsPostedUpToTheFirstTooShort) {
  constexpr uint32_t kDepth = 8;
  OneQp r = MakeReceiver(kDepth);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(PostRecv(*r.qp, *r.node, i, i * 256, 256).ok());
  ASSERT_TRUE(PostRecv(*r.qp, *r.node, 3, 3 * 256, 16).ok());
  const uint64_t want[5] = {100, 100, 100, 100, 100};
  shm::RecvEntry out[5];
  shm::Pop stop = shm::Pop::kTaken;
  EXPECT_EQ(shm::PopReceives(r.ring, kDepth, r.qp->qp_num(), want, 5, out, &stop), 3u);
  EXPECT_EQ(stop, shm::Pop::kTooSmall);
  EXPECT_EQ(out[2].wr_id, 2u);
  // The short one stays posted, at the head.
  EXPECT_EQ(shm::PopReceives(r.ring, kDepth, r.qp->qp_num(), want, 5, out, &stop), 0u);
  EXPECT_EQ(stop, shm::Pop::kTooSmall);
  const uint64_t small[1] = {8};
  EXPECT_EQ(shm::PopReceives(r.ring, kDepth, r.qp->qp_num(), small, 1, out, &stop), 1u);
  EXPECT_EQ(out[0].wr_id, 3u);
  EXPECT_EQ(shm::PopReceives(r.ring, kDepth, r.qp->qp_num(), small, 1, out, &stop), 0u);
  EXPECT_EQ(stop, shm::Pop::kEmpty);
}

// head_seen lags the consumer: producers take the room it shows without reading the consumer's
// line, look at the real head once the ring looks full, and never write over a completion the
// consumer has not polled.
TEST(ShmRings, AProducerWithAStaleHeadNeverOverwritesAnUnpolledCompletion) {
  constexpr uint32_t kDepth = 4;
  auto node = MakeNode("shm", kAllAccess, 4096, absl::StrCat("shm-rings-cq-", getpid()));
  auto cq = *node->device->CreateCq(kDepth);
  auto& shm_cq = dynamic_cast<shm::ShmCq&>(*cq);
  shm::CqRing* ring = shm_cq.device()->segment().At<shm::CqRing>(shm_cq.offset());
  const uint32_t id = shm_cq.id();
  auto push = [&](uint64_t wr_id) {
    Completion c;
    c.wr_id = wr_id;
    return shm::PushCompletion(ring, kDepth, id, c, 0);
  };
  for (uint64_t i = 0; i < kDepth; ++i) ASSERT_TRUE(push(i));
  EXPECT_FALSE(push(100)) << "full";
  Completion got[kDepth];
  ASSERT_EQ(cq->Poll(absl::MakeSpan(got, 2)), 2u);  // head moves on; head_seen does not
  EXPECT_TRUE(push(4));
  EXPECT_TRUE(push(5));
  EXPECT_FALSE(push(101)) << "full again: two unpolled from before, two new";
  ring->head_seen.store(0);  // a stale store from a slow producer
  EXPECT_FALSE(push(102)) << "still full: the real head decides, not the stale one";
  ASSERT_EQ(cq->Poll(absl::MakeSpan(got)), kDepth);
  EXPECT_EQ(got[0].wr_id, 2u);
  EXPECT_EQ(got[1].wr_id, 3u);
  EXPECT_EQ(got[2].wr_id, 4u);
  EXPECT_EQ(got[3].wr_id, 5u);
  // A reservation of several takes the room there is and counts the rest as overruns.
  uint64_t first = 0;
  EXPECT_EQ(shm::ReserveCompletions(ring, kDepth, id, kDepth + 2, &first), kDepth);
  for (uint32_t i = 0; i < kDepth; ++i) {
    Completion c;
    c.wr_id = 10 + i;
    shm::PublishCompletion(ring, kDepth, first + i, c, 0);
  }
  EXPECT_EQ(cq->Poll(absl::MakeSpan(got)), kDepth);
  EXPECT_EQ(got[kDepth - 1].wr_id, 10u + kDepth - 1);
  EXPECT_EQ(cq->counters().overruns.Get(), 5u);  // 100, 101, 102 and the 2 of 6 that had no room
}

}  // namespace
}  // namespace transport::testing
