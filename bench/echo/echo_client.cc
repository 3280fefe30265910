// echo_client: drives echo_server (see echo_wire.h) the way herd_client drives herd: one thread
// hosting --clients logical clients, each with the server's window of requests outstanding, one
// UC WRITE per request into its slot, selectively signalled. A per-second progress line goes to
// stderr; the last stdout line is one JSON result. Warm-up excluded.
//
// There is no retransmission: a lost response (UD may lose on a real fabric) stalls its slot
// for the rest of the run, and the result counts such slots as "stalled".
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/echo/echo_wire.h"
#include "bench/histogram.h"
#include "bench/machine.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/pinning.h"
#include "herd/send_queue.h"
#include "transport/control/channel.h"
#include "transport/fabric.h"
#include "transport/flags.h"
#include "transport/shared_memory.h"

DEFINE_string(server, "127.0.0.1:31860", "host:port of echo_server's control plane");
DEFINE_uint32(clients, 1, "Logical clients hosted by this thread");
DEFINE_double(duration_s, 5, "Measured seconds (after the warm-up)");
DEFINE_double(warmup_s, 1, "Seconds run before measuring");
DEFINE_int32(core, -1, "Core this client's thread is pinned to (hwloc; -1: not pinned)");

namespace bench::echo {
namespace {

using Clock = std::chrono::steady_clock;
using transport::Completion;

constexpr absl::Duration kConnectTimeout = absl::Seconds(10);
constexpr absl::Duration kWelcomeTimeout = absl::Seconds(10);
constexpr size_t kPollBatch = 64;  // completions taken per CQ poll
// The client's queues are created before the server's numbers arrive, so they are sized for the
// most a server may ask: window x clients receives, this send depth and inline limit.
constexpr uint32_t kMaxQueueDepth = 4096;
constexpr uint32_t kMaxInline = 188;  // herd's default --max_inline
// How often (in loop iterations) the clock is read to end a phase.
constexpr uint32_t kIterationsPerClockCheck = 1024;
// After the run, responses still in flight get this long to arrive before a slot counts as
// stalled (its response lost).
constexpr auto kDrainTime = std::chrono::milliseconds(200);

// Setup calls past OpenDevice fail only on a broken device or exhausted memory: end with why.
template <typename T>
T Take(absl::StatusOr<T> value) {
  CHECK(value.ok()) << "echo_client setup: " << value.status();
  return std::move(*value);
}

int Fail(const absl::Status& status) {
  fprintf(stderr, "echo_client: %s\n", status.ToString().c_str());
  return 1;
}

struct Slot {
  bool busy = false;
  uint64_t seq = 0;
  Clock::time_point sent;
};

int Main() {
  if (absl::Status s = herd::PinCallingThreadTo(FLAGS_core); !s.ok()) return Fail(s);
  if (FLAGS_clients < 1) return Fail(absl::InvalidArgumentError("--clients must be at least 1"));
  absl::StatusOr<transport::DeviceOptions> options = transport::DeviceOptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  // The baseline measures the data path; its setup stays on the TCP control plane.
  absl::StatusOr<transport::ConnectMode> join_mode = transport::ConnectModeFromFlags();
  if (!join_mode.ok()) return Fail(join_mode.status());
  if (*join_mode != transport::ConnectMode::kTcp) {
    return Fail(absl::InvalidArgumentError("--connect=cm: the echo baseline joins over TCP only"));
  }
  absl::StatusOr<std::unique_ptr<transport::Device>> opened = transport::OpenDevice(*options);
  if (!opened.ok()) return Fail(opened.status());
  transport::Device& device = **opened;
  auto pd = Take(device.AllocatePd());
  // Sized for the largest window the server may ask for; the real numbers come with the welcome.
  auto send_cq = Take(device.CreateCq(kMaxQueueDepth));
  auto recv_cq = Take(device.CreateCq(kMaxQueueDepth));
  transport::QpConfig qp;
  qp.send_cq = send_cq.get();
  qp.recv_cq = recv_cq.get();
  qp.type = transport::QpType::kUd;
  qp.max_send_wr = 1;
  qp.max_recv_wr = kMaxQueueDepth;
  auto ud = Take(pd->CreateQp(qp));
  transport::ConnectConfig ud_connect;
  ud_connect.qkey = kEchoQkey;
  if (absl::Status s = ud->Connect(ud_connect); !s.ok()) return Fail(s);
  // The SendQueue below enforces the server's (smaller or equal) depth.
  qp.type = transport::QpType::kUc;
  qp.max_send_wr = kMaxQueueDepth;
  qp.max_recv_wr = 1;
  qp.max_inline_data = kMaxInline;
  auto request_qp = Take(pd->CreateQp(qp));

  absl::StatusOr<transport::control::Channel> channel =
      transport::control::Channel::Connect(FLAGS_server, kConnectTimeout);
  if (!channel.ok()) return Fail(channel.status());
  if (absl::Status s = channel->Send(
          kHello, Encode(Hello{FLAGS_clients, ud->endpoint(), request_qp->endpoint()}));
      !s.ok()) {
    return Fail(s);
  }
  absl::StatusOr<transport::control::Message> reply = channel->Receive(kWelcomeTimeout);
  if (!reply.ok()) return Fail(reply.status());
  if (reply->type == kError) {
    return Fail(absl::FailedPreconditionError(
        "server refused: " + std::string(reply->payload.begin(), reply->payload.end())));
  }
  absl::StatusOr<Welcome> welcome = DecodeWelcome(reply->payload);
  if (!welcome.ok()) return Fail(welcome.status());
  const EchoConfig& config = welcome->config;
  const uint32_t slots = FLAGS_clients * config.window;
  if (slots > kMaxQueueDepth || config.sq_depth > kMaxQueueDepth ||
      config.max_inline > kMaxInline) {
    return Fail(absl::InvalidArgumentError(
        "the server's window x --clients, sq_depth or max_inline exceeds this client's queues"));
  }
  transport::ConnectConfig connect;
  connect.remote = welcome->request;
  if (absl::Status s = request_qp->Connect(connect); !s.ok()) return Fail(s);

  // Request staging: one buffer per (client, slot), reused only after its response (which
  // proves the WRITE that read it is done). Receives: one per outstanding request.
  const uint32_t recv_bytes = transport::kGrhBytes + config.response_bytes;
  auto memory = Take(transport::SharedMemory::Allocate(
      uint64_t{slots} * (config.request_bytes + recv_bytes), "echo-client"));
  uint8_t* staging = memory.data();
  uint8_t* receives = staging + uint64_t{slots} * config.request_bytes;
  auto mr = Take(pd->RegisterMemory(memory.data(), memory.size(), transport::kLocalWrite));
  std::vector<transport::Sge> recv_sges(slots);
  std::vector<transport::RecvWr> recv_wrs(slots);
  auto post_receives = [&](uint32_t count) {
    for (uint32_t i = 0; i < count; ++i)
      recv_wrs[i].next = i + 1 < count ? &recv_wrs[i + 1] : nullptr;
    transport::RecvWr* bad = nullptr;
    return ud->PostRecv(recv_wrs.data(), &bad);
  };
  for (uint32_t i = 0; i < slots; ++i) {
    recv_sges[i] = {reinterpret_cast<uint64_t>(receives + uint64_t{i} * recv_bytes), recv_bytes,
                    mr->lkey()};
    recv_wrs[i] = transport::RecvWr{i, nullptr, &recv_sges[i], 1};
  }
  if (absl::Status s = post_receives(slots); !s.ok()) return Fail(s);

  herd::SendQueue queue;
  queue.qp = request_qp.get();
  queue.depth = config.sq_depth;
  queue.unsig_batch = config.unsig_batch;
  std::vector<Slot> state(slots);
  std::vector<Completion> completions(kPollBatch);
  Histogram latency;
  uint64_t next_seq = 1, completed = 0, measured = 0, stray = 0;
  bool measuring = false;
  const Clock::time_point start = Clock::now();
  const auto warmup_end = start + absl::ToChronoNanoseconds(absl::Seconds(FLAGS_warmup_s));
  const auto end = warmup_end + absl::ToChronoNanoseconds(absl::Seconds(FLAGS_duration_s));
  Clock::time_point measure_start = warmup_end, tick = start;
  uint64_t last_completed = 0;
  double cpu_start = 0;

  // Polls the receive CQ once: matches responses to slots, re-posts their receives.
  auto take_responses = [&]() -> absl::Status {
    const size_t got = recv_cq->Poll(absl::MakeSpan(completions));
    if (got == 0) return absl::OkStatus();
    const Clock::time_point now = Clock::now();
    for (size_t k = 0; k < got; ++k) {
      const Completion& c = completions[k];
      recv_wrs[k] = transport::RecvWr{c.wr_id, nullptr, &recv_sges[c.wr_id], 1};
      Tag tag;
      if (c.status != transport::CompletionStatus::kSuccess || c.byte_len != recv_bytes) {
        ++stray;
        continue;
      }
      std::memcpy(&tag, receives + c.wr_id * recv_bytes + recv_bytes - sizeof(Tag), sizeof(Tag));
      const uint64_t i = uint64_t{tag.client} * config.window + tag.slot;
      if (tag.client >= FLAGS_clients || tag.slot >= config.window || !state[i].busy ||
          state[i].seq != tag.seq) {
        ++stray;
        continue;
      }
      state[i].busy = false;
      ++completed;
      if (measuring) {
        latency.Record(
            std::chrono::duration_cast<std::chrono::nanoseconds>(now - state[i].sent).count());
        ++measured;
      }
    }
    return post_receives(static_cast<uint32_t>(got));
  };

  // One WR, reset per request (transport::ResetSendWr: a fresh SendWr per request was a `rep
  // stosq`, a cost herd's own post path no longer pays).
  transport::SendWr wr;
  for (uint32_t iteration = 0;; ++iteration) {
    if (iteration % kIterationsPerClockCheck == 0) {
      const Clock::time_point now = Clock::now();
      if (now >= end) break;
      if (!measuring && now >= warmup_end) {
        measuring = true;
        measure_start = now;
        cpu_start = ProcessCpuSeconds();
      }
      if (now - tick >= std::chrono::seconds(1)) {
        fprintf(
            stderr, "progress %.3f Mops\n",
            (completed - last_completed) / std::chrono::duration<double>(now - tick).count() / 1e6);
        last_completed = completed;
        tick = now;
      }
    }
    for (uint32_t i = 0; i < slots; ++i) {
      Slot& slot = state[i];
      if (slot.busy) continue;
      while (!queue.broken && !queue.HasRoom()) {
        const size_t got = send_cq->Poll(absl::MakeSpan(completions));
        for (size_t k = 0; k < got; ++k) {
          queue.Complete(completions[k].wr_id,
                         completions[k].status == transport::CompletionStatus::kSuccess);
        }
      }
      if (queue.broken) return Fail(absl::UnavailableError("request QP in error: server gone?"));
      const uint32_t client = i / config.window, index = i % config.window;
      uint8_t* request = staging + uint64_t{i} * config.request_bytes;
      const Tag tag{client, index, next_seq};
      std::memcpy(request + config.request_bytes - sizeof(Tag), &tag, sizeof(Tag));
      transport::Sge sge{reinterpret_cast<uint64_t>(request), config.request_bytes, mr->lkey()};
      transport::ResetSendWr(wr);
      wr.wr_id = queue.WrId(queue.posted);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = transport::Opcode::kWrite;
      wr.flags = queue.Signal(queue.posted) ? uint32_t{transport::kSignaled} : 0u;
      if (config.request_bytes <= config.max_inline) wr.flags |= transport::kInline;
      wr.remote_addr = welcome->region_addr +
                       config.SlotOffset(welcome->first_client + client, index) +
                       config.slot_bytes - config.request_bytes;
      wr.rkey = welcome->region_rkey;
      transport::SendWr* bad = nullptr;
      if (absl::Status s = request_qp->PostSend(&wr, &bad); !s.ok()) return Fail(s);
      ++queue.posted;
      slot = Slot{true, next_seq++, Clock::now()};
    }
    if (absl::Status s = take_responses(); !s.ok()) return Fail(s);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - measure_start).count();
  const double cpu_s = ProcessCpuSeconds() - cpu_start;
  measuring = false;
  auto busy_slots = [&] {
    uint64_t busy = 0;
    for (const Slot& s : state) busy += s.busy ? 1 : 0;
    return busy;
  };
  for (const auto drain_end = Clock::now() + kDrainTime;
       busy_slots() > 0 && Clock::now() < drain_end;) {
    if (absl::Status s = take_responses(); !s.ok()) return Fail(s);
  }
  const uint64_t stalled = busy_slots();
  transport::CounterSnapshot counters;
  counters.Add(request_qp->counters());
  const double per_wr = counters.wrs == 0 ? 0 : 1.0 / static_cast<double>(counters.wrs);
  const std::string json = absl::StrFormat(
      "{\"clients\":%d,\"window\":%d,\"request_bytes\":%d,\"response_bytes\":%d,"
      "\"fabric\":\"%s\",\"device\":\"%s\",\"duration_s\":%.3f,\"ops\":%d,\"mops\":%.4f,"
      "\"p50_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,\"max_us\":%.2f,\"stalled\":%d,"
      "\"stray\":%d,\"doorbells_per_wr\":%.3f,\"signaled_fraction\":%.4f,\"cpu_s\":%.3f,"
      "\"cpu_model\":\"%s\",\"cores\":%d}",
      FLAGS_clients, config.window, config.request_bytes, config.response_bytes,
      options->name == "shm" ? "shm" : "verbs", options->name, seconds, measured,
      measured / seconds / 1e6, latency.Quantile(0.5) / 1e3, latency.Quantile(0.99) / 1e3,
      latency.Quantile(0.999) / 1e3, latency.max() / 1e3, stalled, stray,
      counters.doorbells * per_wr, counters.signaled_wrs * per_wr, cpu_s, CpuModel(),
      OnlineCores());
  printf("%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace bench::echo

int main(int argc, char** argv) {
  gflags::SetUsageMessage("echo_client: drives echo_server; see README.md");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return bench::echo::Main();
}
