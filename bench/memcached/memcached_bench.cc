// memcached_bench: the memcached baseline's client (scripts/compare_memcached.sh). One thread
// drives --connections loopback TCP connections, each with --window binary-protocol requests
// pipelined, through the same workload flags as herd_client (bench/workload_flags.h): the same
// keys, sizes, mix and distribution as a herd run. PUT is SET, DELETE is DELETE, CAS is a SET
// with a CAS value that never matches (like herd_client's CAS, it costs a lookup and fails), GET
// is GET. Keys are preloaded with SET first. A per-second progress line goes to stderr; the last
// stdout line is one JSON result. Warm-up excluded.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "bench/histogram.h"
#include "bench/keys.h"
#include "bench/machine.h"
#include "bench/memcached/binary_protocol.h"
#include "bench/workload.h"
#include "bench/workload_flags.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/pinning.h"

DEFINE_string(server, "127.0.0.1:11211", "host:port of memcached");
DEFINE_uint32(connections, 1, "TCP connections (herd_client's logical clients)");
DEFINE_uint32(window, 4, "Requests pipelined per connection (herd's --window)");
DEFINE_double(duration_s, 5, "Measured seconds (after the warm-up)");
DEFINE_double(warmup_s, 1, "Seconds run before measuring");
DEFINE_bool(preload, true, "SET every key once before the run");
DEFINE_int32(core, -1, "Core this client's thread is pinned to (hwloc; -1: not pinned)");

namespace bench::memcached {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReadChunk = 64 << 10;  // bytes read per recv call
// CAS requests carry this CAS value; memcached hands out CAS values counting up from 1, so it
// never matches an item written by this run's few million SETs.
constexpr uint64_t kNeverMatchingCas = ~uint64_t{0};
constexpr int kPollTimeoutMs = 1;
constexpr uint32_t kMaxWindow = 1024;

struct Connection {
  int fd = -1;
  std::string out;                      // encoded, not yet written
  size_t written = 0;                   // of `out`
  std::string in;                       // read, not yet parsed
  std::vector<Clock::time_point> sent;  // per opaque (window slot)
  std::vector<uint32_t> free_slots;
  uint32_t in_flight = 0;
};

absl::StatusOr<int> Dial(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError("--server must be host:port, got " + host_port);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string host = host_port.substr(0, colon);
  if (int rc = getaddrinfo(host.c_str(), host_port.substr(colon + 1).c_str(), &hints, &found);
      rc != 0) {
    return absl::NotFoundError(absl::StrFormat("%s: %s", host, gai_strerror(rc)));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(found);
    return absl::InternalError(absl::StrFormat("socket: %s", strerror(errno)));
  }
  // Connect while blocking-equivalent: wait for the non-blocking connect to finish.
  int rc = connect(fd, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t length = sizeof(error);
    rc = poll(&p, 1, 5000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 &&
                 error == 0
             ? 0
             : -1;
    if (error != 0) errno = error;
  }
  if (rc != 0) {
    const std::string why = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrFormat("connect to %s: %s", host_port, why));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Writes what `c.out` holds; false (with errno) on a dead connection.
bool Flush(Connection& c) {
  while (c.written < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    c.written += static_cast<size_t>(n);
  }
  c.out.clear();
  c.written = 0;
  return true;
}

struct Totals {
  uint64_t completed = 0, measured = 0, hits = 0, misses = 0, failed = 0;
  Histogram latency;
  bool measuring = false;
};

// Reads what is there and consumes every whole response.
absl::Status Receive(Connection& c, Totals& t) {
  char buffer[kReadChunk];
  const ssize_t n = recv(c.fd, buffer, sizeof(buffer), 0);
  if (n == 0) return absl::UnavailableError("memcached closed the connection");
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
    return absl::UnavailableError(absl::StrFormat("recv: %s", strerror(errno)));
  }
  c.in.append(buffer, static_cast<size_t>(n));
  const Clock::time_point now = Clock::now();
  size_t consumed = 0;
  while (true) {
    absl::StatusOr<Response> r = ParseResponse(std::string_view(c.in).substr(consumed));
    if (!r.ok()) return r.status();
    if (r->bytes == 0) break;
    consumed += r->bytes;
    if (r->opaque >= c.sent.size() || c.in_flight == 0) {
      return absl::DataLossError(absl::StrFormat("response for opaque %d never sent", r->opaque));
    }
    --c.in_flight;
    c.free_slots.push_back(r->opaque);
    ++t.completed;
    switch (r->status) {
      case ResponseStatus::kOk:
        ++t.hits;
        break;
      case ResponseStatus::kKeyNotFound:
      case ResponseStatus::kKeyExists:
        ++t.misses;
        break;
      default:
        ++t.failed;
    }
    if (t.measuring) {
      t.latency.Record(
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - c.sent[r->opaque]).count());
      ++t.measured;
    }
  }
  c.in.erase(0, consumed);
  return absl::OkStatus();
}

int Fail(const absl::Status& status) {
  fprintf(stderr, "memcached_bench: %s\n", status.ToString().c_str());
  return 1;
}

// Runs until `done` says stop: keeps every connection's window full with requests from `next`
// (which appends one request for the given opaque, or returns false when it has no more).
template <typename NextRequest, typename Done>
absl::Status Drive(std::vector<Connection>& connections, Totals& totals, NextRequest next,
                   Done done) {
  std::vector<pollfd> fds(connections.size());
  bool more = true;
  while (!done()) {
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      while (more && !c.free_slots.empty()) {
        const uint32_t slot = c.free_slots.back();
        if (!next(slot, &c.out)) {
          more = false;
          break;
        }
        c.free_slots.pop_back();
        c.sent[slot] = Clock::now();
        ++c.in_flight;
      }
      if (!Flush(c)) return absl::UnavailableError(absl::StrFormat("send: %s", strerror(errno)));
      fds[i] = pollfd{c.fd, static_cast<int16_t>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0};
    }
    if (!more) {
      bool idle = true;
      for (const Connection& c : connections) idle = idle && c.in_flight == 0;
      if (idle) return absl::OkStatus();
    }
    if (poll(fds.data(), fds.size(), kPollTimeoutMs) < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrFormat("poll: %s", strerror(errno)));
    }
    for (size_t i = 0; i < connections.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLERR | POLLHUP)) == 0) continue;
      if (absl::Status s = Receive(connections[i], totals); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

int Main() {
  if (absl::Status s = herd::PinCallingThreadTo(FLAGS_core); !s.ok()) return Fail(s);
  absl::StatusOr<WorkloadConfig> workload = WorkloadConfigFromFlags();
  if (!workload.ok()) return Fail(workload.status());
  if (FLAGS_connections < 1 || FLAGS_window < 1 || FLAGS_window > kMaxWindow) {
    return Fail(absl::InvalidArgumentError(
        absl::StrFormat("--connections must be >= 1 and --window in [1, %d]", kMaxWindow)));
  }
  std::vector<Connection> connections(FLAGS_connections);
  for (Connection& c : connections) {
    absl::StatusOr<int> fd = Dial(FLAGS_server);
    if (!fd.ok()) return Fail(fd.status());
    c.fd = *fd;
    c.sent.resize(FLAGS_window);
    for (uint32_t s = 0; s < FLAGS_window; ++s) c.free_slots.push_back(s);
  }
  const WorkloadConfig& w = *workload;
  std::string key(w.key_bytes, '\0'), value(w.value_bytes, '\0');
  Totals totals;
  if (FLAGS_preload) {
    uint64_t next_key = 0;
    absl::Status s = Drive(
        connections, totals,
        [&](uint32_t opaque, std::string* out) {
          if (next_key == w.keys) return false;
          MakeKey(next_key, w.key_bytes, key.data());
          MakeValue(next_key, 0, w.value_bytes, value.data());
          AppendSet(key, value, 0, opaque, out);
          ++next_key;
          return true;
        },
        [] { return false; });
    if (!s.ok()) return Fail(s);
    if (totals.failed > 0) {
      return Fail(absl::ResourceExhaustedError(absl::StrFormat(
          "%d of %d preload SETs failed (memcached's -m too small?)", totals.failed, w.keys)));
    }
    totals = Totals{};
  }

  Workload stream(w, /*stream=*/0);
  uint64_t stamp = 1;
  auto next = [&](uint32_t opaque, std::string* out) {
    const uint64_t index = stream.NextKey();
    MakeKey(index, w.key_bytes, key.data());
    switch (stream.NextOp()) {
      case Operation::kGet:
        AppendGet(key, opaque, out);
        break;
      case Operation::kPut:
        MakeValue(index, stamp++, w.value_bytes, value.data());
        AppendSet(key, value, 0, opaque, out);
        break;
      case Operation::kDelete:
        AppendDelete(key, opaque, out);
        break;
      case Operation::kCas:
        MakeValue(index, stamp++, w.value_bytes, value.data());
        AppendSet(key, value, kNeverMatchingCas, opaque, out);
        break;
    }
    return true;
  };
  const Clock::time_point start = Clock::now();
  const auto warmup = absl::ToChronoNanoseconds(absl::Seconds(FLAGS_warmup_s));
  const auto duration = absl::ToChronoNanoseconds(absl::Seconds(FLAGS_duration_s));
  Clock::time_point measure_start = start + warmup, tick = start;
  uint64_t last = 0;
  double cpu_start = 0;
  absl::Status s = Drive(connections, totals, next, [&] {
    const Clock::time_point now = Clock::now();
    if (!totals.measuring && now - start >= warmup) {
      totals.measuring = true;
      measure_start = now;
      cpu_start = ProcessCpuSeconds();
    }
    if (now - tick >= std::chrono::seconds(1)) {
      fprintf(stderr, "progress %.3f Mops\n",
              (totals.completed - last) / std::chrono::duration<double>(now - tick).count() / 1e6);
      last = totals.completed;
      tick = now;
    }
    return totals.measuring && now - measure_start >= duration;
  });
  if (!s.ok()) return Fail(s);
  const double seconds = std::chrono::duration<double>(Clock::now() - measure_start).count();
  const double cpu_s = ProcessCpuSeconds() - cpu_start;
  for (Connection& c : connections) close(c.fd);
  const std::string json = absl::StrFormat(
      "{\"server\":\"%s\",\"connections\":%d,\"window\":%d,\"workload\":%s,\"duration_s\":%.3f,"
      "\"ops\":%d,\"mops\":%.4f,\"hits\":%d,\"misses\":%d,\"failed\":%d,\"p50_us\":%.2f,"
      "\"p99_us\":%.2f,\"p999_us\":%.2f,\"max_us\":%.2f,\"cpu_s\":%.3f,\"cpu_model\":\"%s\","
      "\"cores\":%d}",
      FLAGS_server, FLAGS_connections, FLAGS_window, w.ToJson(), seconds, totals.measured,
      totals.measured / seconds / 1e6, totals.hits, totals.misses, totals.failed,
      totals.latency.Quantile(0.5) / 1e3, totals.latency.Quantile(0.99) / 1e3,
      totals.latency.Quantile(0.999) / 1e3, totals.latency.max() / 1e3, cpu_s, CpuModel(),
      OnlineCores());
  printf("%s\n", json.c_str());
  return totals.failed == 0 ? 0 : 2;
}

}  // namespace
}  // namespace bench::memcached

int main(int argc, char** argv) {
  gflags::SetUsageMessage("memcached baseline client (binary protocol); see README.md");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return bench::memcached::Main();
}
