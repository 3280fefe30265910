// echo_server: the raw-fabric ceiling for herd (see echo_wire.h). One pinned thread polls the
// request slots and answers every request with a UD SEND carrying the request's tag; no store,
// no parsing. Accepts client connections until SIGINT/SIGTERM or --duration_s. The first stdout
// line, "echo_server ready port=N", says it accepts clients; the last is a JSON summary.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/echo/echo_wire.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/flags.h"
#include "herd/pinning.h"
#include "herd/protocol.h"
#include "herd/send_chains.h"
#include "herd/send_queue.h"
#include "herd/slot_scanner.h"
#include "transport/control/channel.h"
#include "transport/fabric.h"
#include "transport/flags.h"
#include "transport/shared_memory.h"
#include "util/server_process.h"

// --window, --slot_bytes, --max_clients, --postlist, --unsig_batch, --sq_depth and --max_inline
// are herd's own flags (//herd:flags), read through herd::ConfigFromFlags.
DEFINE_uint32(port, 31860, "TCP port of the control plane (0 picks a free one)");
DEFINE_string(listen_address, "0.0.0.0", "Address the control plane listens on");
DEFINE_int32(core, 0, "Core the echo thread is pinned to (-1: not pinned)");
DEFINE_double(duration_s, 0, "Stop after this many seconds (0: run until SIGINT/SIGTERM)");
DEFINE_uint32(key_bytes, 16, "Messages are sized as herd's GET of a key of this size ...");
DEFINE_uint32(value_bytes, 32, "... answered with a value of this size");

namespace bench::echo {
namespace {

using transport::Completion;
using transport::SendWr;
using transport::Sge;

// A joined logical client: where its responses go. The accept thread fills qpn and then
// publishes ah (release); the echo thread reads ah first (acquire).
struct Route {
  std::atomic<transport::AddressHandle*> ah{nullptr};
  uint32_t qpn = 0;
};

// One client connection and what the server holds for it until it exits.
struct Session {
  transport::control::Channel channel;
  std::unique_ptr<transport::QueuePair> request_qp;
  std::unique_ptr<transport::AddressHandle> ah;
};

constexpr absl::Duration kAcceptPoll = absl::Milliseconds(100);
constexpr absl::Duration kHelloTimeout = absl::Seconds(5);
// How long the echo thread waits for send-queue room before it drops a response (as herd's
// worker does: a dead client must not stall everyone).
constexpr absl::Duration kMaxWaitForRoom = absl::Milliseconds(100);
constexpr uint32_t kReapsPerClockCheck = 256;

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Create(const EchoConfig& config,
                                                        transport::PagePolicy pages,
                                                        const transport::DeviceOptions& device);
  // The echo thread's loop: scan, answer, reap, until `stop`.
  void Run(const std::atomic<bool>& stop);
  // Accepts one connection if one arrives within kAcceptPoll.
  absl::Status AcceptOne(transport::control::Listener& listener);
  uint64_t responses() const { return responses_.Get(); }
  uint64_t dropped() const { return dropped_.Get(); }
  transport::CounterSnapshot counters() const;

 private:
  explicit Server(const EchoConfig& config)
      : config_(config), routes_(config.max_clients), chains_(config.postlist) {}
  void Reap();

  EchoConfig config_;
  std::unique_ptr<transport::Device> device_;
  std::unique_ptr<transport::ProtectionDomain> pd_;
  std::unique_ptr<transport::CompletionQueue> send_cq_, recv_cq_;
  std::unique_ptr<transport::SharedMemory> region_, staging_;
  std::unique_ptr<transport::MemoryRegion> region_mr_, staging_mr_;
  std::unique_ptr<transport::QueuePair> ud_qp_;
  herd::SendQueue queue_;
  std::vector<Route> routes_;
  std::vector<Session> sessions_;
  uint32_t joined_ = 0;  // accept thread only
  // joined_ as published to the echo thread (after the routes): it scans clients 0..joined-1,
  // as herd's worker scans only clients with a route.
  std::atomic<uint32_t> joined_published_{0};
  // Echo thread state, preallocated.
  herd::SendChains chains_;
  std::vector<Completion> completions_;
  transport::Counter responses_, dropped_;  // written by the echo thread only
};

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const EchoConfig& config,
                                                       transport::PagePolicy pages,
                                                       const transport::DeviceOptions& device) {
  std::unique_ptr<Server> s(new Server(config));
  absl::StatusOr<std::unique_ptr<transport::Device>> opened = transport::OpenDevice(device);
  if (!opened.ok()) return opened.status();
  s->device_ = std::move(*opened);
  if (absl::Status v = Validate(config, s->device_->port().active_mtu); !v.ok()) return v;
  auto pd = s->device_->AllocatePd();
  if (!pd.ok()) return pd.status();
  s->pd_ = std::move(*pd);
  auto send_cq = s->device_->CreateCq(config.sq_depth);
  auto recv_cq = s->device_->CreateCq(1);
  if (!send_cq.ok()) return send_cq.status();
  if (!recv_cq.ok()) return recv_cq.status();
  s->send_cq_ = std::move(*send_cq);
  s->recv_cq_ = std::move(*recv_cq);
  // The same pages as herd's server gets from the same --hugepages.
  auto region = transport::SharedMemory::Allocate(config.region_bytes(), "echo-requests", pages);
  auto staging = transport::SharedMemory::Allocate(
      uint64_t{config.sq_depth} * config.response_bytes, "echo-staging", pages);
  if (!region.ok()) return region.status();
  if (!staging.ok()) return staging.status();
  s->region_ = std::make_unique<transport::SharedMemory>(std::move(*region));
  s->staging_ = std::make_unique<transport::SharedMemory>(std::move(*staging));
  auto region_mr = s->pd_->RegisterMemory(s->region_->data(), s->region_->size(),
                                          transport::kLocalWrite | transport::kRemoteWrite);
  auto staging_mr =
      s->pd_->RegisterMemory(s->staging_->data(), s->staging_->size(), transport::kLocalWrite);
  if (!region_mr.ok()) return region_mr.status();
  if (!staging_mr.ok()) return staging_mr.status();
  s->region_mr_ = std::move(*region_mr);
  s->staging_mr_ = std::move(*staging_mr);
  transport::QpConfig qp;
  qp.type = transport::QpType::kUd;
  qp.send_cq = s->send_cq_.get();
  qp.recv_cq = s->recv_cq_.get();
  qp.max_send_wr = config.sq_depth;
  qp.max_recv_wr = 1;
  qp.max_inline_data = config.max_inline;
  auto ud = s->pd_->CreateQp(qp);
  if (!ud.ok()) return ud.status();
  s->ud_qp_ = std::move(*ud);
  transport::ConnectConfig connect;
  connect.qkey = kEchoQkey;
  if (absl::Status c = s->ud_qp_->Connect(connect); !c.ok()) return c;
  s->queue_.qp = s->ud_qp_.get();
  s->queue_.depth = config.sq_depth;
  s->queue_.unsig_batch = config.unsig_batch;
  s->queue_.staging = s->staging_->data();
  s->queue_.staging_lkey = s->staging_mr_->lkey();
  s->queue_.buffer_bytes = config.response_bytes;
  s->completions_.resize(config.sq_depth);
  return s;
}

absl::Status Server::AcceptOne(transport::control::Listener& listener) {
  absl::StatusOr<transport::control::Channel> channel = listener.Accept(kAcceptPoll);
  if (absl::IsDeadlineExceeded(channel.status())) return absl::OkStatus();
  if (!channel.ok()) return channel.status();
  auto refuse = [&](const absl::Status& why) {
    LOG(WARNING) << "refusing " << channel->peer_name() << ": " << why;
    (void)channel->Send(kError, std::vector<uint8_t>(why.message().begin(), why.message().end()));
    return absl::OkStatus();  // a bad client never stops the server
  };
  absl::StatusOr<transport::control::Message> message = channel->Receive(kHelloTimeout);
  if (!message.ok()) return refuse(message.status());
  if (message->type != kHello) return refuse(absl::InvalidArgumentError("expected a hello"));
  absl::StatusOr<Hello> hello = DecodeHello(message->payload);
  if (!hello.ok()) return refuse(hello.status());
  if (hello->clients == 0 || hello->clients > config_.max_clients - joined_) {
    return refuse(absl::ResourceExhaustedError(
        absl::StrFormat("%d clients asked, %d of --max_clients=%d left", hello->clients,
                        config_.max_clients - joined_, config_.max_clients)));
  }
  Session session{std::move(*channel), nullptr, nullptr};
  transport::QpConfig qp;
  qp.type = transport::QpType::kUc;
  qp.send_cq = send_cq_.get();
  qp.recv_cq = recv_cq_.get();
  qp.max_send_wr = 1;
  qp.max_recv_wr = 1;
  auto request_qp = pd_->CreateQp(qp);
  if (!request_qp.ok()) return refuse(request_qp.status());
  session.request_qp = std::move(*request_qp);
  transport::ConnectConfig connect;
  connect.remote = hello->request;
  if (absl::Status c = session.request_qp->Connect(connect); !c.ok()) return refuse(c);
  auto ah = pd_->CreateAddressHandle({hello->ud.lid, hello->ud.gid});
  if (!ah.ok()) return refuse(ah.status());
  session.ah = std::move(*ah);
  Welcome welcome;
  welcome.config = config_;
  welcome.first_client = joined_;
  welcome.region_addr = reinterpret_cast<uint64_t>(region_->data());
  welcome.region_rkey = region_mr_->rkey();
  welcome.request = session.request_qp->endpoint();
  for (uint32_t c = joined_; c < joined_ + hello->clients; ++c) {
    routes_[c].qpn = hello->ud.qp_num;
    routes_[c].ah.store(session.ah.get(), std::memory_order_release);
  }
  joined_ += hello->clients;
  joined_published_.store(joined_, std::memory_order_release);
  if (absl::Status s = session.channel.Send(kWelcome, Encode(welcome)); !s.ok()) {
    LOG(WARNING) << "welcome not sent: " << s;
  }
  LOG(INFO) << "joined " << hello->clients << " clients from " << session.channel.peer_name();
  // Sessions live until the server exits: the echo thread may still answer their last requests.
  sessions_.push_back(std::move(session));
  return absl::OkStatus();
}

void Server::Run(const std::atomic<bool>& stop) {
  // herd's own slot scanner and response chains: the same per-slot and per-doorbell work as a
  // worker, minus parsing, the store and the protocol.
  herd::SlotScanner scanner(herd::SlotLayout{region_->data(), config_.max_clients, config_.window,
                                             config_.slot_bytes,
                                             uint64_t{config_.window} * config_.slot_bytes});
  std::vector<uint32_t> active;
  active.reserve(config_.max_clients);
  uint32_t scanning = UINT32_MAX;  // clients in `active`
  while (!stop.load(std::memory_order_relaxed)) {
    if (const uint32_t joined = joined_published_.load(std::memory_order_acquire);
        joined != scanning) {
      active.clear();
      for (uint32_t c = 0; c < joined; ++c) active.push_back(c);
      scanner.SetClients(active);
      scanning = joined;
    }
    scanner.Scan(
        [&](uint32_t client, uint32_t, uint8_t* start, uint64_t) {
          const Route& route = routes_[client];
          transport::AddressHandle* ah = route.ah.load(std::memory_order_acquire);
          if (ah == nullptr ||
              !herd::AwaitRoom(
                  queue_, [this] { Reap(); }, kMaxWaitForRoom, kReapsPerClockCheck)) {
            dropped_.Add();
            return herd::SlotAction::kConsume;
          }
          const uint64_t index = herd::SendChains::Reserve(queue_);
          uint8_t* response = queue_.StagingFor(index);
          const uint8_t* slot_end = start + config_.slot_bytes;
          std::memcpy(response + config_.response_bytes - sizeof(Tag), slot_end - sizeof(Tag),
                      sizeof(Tag));
          chains_.NextSge() = Sge{reinterpret_cast<uint64_t>(response), config_.response_bytes,
                                  queue_.staging_lkey};
          SendWr& wr = chains_.NextWr();
          wr.wr_id = queue_.WrId(index);
          wr.num_sge = 1;
          // The verb herd's responses use: a UD SEND naming its client in the immediate.
          wr.opcode = transport::Opcode::kSendWithImm;
          wr.imm_data = client;
          wr.flags = queue_.Signal(index) ? uint32_t{transport::kSignaled} : 0u;
          if (config_.response_bytes <= config_.max_inline) wr.flags |= transport::kInline;
          wr.ah = ah;
          wr.remote_qpn = route.qpn;
          wr.remote_qkey = kEchoQkey;
          chains_.Append(&queue_);
          return herd::SlotAction::kConsume;
        },
        [&] { return chains_.size() == config_.postlist; });
    if (chains_.size() > 0) {
      const uint32_t count = chains_.size();
      const uint32_t not_posted = chains_.Post();
      dropped_.Add(not_posted);
      responses_.Add(count - not_posted);
    } else {
      Reap();
    }
  }
}

void Server::Reap() {
  const size_t got = send_cq_->Poll(absl::MakeSpan(completions_));
  for (size_t i = 0; i < got; ++i) {
    queue_.Complete(completions_[i].wr_id,
                    completions_[i].status == transport::CompletionStatus::kSuccess);
  }
}

transport::CounterSnapshot Server::counters() const {
  transport::CounterSnapshot s;
  s.Add(ud_qp_->counters());
  s.Add(send_cq_->counters());
  return s;
}

int Fail(const absl::Status& status) {
  fprintf(stderr, "echo_server: %s\n", status.ToString().c_str());
  return 1;
}

int Main() {
  const sigset_t stop_signals = util::BlockStopSignals();

  // herd's own knobs (herd/flags.h: the same flags, defaults and meaning as herd_server's), so
  // the ceiling this baseline measures cannot drift from the engine it bounds.
  absl::StatusOr<herd::Config> herd_config = herd::ConfigFromFlags();
  if (!herd_config.ok()) return Fail(herd_config.status());
  EchoConfig config;
  config.max_clients = herd_config->max_clients;
  config.window = herd_config->window;
  config.slot_bytes = herd_config->slot_bytes;
  // The sizes of a herd GET: the same bytes cross the fabric as in herd's YCSB C.
  config.request_bytes = herd::RequestBytes(herd::Op::kGet, FLAGS_key_bytes, 0);
  config.response_bytes = herd::ResponseBytes(FLAGS_value_bytes);
  config.postlist = herd_config->postlist;
  config.unsig_batch = herd_config->unsig_batch;
  config.sq_depth = herd_config->sq_depth;
  config.max_inline = herd_config->max_inline;
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  if (!device.ok()) return Fail(device.status());
  absl::StatusOr<transport::PagePolicy> pages = transport::PagePolicyFromFlags();
  if (!pages.ok()) return Fail(pages.status());
  // The baseline measures the data path; its setup stays on the TCP control plane.
  absl::StatusOr<transport::ConnectMode> join_mode = transport::ConnectModeFromFlags();
  if (!join_mode.ok()) return Fail(join_mode.status());
  if (*join_mode != transport::ConnectMode::kTcp) {
    return Fail(absl::InvalidArgumentError("--connect=cm: the echo baseline joins over TCP only"));
  }
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(config, *pages, *device);
  if (!server.ok()) return Fail(server.status());
  if (FLAGS_port > 65535) return Fail(absl::InvalidArgumentError("--port must be <= 65535"));
  auto listener =
      transport::control::Listener::Listen(FLAGS_listen_address, static_cast<uint16_t>(FLAGS_port));
  if (!listener.ok()) return Fail(listener.status());

  std::atomic<bool> stop{false};
  std::thread echo([&] {
    if (absl::Status s = herd::PinCallingThreadTo(FLAGS_core); !s.ok()) LOG(WARNING) << s;
    (*server)->Run(stop);
  });
  printf("echo_server ready port=%d device=%s\n", listener->port(), device->name.c_str());
  fflush(stdout);

  const absl::Time start = absl::Now();
  absl::Time tick = start;
  uint64_t last = 0;
  absl::Status failed;
  while (failed.ok()) {
    failed = (*server)->AcceptOne(*listener);
    timespec no_wait{0, 0};
    if (sigtimedwait(&stop_signals, nullptr, &no_wait) > 0) break;
    const absl::Time now = absl::Now();
    if (now - tick >= absl::Seconds(1)) {
      const uint64_t responses = (*server)->responses();
      fprintf(stderr, "progress %.3f Mops\n",
              (responses - last) / absl::ToDoubleSeconds(now - tick) / 1e6);
      last = responses;
      tick = now;
    }
    if (FLAGS_duration_s > 0 && now - start >= absl::Seconds(FLAGS_duration_s)) break;
  }
  stop = true;
  echo.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  printf("{\"echo_server\":{\"responses\":%lu,\"mops\":%.4f,\"dropped\":%lu,\"fabric\":%s}}\n",
         (*server)->responses(), (*server)->responses() / seconds / 1e6, (*server)->dropped(),
         (*server)->counters().ToJson().c_str());
  return failed.ok() ? 0 : Fail(failed);
}

}  // namespace
}  // namespace bench::echo

int main(int argc, char** argv) {
  gflags::SetUsageMessage("echo_server: herd's fabric ceiling (no store); see README.md");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return bench::echo::Main();
}
