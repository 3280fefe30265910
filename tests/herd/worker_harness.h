// A Worker driven directly on the in-process shm fabric, for unit tests of its rules: the
// test owns the worker's request region (it writes request bytes straight into slots, as a
// client's WRITE would land), plays the client with a UD QP of its own (responses arrive on its
// receive CQ), and runs Worker::Run on a thread. See worker_rules_test.cc for how "no answer"
// is proved without a sleep (Barrier()).
#ifndef HERD_TESTS_HERD_WORKER_HARNESS_H_
#define HERD_TESTS_HERD_WORKER_HARNESS_H_

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "herd/config.h"
#include "herd/protocol.h"
#include "herd/replication/outcome_table.h"
#include "herd/response_gate.h"
#include "herd/send_queue.h"
#include "herd/worker.h"
#include "mica/config.h"
#include "mica/keyhash.h"
#include "mica/partition.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

namespace herd::worker_test {

constexpr uint32_t kWorkers = 2;  // the worker under test is worker 0; keys of worker 1 exist
constexpr uint32_t kWorkerIndex = 0;
constexpr uint32_t kWindow = 4;
constexpr uint32_t kMaxClients = 8;
constexpr uint32_t kProbeClient = kMaxClients - 1;  // Barrier()'s own client id
constexpr uint32_t kSqDepth = 64;
constexpr uint32_t kRecvDepth = 64;
constexpr uint32_t kClientReceives = 128;
constexpr uint32_t kSendCqSlack = 256;
constexpr uint32_t kClientQkey = 0x00C0FFEE;
constexpr uint64_t kSecret = 0x1111222233334444ULL;
constexpr uint64_t kOtherSecret = 0x5555666677778888ULL;  // another session's key
constexpr uint32_t kGeneration = 1;
constexpr uint16_t kSessionQueueSlot = 1;  // after the worker's one UD queue
constexpr uint8_t kSessionQueueGeneration = 1;
// A wait for something that must happen: generous (ASan, a loaded 2-core machine).
constexpr absl::Duration kDeadline = absl::Seconds(20);
// The worker's grace for a slot whose bytes do not check out (worker.cc: kIncompleteGraceNs).
constexpr absl::Duration kIncompleteGrace = absl::Milliseconds(10);
// An "incomplete, then completed" scenario counts only if the bytes were completed this soon
// after the marker landed (well inside the grace); a slower run retries with a new request.
constexpr absl::Duration kInTime = absl::Milliseconds(7);
constexpr int kInTimeTries = 8;

inline Config TestConfig(RequestVerb request, ResponseVerb response) {
  Config c;
  c.request_verb = request;
  c.response_verb = response;
  c.workers = kWorkers;
  c.ud_qps_per_worker = 1;
  c.window = kWindow;
  c.postlist = 16;
  c.unsig_batch = 16;
  c.sq_depth = kSqDepth;
  c.slot_bytes = 256;
  c.max_key_bytes = 16;
  c.max_clients = kMaxClients;
  c.recv_depth = kRecvDepth;
  return c;
}

// The n-th key ("key<i>") that belongs to `worker`.
inline std::string KeyOf(uint32_t worker, int n) {
  for (int i = 0;; ++i) {
    std::string key = absl::StrCat("key", i);
    if (mica::PartitionOf(mica::KeyHash(key), kWorkers) == worker && n-- == 0) return key;
  }
}

struct Request {
  Op op = Op::kGet;
  std::string key;
  std::string value;
  uint64_t expected_version = 0;
  uint32_t client = 0;
  uint64_t seq = 1;
  uint32_t attempt = 0;
  uint64_t secret = kSecret;
};

inline std::vector<uint8_t> Encode(const Request& r) {
  RequestHeader h{};
  h.keyhash = mica::KeyHash(r.key);
  h.expected_version = r.expected_version;
  h.value_bytes = static_cast<uint32_t>(r.value.size());
  h.key_bytes = static_cast<uint16_t>(r.key.size());
  h.op = static_cast<uint8_t>(r.op);
  h.attempt = r.attempt;
  h.seq = r.seq;
  std::vector<uint8_t> bytes(RequestBytes(r.op, h.key_bytes, h.value_bytes));
  EncodeRequest(h, r.key, r.value, r.secret, bytes.data());
  return bytes;
}

struct Response {
  ResponseHeader header;
  std::string value;
  uint32_t src_qp = 0;
};

inline std::atomic_ref<uint64_t> Word(uint8_t* p) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(p));
}

template <typename T>
inline T Take(absl::StatusOr<T> v) {
  EXPECT_TRUE(v.ok()) << v.status();
  return *std::move(v);
}

class Harness {
 public:
  // `gate`, if not null, is the worker's ResponseGate (it must outlive the harness).
  // `outcome_table`: the partition keeps a replicated server's outcome table
  // (herd/replication/outcome_table.h).
  explicit Harness(const Config& config, ResponseGate* gate = nullptr, bool outcome_table = false)
      : config_(config) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    transport::DeviceOptions options;
    options.name = "shm";
    options.fabric = absl::StrCat("worker_rules_", info->name(), "_", getpid());
    device_ = Take(transport::OpenDevice(options));
    pd_ = Take(device_->AllocatePd());
    send_cq_ = Take(device_->CreateCq(kSqDepth + kSendCqSlack));
    recv_cq_ = Take(device_->CreateCq(kRecvDepth + 1));
    idle_cq_ = Take(device_->CreateCq(16));
    transport::QpConfig qc;
    qc.type = transport::QpType::kUd;
    qc.send_cq = send_cq_.get();
    qc.recv_cq = recv_cq_.get();
    qc.max_send_wr = kSqDepth;
    qc.max_recv_wr = config.request_uses_slots() ? 1 : kRecvDepth;
    qc.max_inline_data = config.max_inline;
    worker_qp_ = Take(pd_->CreateQp(qc));
    transport::ConnectConfig connect;
    connect.qkey = kQkey;
    EXPECT_TRUE(worker_qp_->Connect(connect).ok());

    response_bytes_ = ResponseBytes(config.slot_value_bytes());
    region_ = Allocate(config.region_bytes());
    staging_ = Allocate(uint64_t{kSqDepth} * response_bytes_);
    staging_mr_ = Register(*pd_, *staging_, transport::kLocalWrite);
    WorkerMemory memory;
    memory.region = region_->data();
    memory.staging = staging_->data();
    memory.staging_lkey = staging_mr_->lkey();
    if (!config.request_uses_slots()) {
      // As the server sizes them: a whole path-MTU payload per receive.
      memory.receive_bytes =
          transport::kGrhBytes + std::max(config.slot_bytes, device_->port().active_mtu);
      receives_ = Allocate(uint64_t{kRecvDepth} * memory.receive_bytes);
      receives_mr_ = Register(*pd_, *receives_, transport::kLocalWrite);
      memory.receives = receives_->data();
      memory.receives_lkey = receives_mr_->lkey();
    }

    // The client: its own PD, a UD QP with the session's qkey, receives for responses.
    client_pd_ = Take(device_->AllocatePd());
    client_send_cq_ = Take(device_->CreateCq(256));
    client_recv_cq_ = Take(device_->CreateCq(kClientReceives + 1));
    client_qp_ = MakeClientUdQp();
    client_buffers_ = Allocate(uint64_t{kClientReceives} * ClientReceiveBytes() + 2 * 4096);
    client_mr_ =
        Register(*client_pd_, *client_buffers_, transport::kLocalWrite | transport::kRemoteWrite);
    for (uint32_t i = 0; i < kClientReceives; ++i) PostClientReceive(i);
    route_ah_ = Take(pd_->CreateAddressHandle({0, client_qp_->endpoint().gid}));
    client_ah_ = Take(client_pd_->CreateAddressHandle({0, worker_qp_->endpoint().gid}));

    mica::PartitionConfig store;
    store.log_bytes = uint64_t{1} << 20;
    store.expected_items = 1024;
    store.max_value_bytes = config.slot_value_bytes();
    store.try_hugepages = false;
    if (outcome_table) store.owner_area_bytes = OutcomeTableBytes(config);
    worker_ = std::make_unique<Worker>(kWorkerIndex, config, Take(mica::Partition::Create(store)),
                                       std::vector<transport::QueuePair*>{worker_qp_.get()},
                                       send_cq_.get(), recv_cq_.get(), memory, gate);
    EXPECT_TRUE(worker_->PostInitialReceives().ok());

    if (config.response_uses_slots()) SetUpWriteResponses();
    for (uint32_t c = 0; c < kMaxClients; ++c) Publish(c, MakeRoute(kSecret, kGeneration));
    thread_ = std::thread([this] { worker_->Run(stop_); });
  }

  ~Harness() {
    stop_.store(true);
    thread_.join();
    worker_.reset();
  }

  const Config& config() const { return config_; }
  Worker& worker() { return *worker_; }
  const WorkerCounters& counters() const { return worker_->counters(); }
  const mica::PartitionStats& stats() const { return worker_->partition().stats(); }
  transport::QueuePair& worker_qp() { return *worker_qp_; }
  transport::QueuePair& client_qp() { return *client_qp_; }

  // A route as the server builds one for a session.
  ClientRoute MakeRoute(uint64_t secret, uint32_t generation) const {
    ClientRoute r;
    r.ah = route_ah_.get();
    r.ud_qpn = client_qp_->qp_num();
    r.ud_gid = device_->port().gid;  // the client QP lives on the same device
    r.ud_qkey = kClientQkey;
    r.secret = secret;
    r.generation = generation;
    r.response_queue = kSessionQueueSlot;
    r.response_addr = response_region_addr_;
    r.response_rkey = response_mr_ ? response_mr_->rkey() : 0;
    return r;
  }
  // Publishes a route for `client` (kept alive until the harness goes).
  void Publish(uint32_t client, ClientRoute route) {
    if (config_.response_uses_slots()) {
      route.response_addr =
          response_region_addr_ + uint64_t{client} * kWindow * config_.response_slot_bytes();
    }
    routes_.push_back(std::make_unique<ClientRoute>(route));
    worker_->PublishRoute(client, routes_.back().get());
  }

  // The window slot a request lands in, and its marker.
  uint8_t* SlotOf(uint32_t client, uint64_t seq) {
    return region_->data() + config_.SlotOffset(kWorkerIndex, client, seq % kWindow);
  }
  uint8_t* MarkerOf(uint32_t client, uint64_t seq) {
    return SlotOf(client, seq) + config_.slot_bytes - sizeof(uint64_t);
  }
  uint64_t Marker(uint32_t client, uint64_t seq) {
    return Word(MarkerOf(client, seq)).load(std::memory_order_acquire);
  }

  // Lands `bytes` at the end of the slot as a WRITE would: everything, then the marker.
  void Land(uint32_t client, uint64_t seq, const std::vector<uint8_t>& bytes) {
    uint8_t* end = SlotOf(client, seq) + config_.slot_bytes;
    const size_t body = bytes.size() - sizeof(uint64_t);
    std::memcpy(end - bytes.size(), bytes.data(), body);
    uint64_t marker;
    std::memcpy(&marker, bytes.data() + body, sizeof(marker));
    Word(end - sizeof(uint64_t)).store(marker, std::memory_order_release);
  }
  // Overwrites part of a landed request (bytes landing late): [offset, offset + n) of `bytes`.
  void LandPart(uint32_t client, uint64_t seq, const std::vector<uint8_t>& bytes, size_t offset,
                size_t n) {
    uint8_t* start = SlotOf(client, seq) + config_.slot_bytes - bytes.size();
    std::memcpy(start + offset, bytes.data() + offset, n);
    std::atomic_thread_fence(std::memory_order_release);
  }

  // Sends `bytes` as a UD request from `qp` (request_verb = ud_send) naming `client` in its
  // immediate (nullopt: a plain SEND, no immediate).
  void SendUd(transport::QueuePair& qp, const std::vector<uint8_t>& bytes,
              std::optional<uint32_t> client) {
    uint8_t* buffer = SendBuffer();
    ASSERT_LE(bytes.size(), 4096u);
    std::memcpy(buffer, bytes.data(), bytes.size());
    transport::Sge sge{reinterpret_cast<uint64_t>(buffer), static_cast<uint32_t>(bytes.size()),
                       client_mr_->lkey()};
    transport::SendWr wr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = client.has_value() ? transport::Opcode::kSendWithImm : transport::Opcode::kSend;
    wr.imm_data = client.value_or(0);
    wr.flags = transport::kSignaled;
    wr.ah = client_ah_.get();
    wr.remote_qpn = worker_qp_->qp_num();
    wr.remote_qkey = kQkey;
    transport::SendWr* bad = nullptr;
    ASSERT_TRUE(qp.PostSend(&wr, &bad).ok());
    transport::Completion c;
    const absl::Time give_up = absl::Now() + kDeadline;
    while (client_send_cq_->Poll(absl::MakeSpan(&c, 1)) == 0) {
      ASSERT_LT(absl::Now(), give_up) << "no send completion";
    }
    ASSERT_EQ(c.status, transport::CompletionStatus::kSuccess);
  }

  // Delivers a request the configured way.
  void Submit(const Request& r) {
    if (config_.request_uses_slots()) {
      Land(r.client, r.seq, Encode(r));
    } else {
      SendUd(*client_qp_, Encode(r), r.client);
    }
  }

  // The next UD response to the client, or nullopt after `deadline`.
  std::optional<Response> NextResponse(absl::Duration deadline = kDeadline) {
    const absl::Time give_up = absl::Now() + deadline;
    transport::Completion c;
    while (client_recv_cq_->Poll(absl::MakeSpan(&c, 1)) == 0) {
      if (absl::Now() > give_up) return std::nullopt;
      std::this_thread::yield();
    }
    EXPECT_EQ(c.status, transport::CompletionStatus::kSuccess);
    const uint8_t* buffer = client_buffers_->data() + c.wr_id * ClientReceiveBytes();
    Response out;
    out.src_qp = c.src_qp;
    ParsedResponse parsed;
    EXPECT_TRUE(ParseResponse(buffer + transport::kGrhBytes, c.byte_len - transport::kGrhBytes, 0,
                              &parsed));
    out.header = parsed.header;
    out.header.client_id = c.imm_data;
    out.value.assign(reinterpret_cast<const char*>(parsed.value), parsed.header.value_bytes);
    PostClientReceive(static_cast<uint32_t>(c.wr_id));
    return out;
  }

  // Submits and returns the answer (failing the test when none comes).
  Response Call(const Request& r) {
    Submit(r);
    std::optional<Response> got = NextResponse();
    EXPECT_TRUE(got.has_value()) << "no answer to seq " << r.seq;
    if (!got) return Response{};
    EXPECT_EQ(got->header.seq, r.seq);
    EXPECT_EQ(got->header.client_id, r.client);
    return *got;
  }

  // Two probe round trips (see the file comment); returns every other response that arrived
  // before the probes' (so: the answers of everything handled before them).
  std::vector<Response> Barrier() {
    std::vector<Response> others;
    for (int round = 0; round < 2; ++round) {
      Request probe;
      probe.op = Op::kGet;
      probe.key = KeyOf(kWorkerIndex, 999);
      probe.client = kProbeClient;
      probe.seq = ++probe_seq_;
      Submit(probe);
      for (;;) {
        std::optional<Response> got = NextResponse();
        if (!got) {
          ADD_FAILURE() << "the probe was never answered";
          return others;
        }
        if (got->header.client_id == kProbeClient && got->header.seq == probe.seq) break;
        others.push_back(*got);
      }
    }
    // The probe's answer arrives while the worker is still in the loop that posted it, before it
    // publishes what it posted (QueueProgress): once its next loop begins (the epoch, seq_cst,
    // stored after), counters read by the test include everything up to the probes.
    const uint64_t epoch = worker_->epoch();
    const absl::Time give_up = absl::Now() + kDeadline;
    while (worker_->epoch() == epoch && absl::Now() < give_up) std::this_thread::yield();
    return others;
  }
  uint64_t probes() const { return probe_seq_; }

  // Waits until the marker of (client, seq) is consumed.
  bool AwaitConsumed(uint32_t client, uint64_t seq) {
    const absl::Time give_up = absl::Now() + kDeadline;
    while (Marker(client, seq) != 0) {
      if (absl::Now() > give_up) return false;
      std::this_thread::yield();
    }
    return true;
  }

  // response_verb = *_write: the client's response slot for (client, seq), and its marker.
  uint8_t* ResponseSlot(uint32_t client, uint64_t seq) {
    return reinterpret_cast<uint8_t*>(response_region_addr_) +
           (uint64_t{client} * kWindow + seq % kWindow) * config_.response_slot_bytes();
  }
  std::optional<ParsedResponse> AwaitWriteResponse(uint32_t client, uint64_t seq, uint64_t secret) {
    uint8_t* slot = ResponseSlot(client, seq);
    const uint32_t bytes = config_.response_slot_bytes();
    const absl::Time give_up = absl::Now() + kDeadline;
    while (SeqOfMarker(Word(slot + bytes - sizeof(uint64_t)).load(std::memory_order_acquire)) !=
           seq) {
      if (absl::Now() > give_up) {
        ADD_FAILURE() << "no WRITE response for seq " << seq;
        return std::nullopt;
      }
      std::this_thread::yield();
    }
    ParsedResponse parsed;
    if (!ParseResponse(slot, bytes, secret, &parsed)) {
      ADD_FAILURE() << "the WRITE response for seq " << seq << " does not verify";
      return std::nullopt;
    }
    parsed.header.client_id = client;  // the slot says whose it is
    return parsed;
  }

  std::unique_ptr<transport::QueuePair> MakeClientUdQp() {
    transport::QpConfig qc;
    qc.type = transport::QpType::kUd;
    qc.send_cq = client_send_cq_.get();
    qc.recv_cq = client_recv_cq_.get();
    qc.max_send_wr = 16;
    qc.max_recv_wr = kClientReceives;
    qc.max_inline_data = 0;
    auto qp = Take(client_pd_->CreateQp(qc));
    transport::ConnectConfig connect;
    connect.qkey = kClientQkey;
    EXPECT_TRUE(qp->Connect(connect).ok());
    return qp;
  }

 private:
  static std::unique_ptr<transport::SharedMemory> Allocate(uint64_t bytes) {
    return std::make_unique<transport::SharedMemory>(
        Take(transport::SharedMemory::Allocate(bytes, "worker-rules-test")));
  }
  static std::unique_ptr<transport::MemoryRegion> Register(transport::ProtectionDomain& pd,
                                                           transport::SharedMemory& memory,
                                                           uint32_t access) {
    return Take(pd.RegisterMemory(memory.data(), memory.size(), access));
  }
  uint32_t ClientReceiveBytes() const { return transport::kGrhBytes + response_bytes_; }
  uint8_t* SendBuffer() const {
    return client_buffers_->data() + uint64_t{kClientReceives} * ClientReceiveBytes();
  }
  void PostClientReceive(uint32_t i) {
    transport::Sge sge{
        reinterpret_cast<uint64_t>(client_buffers_->data() + uint64_t{i} * ClientReceiveBytes()),
        ClientReceiveBytes(), client_mr_->lkey()};
    transport::RecvWr wr;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    transport::RecvWr* bad = nullptr;
    EXPECT_TRUE(client_qp_->PostRecv(&wr, &bad).ok());
  }

  // A UC QP pair (the worker's side in its PD, sending on its send CQ) and the client's
  // response region, registered for remote writes.
  void SetUpWriteResponses() {
    const auto type = config_.response_verb == ResponseVerb::kRcWrite ? transport::QpType::kRc
                                                                      : transport::QpType::kUc;
    transport::QpConfig qc;
    qc.type = type;
    qc.send_cq = send_cq_.get();
    qc.recv_cq = idle_cq_.get();
    qc.max_send_wr = kSqDepth;
    qc.max_recv_wr = 1;
    qc.max_inline_data = config_.max_inline;
    response_qp_ = Take(pd_->CreateQp(qc));
    qc.send_cq = client_send_cq_.get();
    qc.recv_cq = idle_cq_.get();
    client_response_qp_ = Take(client_pd_->CreateQp(qc));
    transport::ConnectConfig to_client;
    to_client.remote = client_response_qp_->endpoint();
    transport::ConnectConfig to_worker;
    to_worker.remote = response_qp_->endpoint();
    EXPECT_TRUE(response_qp_->Connect(to_client).ok());
    EXPECT_TRUE(client_response_qp_->Connect(to_worker).ok());
    response_region_ = Allocate(uint64_t{kMaxClients} * kWindow * config_.response_slot_bytes());
    response_mr_ =
        Register(*client_pd_, *response_region_, transport::kLocalWrite | transport::kRemoteWrite);
    response_region_addr_ = reinterpret_cast<uint64_t>(response_region_->data());
    session_staging_ = Allocate(uint64_t{kSqDepth} * response_bytes_);
    session_staging_mr_ = Register(*pd_, *session_staging_, transport::kLocalWrite);
    queue_.qp = response_qp_.get();
    queue_.depth = kSqDepth;
    queue_.unsig_batch = config_.unsig_batch;
    queue_.table_slot = kSessionQueueSlot;
    queue_.generation = kSessionQueueGeneration;
    queue_.staging = session_staging_->data();
    queue_.staging_lkey = session_staging_mr_->lkey();
    queue_.buffer_bytes = response_bytes_;
    worker_->PublishQueue(kSessionQueueSlot, &queue_);
  }

  const Config config_;
  uint32_t response_bytes_ = 0;
  std::unique_ptr<transport::Device> device_;
  std::unique_ptr<transport::ProtectionDomain> pd_;
  std::unique_ptr<transport::ProtectionDomain> client_pd_;
  std::unique_ptr<transport::CompletionQueue> send_cq_, recv_cq_, idle_cq_;
  std::unique_ptr<transport::CompletionQueue> client_send_cq_, client_recv_cq_;
  std::unique_ptr<transport::SharedMemory> region_, staging_, receives_, client_buffers_;
  std::unique_ptr<transport::SharedMemory> response_region_, session_staging_;
  std::unique_ptr<transport::MemoryRegion> staging_mr_, receives_mr_, client_mr_;
  std::unique_ptr<transport::MemoryRegion> response_mr_, session_staging_mr_;
  std::unique_ptr<transport::QueuePair> worker_qp_, client_qp_;
  std::unique_ptr<transport::QueuePair> response_qp_, client_response_qp_;
  std::unique_ptr<transport::AddressHandle> route_ah_, client_ah_;
  uint64_t response_region_addr_ = 0;
  SendQueue queue_;
  std::vector<std::unique_ptr<ClientRoute>> routes_;
  uint64_t probe_seq_ = 0;
  // Last: the worker goes first (it holds pointers to everything above).
  std::unique_ptr<Worker> worker_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

inline Config SlotsAndUd() { return TestConfig(RequestVerb::kUcWrite, ResponseVerb::kUdSend); }

inline Request Put(uint32_t client, uint64_t seq, std::string key, std::string value) {
  return Request{Op::kPut, std::move(key), std::move(value), 0, client, seq};
}
inline Request Get(uint32_t client, uint64_t seq, std::string key) {
  return Request{Op::kGet, std::move(key), "", 0, client, seq};
}
inline Request Delete(uint32_t client, uint64_t seq, std::string key) {
  return Request{Op::kDelete, std::move(key), "", 0, client, seq};
}
inline Request Cas(uint32_t client, uint64_t seq, std::string key, uint64_t expected,
                   std::string value) {
  return Request{Op::kCas, std::move(key), std::move(value), expected, client, seq};
}

inline Status StatusOf(const Response& r) { return static_cast<Status>(r.header.status); }

}  // namespace herd::worker_test

#endif  // HERD_TESTS_HERD_WORKER_HARNESS_H_
