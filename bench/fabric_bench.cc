// fabric_bench: message rate and latency of the fabric's verbs, with no engine on top.
//
//   bazel run -c opt //bench:fabric_bench -- --fabric=shm
//
// Rate rows: for WRITE (UC, RC), SEND (UD) and READ (RC), each message size, 1 and 2 sender
// threads (each thread its own QP pair between two devices of this process), unchained (one WR
// per post_send) and chained (--chain WRs per post_send, one doorbell). One WR in --signal_every
// is signalled; p50/p99 are the time from posting a signalled WR to polling its completion.
// SEND rows count messages DELIVERED (a receiver thread per pair keeps receives posted).
// Ping-pong rows: one thread pair bouncing a message (UC WRITE into a polled buffer, or UD SEND);
// mops is 1/round trip, p50/p99 are round trips. Fan-in rows: N sender threads, each with its
// own device and UD QP, SEND to ONE receiver UD QP whose thread polls and reposts in chains (a
// herd client's response path: every worker answers it); ns_per_send is the receiver's time per
// message delivered (1e3 / mops), the cost that must not grow with the senders. Every row is one
// JSON line with the counters.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/histogram.h"
#include "bench/machine.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "transport/fabric.h"
#include "transport/flags.h"
#include "transport/shared_memory.h"

DEFINE_string(msg_sizes, "32,256,1024", "Message sizes in bytes, comma-separated");
DEFINE_double(duration_s, 1, "Measured seconds per row");
DEFINE_uint32(chain, 16, "WRs per post_send in the chained rows");
DEFINE_uint32(signal_every, 16, "One WR in this many is signalled");
DEFINE_uint32(max_threads, 2, "Rate rows run with 1 .. this many sender threads");
DEFINE_string(rows, "rate,pingpong,fanin,fanout",
              "Which rows to run: rate, pingpong, fanin, fanout, udloop (one thread both ends)");
DEFINE_string(fanin_senders, "1,2", "Fan-in rows: sender thread counts, comma-separated");
DEFINE_uint32(fanout_receivers, 16,
              "Fan-out rows: receivers one sender answers in turn, each its own device");

namespace {

using transport::Completion;
using transport::CompletionQueue;
using transport::QpType;
using transport::SendWr;
using transport::Sge;

// Each node's registered buffer: room for a chain of the largest message, twice.
constexpr size_t kBufferBytes = size_t{4} << 20;
constexpr uint32_t kQueueDepth = 256;  // send and receive WRs per QP
constexpr uint32_t kMaxInline = 256;   // inline up to this many bytes, as herd does
constexpr uint32_t kQkey = 0x4242;
// Each fan-in and fan-out receiver's posted receives: deep enough that one poller serving several
// receivers in turn rarely lets one run dry (a dry receiver drops, and a drop costs a sender less).
constexpr uint32_t kFanReceives = 4 * kQueueDepth;
// Whether kFanReceives receives of `size`-byte UD messages fit a node's buffer.
constexpr bool FanReceivesFit(uint32_t size) {
  return uint64_t{kFanReceives} * (size + transport::kGrhBytes) <= kBufferBytes;
}

// A failed control-path call ends the benchmark with its status (glog has no CHECK_OK).
#define BENCH_CHECK_OK(expr)                    \
  do {                                          \
    const absl::Status bench_status_ = (expr);  \
    CHECK(bench_status_.ok()) << bench_status_; \
  } while (false)

struct Node {
  std::unique_ptr<transport::Device> device;
  std::unique_ptr<transport::ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> send_cq, recv_cq;
  std::unique_ptr<transport::SharedMemory> memory;
  std::unique_ptr<transport::MemoryRegion> mr;
  uint8_t* bytes() const { return memory->data(); }
  uint64_t addr(size_t offset) const { return reinterpret_cast<uint64_t>(bytes() + offset); }
};

Node OpenNode(const transport::DeviceOptions& options) {
  Node n;
  n.device = *transport::OpenDevice(options);
  n.pd = *n.device->AllocatePd();
  n.send_cq = *n.device->CreateCq(4 * kQueueDepth);
  n.recv_cq = *n.device->CreateCq(4 * kQueueDepth);
  n.memory =
      std::make_unique<transport::SharedMemory>(*transport::SharedMemory::Allocate(kBufferBytes));
  std::memset(n.memory->data(), 0, kBufferBytes);  // fault the pages in before measuring
  n.mr = *n.pd->RegisterMemory(n.bytes(), kBufferBytes,
                               transport::kLocalWrite | transport::kRemoteWrite |
                                   transport::kRemoteRead | transport::kRemoteAtomic);
  return n;
}

std::unique_ptr<transport::QueuePair> MakeQp(Node& n, QpType type,
                                             uint32_t recv_depth = kQueueDepth) {
  transport::QpConfig config;
  config.type = type;
  config.send_cq = n.send_cq.get();
  config.recv_cq = n.recv_cq.get();
  config.max_send_wr = kQueueDepth;
  config.max_recv_wr = recv_depth;
  config.max_inline_data = kMaxInline;
  return *n.pd->CreateQp(config);
}

// A connected pair (RC/UC) or two UD QPs, between a sender node and a receiver node.
struct Pair {
  Node sender, receiver;
  std::unique_ptr<transport::QueuePair> out, in;
  std::unique_ptr<transport::AddressHandle> to_receiver, to_sender;
};

std::unique_ptr<Pair> MakePair(const transport::DeviceOptions& options, QpType type) {
  auto p = std::make_unique<Pair>();
  p->sender = OpenNode(options);
  p->receiver = OpenNode(options);
  p->out = MakeQp(p->sender, type);
  p->in = MakeQp(p->receiver, type);
  transport::ConnectConfig a, b;
  a.qkey = b.qkey = kQkey;
  a.remote = p->in->endpoint();
  b.remote = p->out->endpoint();
  BENCH_CHECK_OK(p->out->Connect(a));
  BENCH_CHECK_OK(p->in->Connect(b));
  if (type == QpType::kUd) {
    const transport::PortInfo rport = p->receiver.device->port(), sport = p->sender.device->port();
    p->to_receiver = *p->sender.pd->CreateAddressHandle({rport.lid, rport.gid});
    p->to_sender = *p->receiver.pd->CreateAddressHandle({sport.lid, sport.gid});
  }
  return p;
}

struct Verb {
  const char* name;
  QpType type;
  transport::Opcode opcode;
};

// Keeps `count` receives of `bytes` posted on `qp` (UD: plus the GRH area).
void PostReceives(transport::QueuePair& qp, Node& n, uint32_t count, uint32_t bytes) {
  for (uint32_t i = 0; i < count; ++i) {
    Sge sge{n.addr(size_t{i} * (bytes + transport::kGrhBytes)), bytes + transport::kGrhBytes,
            n.mr->lkey()};
    transport::RecvWr wr;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    transport::RecvWr* bad = nullptr;
    BENCH_CHECK_OK(qp.PostRecv(&wr, &bad));
  }
}

// A chain of `chain` UD SENDs of `size` bytes from `node`'s buffer (inline where herd would),
// its last WR signalled; the caller names each WR's receiver (ah, remote_qpn). The fan-in and
// fan-out rows post a chain only once the one before it completed: at most one chain in flight
// per sender, so no send-queue accounting is needed.
void UdSendChain(Node& node, uint32_t size, uint32_t chain, std::vector<SendWr>* wrs,
                 std::vector<Sge>* sges) {
  wrs->assign(chain, SendWr{});
  sges->resize(chain);
  for (uint32_t i = 0; i < chain; ++i) {
    (*sges)[i] = Sge{node.addr(size_t{i} * size), size, node.mr->lkey()};
    SendWr& wr = (*wrs)[i];
    wr.wr_id = i;
    wr.sg_list = &(*sges)[i];
    wr.num_sge = 1;
    wr.opcode = transport::Opcode::kSend;
    wr.flags = size <= kMaxInline ? uint32_t{transport::kInline} : 0u;
    wr.remote_qkey = kQkey;
    wr.next = i + 1 < chain ? &(*wrs)[i + 1] : nullptr;
  }
  wrs->back().flags |= transport::kSignaled;
}

// The messages a receiving thread counted in `delivered` over --duration_s, after a short
// warm-up, and the seconds that took.
std::pair<uint64_t, double> MeasureDelivered(const std::atomic<uint64_t>& delivered) {
  absl::SleepFor(absl::Milliseconds(100));
  const uint64_t start_count = delivered.load();
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Seconds(FLAGS_duration_s));
  return {delivered.load() - start_count, absl::ToDoubleSeconds(absl::Now() - start)};
}

// A receiving thread's loop body (fan-in, fan-out): polls a node's receive CQ and posts each
// completed receive again, on the same slot (PostReceives' layout for `size`-byte messages).
class Reposter {
 public:
  explicit Reposter(uint32_t size) : slot_(size + transport::kGrhBytes) {}
  // Returns how many receives completed (and were posted again).
  size_t PollAndRepost(Node& node, transport::QueuePair& qp) {
    const size_t got = node.recv_cq->Poll(absl::MakeSpan(done_, kPollBatch));
    if (got == 0) return 0;
    for (size_t i = 0; i < got; ++i) {
      sges_[i] = Sge{node.addr(done_[i].wr_id * slot_), slot_, node.mr->lkey()};
      wrs_[i] = transport::RecvWr{};
      wrs_[i].wr_id = done_[i].wr_id;
      wrs_[i].sg_list = &sges_[i];
      wrs_[i].num_sge = 1;
      wrs_[i].next = i + 1 < got ? &wrs_[i + 1] : nullptr;
    }
    transport::RecvWr* bad = nullptr;
    BENCH_CHECK_OK(qp.PostRecv(wrs_, &bad));
    return got;
  }

 private:
  static constexpr size_t kPollBatch = 32;
  const uint32_t slot_;
  Completion done_[kPollBatch];
  Sge sges_[kPollBatch];
  transport::RecvWr wrs_[kPollBatch];
};

struct ThreadResult {
  uint64_t messages = 0;
  bench::Histogram latency_ns;
};

// One sender thread's loop: chains of `chain` WRs until `stop`.
void SendLoop(Pair& p, const Verb& verb, uint32_t size, uint32_t chain,
              const std::atomic<bool>& stop, ThreadResult* result) {
  std::vector<SendWr> wrs(chain);
  std::vector<Sge> sges(chain);
  const bool inline_ok = size <= kMaxInline && verb.opcode != transport::Opcode::kRead;
  for (uint32_t i = 0; i < chain; ++i) {
    sges[i] = Sge{p.sender.addr(size_t{i} * size), size, p.sender.mr->lkey()};
    SendWr& wr = wrs[i];
    wr.wr_id = i;
    wr.sg_list = &sges[i];
    wr.num_sge = 1;
    wr.opcode = verb.opcode;
    wr.flags = inline_ok ? uint32_t{transport::kInline} : 0u;
    wr.remote_addr = p.receiver.addr(size_t{i} * size);
    wr.rkey = p.receiver.mr->rkey();
    wr.ah = p.to_receiver.get();
    wr.remote_qpn = p.in->qp_num();
    wr.remote_qkey = kQkey;
    wr.next = i + 1 < chain ? &wrs[i + 1] : nullptr;
  }
  Completion done[32];
  uint64_t posted = 0;
  absl::Time signalled_at;
  bool waiting = false;
  while (!stop.load(std::memory_order_relaxed)) {
    // The chain's last WR is signalled when a signal is due (one in signal_every overall).
    const bool signal =
        !waiting && (posted / FLAGS_signal_every) != ((posted + chain) / FLAGS_signal_every);
    SendWr& last = wrs[chain - 1];
    last.flags = (last.flags & ~uint32_t{transport::kSignaled}) |
                 (signal ? uint32_t{transport::kSignaled} : 0u);
    SendWr* bad = nullptr;
    const absl::Time now = absl::Now();
    const absl::Status status = p.out->PostSend(&wrs[0], &bad);
    uint32_t accepted = chain;
    if (!status.ok()) {
      accepted = 0;
      for (SendWr* wr = &wrs[0]; wr != bad; wr = wr->next) ++accepted;
      CHECK(status.code() == absl::StatusCode::kResourceExhausted) << status;
    }
    if (signal && accepted == chain) {
      signalled_at = now;
      waiting = true;
    }
    posted += accepted;
    const size_t got = p.sender.send_cq->Poll(absl::MakeSpan(done, 32));
    for (size_t i = 0; i < got; ++i) {
      CHECK(done[i].status == transport::CompletionStatus::kSuccess)
          << transport::ToString(done[i].status);
      result->latency_ns.Record(absl::ToInt64Nanoseconds(absl::Now() - signalled_at));
      waiting = false;
    }
  }
  if (verb.opcode != transport::Opcode::kSend) result->messages = posted;
}

// The receiver side of SEND rows: counts deliveries and reposts.
void ReceiveLoop(Pair& p, uint32_t size, const std::atomic<bool>& stop, ThreadResult* result) {
  Completion done[32];
  const uint32_t slot = size + transport::kGrhBytes;
  while (!stop.load(std::memory_order_relaxed)) {
    const size_t got = p.receiver.recv_cq->Poll(absl::MakeSpan(done, 32));
    for (size_t i = 0; i < got; ++i) {
      Sge sge{p.receiver.addr(done[i].wr_id * slot), slot, p.receiver.mr->lkey()};
      transport::RecvWr wr;
      wr.wr_id = done[i].wr_id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      transport::RecvWr* bad = nullptr;
      BENCH_CHECK_OK(p.in->PostRecv(&wr, &bad));
    }
    result->messages += got;
  }
}

// The sending side's verb economy: its QP and send CQ.
std::string SenderCountersJson(const transport::QueuePair& qp, const CompletionQueue& send_cq) {
  transport::CounterSnapshot s;
  s.Add(qp.counters());
  s.Add(send_cq.counters());
  return s.ToJson();
}

std::string CountersJson(const Pair& p) { return SenderCountersJson(*p.out, *p.sender.send_cq); }

void RateRow(const transport::DeviceOptions& options, const Verb& verb, uint32_t size,
             uint32_t threads, uint32_t chain) {
  std::vector<std::unique_ptr<Pair>> pairs;
  for (uint32_t t = 0; t < threads; ++t) {
    pairs.push_back(MakePair(options, verb.type));
    if (verb.opcode == transport::Opcode::kSend) {
      PostReceives(*pairs.back()->in, pairs.back()->receiver, kQueueDepth, size);
    }
  }
  std::atomic<bool> stop{false};
  std::vector<ThreadResult> sent(threads), received(threads);
  std::vector<std::thread> workers;
  for (uint32_t t = 0; t < threads; ++t) {
    workers.emplace_back(SendLoop, std::ref(*pairs[t]), std::cref(verb), size, chain,
                         std::cref(stop), &sent[t]);
    if (verb.opcode == transport::Opcode::kSend) {
      workers.emplace_back(ReceiveLoop, std::ref(*pairs[t]), size, std::cref(stop), &received[t]);
    }
  }
  absl::SleepFor(absl::Seconds(FLAGS_duration_s));
  stop = true;
  for (std::thread& w : workers) w.join();
  uint64_t messages = 0, posted = 0;
  bench::Histogram latency;
  for (uint32_t t = 0; t < threads; ++t) {
    messages += verb.opcode == transport::Opcode::kSend ? received[t].messages : sent[t].messages;
    posted += pairs[t]->out->counters().wrs.Get();
    latency.Merge(sent[t].latency_ns);
  }
  // sent_mops: WRs posted; mops: messages that arrived (they differ only for UD SENDs that found
  // no receive posted, i.e. when the receiver thread falls behind).
  printf(
      "{\"kind\":\"rate\",\"verb\":\"%s\",\"qp_type\":\"%s\",\"msg_size\":%u,\"threads\":%u,"
      "\"chain\":%u,\"mops\":%.4f,\"sent_mops\":%.4f,\"p50_us\":%.2f,\"p99_us\":%.2f,"
      "\"counters\":%s}\n",
      verb.name, transport::ToString(verb.type), size, threads, chain,
      static_cast<double>(messages) / FLAGS_duration_s / 1e6,
      static_cast<double>(posted) / FLAGS_duration_s / 1e6, latency.Quantile(0.5) / 1e3,
      latency.Quantile(0.99) / 1e3, CountersJson(*pairs[0]).c_str());
  fflush(stdout);
}

// Bounces one message between the pair: UC WRITE into a buffer the other side polls (HERD's
// request path), or UD SEND (its response path). Returns after duration_s.
void PingPongRow(const transport::DeviceOptions& options, const Verb& verb, uint32_t size) {
  auto p = MakePair(options, verb.type);
  const bool send = verb.opcode == transport::Opcode::kSend;
  if (send) {
    PostReceives(*p->in, p->receiver, kQueueDepth, size);
    PostReceives(*p->out, p->sender, kQueueDepth, size);
  }
  std::atomic<bool> stop{false};
  // One side of the bounce: waits for message `round`, answers it.
  auto bounce = [&](Node& self, transport::QueuePair& qp, Node& peer, transport::AddressHandle* ah,
                    uint32_t peer_qpn, uint64_t round) {
    const size_t offset = size_t{1} << 20;  // sources here, landing zone at 0
    std::memcpy(self.bytes() + offset + size - sizeof(round), &round, sizeof(round));
    Sge sge{self.addr(offset), size, self.mr->lkey()};
    SendWr wr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = verb.opcode;
    wr.flags = (size <= kMaxInline ? uint32_t{transport::kInline} : 0u) |
               (round % FLAGS_signal_every == 0 ? uint32_t{transport::kSignaled} : 0u);
    wr.remote_addr = peer.addr(0);
    wr.rkey = peer.mr->rkey();
    wr.ah = ah;
    wr.remote_qpn = peer_qpn;
    wr.remote_qkey = kQkey;
    SendWr* bad = nullptr;
    BENCH_CHECK_OK(qp.PostSend(&wr, &bad));
    Completion c[8];
    self.send_cq->Poll(absl::MakeSpan(c, 8));
  };
  auto await = [&](Node& self, transport::QueuePair& qp, uint64_t round) -> bool {
    Completion c[1];
    while (!stop.load(std::memory_order_relaxed)) {
      if (send) {
        if (self.recv_cq->Poll(absl::MakeSpan(c, 1)) == 1) {
          const uint32_t slot = size + transport::kGrhBytes;
          Sge sge{self.addr(c[0].wr_id * slot), slot, self.mr->lkey()};
          transport::RecvWr wr;
          wr.wr_id = c[0].wr_id;
          wr.sg_list = &sge;
          wr.num_sge = 1;
          transport::RecvWr* bad = nullptr;
          BENCH_CHECK_OK(qp.PostRecv(&wr, &bad));
          return true;
        }
      } else {
        uint64_t seen;
        std::memcpy(&seen, self.bytes() + size - sizeof(seen), sizeof(seen));
        std::atomic_thread_fence(std::memory_order_acquire);
        if (seen == round) return true;
      }
    }
    return false;
  };
  std::thread echo([&] {
    for (uint64_t round = 1; await(p->receiver, *p->in, round); ++round) {
      bounce(p->receiver, *p->in, p->sender, p->to_sender.get(), p->out->qp_num(), round);
    }
  });
  bench::Histogram rtt;
  const absl::Time end = absl::Now() + absl::Seconds(FLAGS_duration_s);
  uint64_t rounds = 0;
  for (uint64_t round = 1; absl::Now() < end; ++round) {
    const absl::Time start = absl::Now();
    bounce(p->sender, *p->out, p->receiver, p->to_receiver.get(), p->in->qp_num(), round);
    if (!await(p->sender, *p->out, round)) break;
    rtt.Record(absl::ToInt64Nanoseconds(absl::Now() - start));
    ++rounds;
  }
  stop = true;
  echo.join();
  printf(
      "{\"kind\":\"pingpong\",\"verb\":\"%s\",\"qp_type\":\"%s\",\"msg_size\":%u,"
      "\"threads\":1,\"mops\":%.4f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"counters\":%s}\n",
      verb.name, transport::ToString(verb.type), size,
      static_cast<double>(rounds) / FLAGS_duration_s / 1e6, rtt.Quantile(0.5) / 1e3,
      rtt.Quantile(0.99) / 1e3, CountersJson(*p).c_str());
  fflush(stdout);
}

// A UD endpoint of the fan rows: a device of its own and a UD QP with `recv_depth` receives,
// ready for Q_Key kQkey. `ah` is the sending side's handle to the other end where the caller
// sets one. Members go in verbs order (the AH and the QP before the node that made them).
struct UdEnd {
  Node node;
  std::unique_ptr<transport::QueuePair> qp;
  std::unique_ptr<transport::AddressHandle> ah;
  uint32_t qp_num = 0;
};

std::unique_ptr<UdEnd> OpenUdEnd(const transport::DeviceOptions& options,
                                 uint32_t recv_depth = kQueueDepth) {
  auto end = std::make_unique<UdEnd>();
  end->node = OpenNode(options);
  end->qp = MakeQp(end->node, QpType::kUd, recv_depth);
  transport::ConnectConfig connect;
  connect.qkey = kQkey;
  BENCH_CHECK_OK(end->qp->Connect(connect));
  end->qp_num = end->qp->qp_num();
  return end;
}

// The fan rows' receiving thread: polls every end in turn, reposts what completed, and keeps
// the count in *delivered, until *stop.
std::thread StartReceiving(std::vector<UdEnd*> ends, uint32_t size, const std::atomic<bool>* stop,
                           std::atomic<uint64_t>* delivered) {
  return std::thread([ends = std::move(ends), size, stop, delivered] {
    Reposter reposter(size);
    uint64_t got_total = 0;
    while (!stop->load(std::memory_order_relaxed)) {
      for (UdEnd* end : ends) got_total += reposter.PollAndRepost(end->node, *end->qp);
      delivered->store(got_total, std::memory_order_relaxed);
    }
  });
}

// Fan-in: `senders` threads SEND `size`-byte UD messages in chains of `chain` to one receiver.
void FanInRow(const transport::DeviceOptions& options, uint32_t size, uint32_t senders,
              uint32_t chain) {
  std::unique_ptr<UdEnd> receiver = OpenUdEnd(options, kFanReceives);
  PostReceives(*receiver->qp, receiver->node, kFanReceives, size);
  std::vector<std::unique_ptr<UdEnd>> sending;
  const transport::PortInfo port = receiver->node.device->port();
  for (uint32_t t = 0; t < senders; ++t) {
    sending.push_back(OpenUdEnd(options));
    sending.back()->ah = *sending.back()->node.pd->CreateAddressHandle({port.lid, port.gid});
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> delivered{0};
  std::thread receive = StartReceiving({receiver.get()}, size, &stop, &delivered);
  // The senders' own CPU time and WRs posted, over their whole run: CPU per SEND does not count
  // time a sender spent descheduled, so it holds on a machine busy with other work.
  std::atomic<int64_t> sender_cpu_ns{0};
  std::atomic<uint64_t> sender_wrs{0};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < senders; ++t) {
    threads.emplace_back([&, t] {
      const int64_t cpu_start = bench::ThreadCpuNs();
      uint64_t posted = 0;
      UdEnd& s = *sending[t];
      std::vector<SendWr> wrs;
      std::vector<Sge> sges;
      UdSendChain(s.node, size, chain, &wrs, &sges);
      for (SendWr& wr : wrs) {
        wr.ah = s.ah.get();
        wr.remote_qpn = receiver->qp_num;
      }
      Completion c[4];
      while (!stop.load(std::memory_order_relaxed)) {
        SendWr* bad = nullptr;
        BENCH_CHECK_OK(s.qp->PostSend(&wrs[0], &bad));
        posted += chain;
        while (s.node.send_cq->Poll(absl::MakeSpan(c, 4)) == 0 &&
               !stop.load(std::memory_order_relaxed)) {
        }
      }
      sender_cpu_ns.fetch_add(bench::ThreadCpuNs() - cpu_start);
      sender_wrs.fetch_add(posted);
    });
  }
  // Measured after a short warm-up, from the receiver's count.
  const auto [messages, seconds] = MeasureDelivered(delivered);
  stop = true;
  for (std::thread& t : threads) t.join();
  receive.join();
  // A row that measured nothing is a failure, not a rate of 0.
  CHECK_GT(messages, 0u) << "fan-in: no message was delivered in " << seconds << " s";
  transport::CounterSnapshot counters;
  counters.Add(receiver->qp->counters());
  counters.Add(receiver->node.recv_cq->counters());
  const uint64_t dropped = receiver->qp->counters().dropped.Get();
  const double mops = static_cast<double>(messages) / seconds / 1e6;
  printf(
      "{\"kind\":\"fanin\",\"verb\":\"SEND\",\"qp_type\":\"UD\",\"msg_size\":%u,"
      "\"senders\":%u,\"chain\":%u,\"mops\":%.4f,\"ns_per_send\":%.1f,"
      "\"sender_cpu_ns_per_send\":%.1f,\"dropped_at_receiver\":%lu,\"receiver_counters\":%s}\n",
      size, senders, chain, mops, mops > 0 ? 1e3 / mops : 0.0,
      static_cast<double>(sender_cpu_ns.load()) / static_cast<double>(sender_wrs.load()), dropped,
      counters.ToJson().c_str());
  fflush(stdout);
}

// One thread, both ends: SENDs a chain of `chain` `size`-byte UD messages to a receiver on
// another device, takes them there (poll, repost) and reaps the sender's completion. A SEND's
// whole cost on one core with no other thread contending: with valgrind's callgrind, a count of
// instructions per SEND that does not depend on how busy the machine is.
void UdLoopRow(const transport::DeviceOptions& options, uint32_t size, uint32_t chain) {
  std::unique_ptr<UdEnd> receiver = OpenUdEnd(options, kFanReceives);
  PostReceives(*receiver->qp, receiver->node, kFanReceives, size);
  std::unique_ptr<UdEnd> sender = OpenUdEnd(options);
  const transport::PortInfo port = receiver->node.device->port();
  sender->ah = *sender->node.pd->CreateAddressHandle({port.lid, port.gid});
  std::vector<SendWr> wrs;
  std::vector<Sge> sges;
  UdSendChain(sender->node, size, chain, &wrs, &sges);
  for (SendWr& wr : wrs) {
    wr.ah = sender->ah.get();
    wr.remote_qpn = receiver->qp_num;
  }
  Reposter reposter(size);
  Completion c[4];
  uint64_t delivered = 0;
  const int64_t cpu_start = bench::ThreadCpuNs();
  const absl::Time end = absl::Now() + absl::Seconds(FLAGS_duration_s);
  while (absl::Now() < end) {
    for (int round = 0; round < 64; ++round) {
      SendWr* bad = nullptr;
      BENCH_CHECK_OK(sender->qp->PostSend(&wrs[0], &bad));
      for (uint64_t got = 0; got < chain;)
        got += reposter.PollAndRepost(receiver->node, *receiver->qp);
      delivered += chain;
      while (sender->node.send_cq->Poll(absl::MakeSpan(c, 4)) == 0) {
      }
    }
  }
  const int64_t cpu_ns = bench::ThreadCpuNs() - cpu_start;
  CHECK_EQ(receiver->qp->counters().dropped.Get(), 0u) << "udloop: a SEND found no receive";
  printf(
      "{\"kind\":\"udloop\",\"verb\":\"SEND\",\"qp_type\":\"UD\",\"msg_size\":%u,"
      "\"chain\":%u,\"sends\":%lu,\"cpu_ns_per_send\":%.1f}\n",
      size, chain, delivered, static_cast<double>(cpu_ns) / static_cast<double>(delivered));
  fflush(stdout);
}

// Fan-out: one sender SENDs `size`-byte UD messages in chains of `chain`, each WR of a chain to
// the next of `receivers` receivers (each its own device, UD QP and CQ, as herd clients are): a
// herd worker posting one batch's answers. One thread polls every receiver and reposts.
void FanOutRow(const transport::DeviceOptions& options, uint32_t size, uint32_t receivers,
               uint32_t chain) {
  std::unique_ptr<UdEnd> sender = OpenUdEnd(options);
  // Declared after the sender: destroyed first, their AHs (the sender's) with them.
  std::vector<std::unique_ptr<UdEnd>> receiving;
  for (uint32_t r = 0; r < receivers; ++r) {
    receiving.push_back(OpenUdEnd(options, kFanReceives));
    UdEnd& receiver = *receiving.back();
    PostReceives(*receiver.qp, receiver.node, kFanReceives, size);
    const transport::PortInfo port = receiver.node.device->port();
    receiver.ah = *sender->node.pd->CreateAddressHandle({port.lid, port.gid});
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> delivered{0};
  std::vector<UdEnd*> polled;
  for (auto& r : receiving) polled.push_back(r.get());
  std::thread receive = StartReceiving(std::move(polled), size, &stop, &delivered);
  int64_t sender_cpu_ns = 0;
  uint64_t sender_wrs = 0;
  std::thread send([&] {
    const int64_t cpu_start = bench::ThreadCpuNs();
    std::vector<SendWr> wrs;
    std::vector<Sge> sges;
    UdSendChain(sender->node, size, chain, &wrs, &sges);
    Completion c[4];
    uint64_t next_receiver = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      for (uint32_t i = 0; i < chain; ++i, ++next_receiver) {
        const UdEnd& r = *receiving[next_receiver % receivers];
        wrs[i].ah = r.ah.get();
        wrs[i].remote_qpn = r.qp_num;
      }
      SendWr* bad = nullptr;
      BENCH_CHECK_OK(sender->qp->PostSend(&wrs[0], &bad));
      sender_wrs += chain;
      while (sender->node.send_cq->Poll(absl::MakeSpan(c, 4)) == 0 &&
             !stop.load(std::memory_order_relaxed)) {
      }
    }
    sender_cpu_ns = bench::ThreadCpuNs() - cpu_start;
  });
  const auto [messages, seconds] = MeasureDelivered(delivered);
  stop = true;
  send.join();
  receive.join();
  CHECK_GT(messages, 0u) << "fan-out: no message was delivered in " << seconds << " s";
  uint64_t dropped = 0;
  for (auto& r : receiving) dropped += r->qp->counters().dropped.Get();
  const double mops = static_cast<double>(messages) / seconds / 1e6;
  printf(
      "{\"kind\":\"fanout\",\"verb\":\"SEND\",\"qp_type\":\"UD\",\"msg_size\":%u,"
      "\"receivers\":%u,\"chain\":%u,\"mops\":%.4f,\"ns_per_send\":%.1f,"
      "\"sender_cpu_ns_per_send\":%.1f,\"dropped_at_receivers\":%lu,\"sender_counters\":%s}\n",
      size, receivers, chain, mops, 1e3 / mops,
      static_cast<double>(sender_cpu_ns) / static_cast<double>(sender_wrs), dropped,
      SenderCountersJson(*sender->qp, *sender->node.send_cq).c_str());
  fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("fabric_bench: verbs message rate and latency (JSON lines)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  absl::StatusOr<transport::DeviceOptions> options = transport::DeviceOptionsFromFlags();
  if (!options.ok()) {
    fprintf(stderr, "fabric_bench: %s\n", options.status().ToString().c_str());
    return 2;
  }
  options->fabric = absl::StrFormat("fabric-bench-%d", getpid());
  std::vector<uint32_t> sizes;
  const std::vector<std::string> size_texts = absl::StrSplit(FLAGS_msg_sizes, ',');
  for (const std::string& text : size_texts) {
    uint32_t size = 0;
    if (!absl::SimpleAtoi(text, &size) || size < sizeof(uint64_t) || size > (1u << 16)) {
      fprintf(stderr, "fabric_bench: --msg_sizes: '%s' is not a size in [8, 65536]\n",
              text.c_str());
      return 2;
    }
    sizes.push_back(size);
  }
  if (FLAGS_chain == 0 || FLAGS_chain > kQueueDepth / 2 || FLAGS_signal_every == 0 ||
      FLAGS_signal_every > kQueueDepth / 2) {
    fprintf(stderr, "fabric_bench: --chain and --signal_every must be in [1, %u]\n",
            kQueueDepth / 2);
    return 2;
  }
  const Verb verbs[] = {{"WRITE", QpType::kUc, transport::Opcode::kWrite},
                        {"WRITE", QpType::kRc, transport::Opcode::kWrite},
                        {"SEND", QpType::kUd, transport::Opcode::kSend},
                        {"READ", QpType::kRc, transport::Opcode::kRead}};
  const std::vector<std::string> rows = absl::StrSplit(FLAGS_rows, ',', absl::SkipEmpty());
  auto wants = [&](const char* row) {
    return std::find(rows.begin(), rows.end(), row) != rows.end();
  };
  std::vector<uint32_t> fanin_senders;
  for (const std::string& text :
       std::vector<std::string>(absl::StrSplit(FLAGS_fanin_senders, ',', absl::SkipEmpty()))) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(text, &n) || n == 0 || n > 64) {
      fprintf(stderr, "fabric_bench: --fanin_senders: '%s' is not a count in [1, 64]\n",
              text.c_str());
      return 2;
    }
    fanin_senders.push_back(n);
  }
  for (const Verb& verb : verbs) {
    if (!wants("rate")) break;
    for (uint32_t size : sizes) {
      if (verb.type == QpType::kUd && size > options->mtu) continue;
      for (uint32_t threads = 1; threads <= FLAGS_max_threads; ++threads) {
        RateRow(*options, verb, size, threads, 1);
        RateRow(*options, verb, size, threads, FLAGS_chain);
      }
    }
  }
  for (uint32_t size : sizes) {
    if (!wants("pingpong")) break;
    PingPongRow(*options, verbs[0], size);
    if (size <= options->mtu) PingPongRow(*options, verbs[2], size);
  }
  for (uint32_t size : sizes) {
    if (!wants("fanin") || size > options->mtu) continue;
    if (!FanReceivesFit(size)) {
      fprintf(stderr, "fabric_bench: no fan-in row for %u bytes: %u receives do not fit %zu\n",
              size, kFanReceives, kBufferBytes);
      continue;
    }
    for (uint32_t n : fanin_senders) FanInRow(*options, size, n, FLAGS_chain);
  }
  for (uint32_t size : sizes) {
    if (!wants("udloop") || size > options->mtu || !FanReceivesFit(size)) continue;
    UdLoopRow(*options, size, FLAGS_chain);
  }
  for (uint32_t size : sizes) {
    if (!wants("fanout") || size > options->mtu) continue;
    if (!FanReceivesFit(size)) {
      fprintf(stderr, "fabric_bench: no fan-out row for %u bytes: %u receives do not fit %zu\n",
              size, kFanReceives, kBufferBytes);
      continue;
    }
    if (FLAGS_fanout_receivers == 0 || FLAGS_fanout_receivers > 256) {
      fprintf(stderr, "fabric_bench: --fanout_receivers=%u: want 1..256\n", FLAGS_fanout_receivers);
      return 2;
    }
    FanOutRow(*options, size, FLAGS_fanout_receivers, FLAGS_chain);
  }
  return 0;
}
