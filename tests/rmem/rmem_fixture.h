// What the rmem service tests share: a server stepped on a background thread, and options
// naming one shm fabric per test (or the verbs device HERD_VERBS_DEVICE names).
#ifndef HERD_TESTS_RMEM_RMEM_FIXTURE_H_
#define HERD_TESTS_RMEM_RMEM_FIXTURE_H_

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "rmem/client.h"
#include "rmem/server.h"

namespace rmem::testing {

inline std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// The device every side of a test opens: HERD_VERBS_DEVICE (the guest's rxe0), else a shm fabric
// of this test's own.
inline transport::DeviceOptions TestDevice(const std::string& test) {
  transport::DeviceOptions d;
  if (const char* verbs = std::getenv("HERD_VERBS_DEVICE"); verbs != nullptr && *verbs != 0) {
    d.name = verbs;
  } else {
    d.fabric = absl::StrFormat("rmem-%s-%d", test, getpid());
  }
  return d;
}

inline ServerOptions TestServer(const std::string& test, const std::string& pool_file = "") {
  ServerOptions o;
  o.pool.path = pool_file;
  o.pool.pool_bytes = 8 << 20;
  o.pool.max_regions = 1024;
  o.pool.max_clients = 64;
  o.pool.hugepages = false;
  o.device = TestDevice(test);
  o.listen_address = "127.0.0.1";
  o.max_clients = 32;
  return o;
}

inline ClientOptions TestClient(const Server& server, const std::string& test) {
  ClientOptions o;
  o.server = absl::StrFormat("127.0.0.1:%u", server.port());
  o.device = TestDevice(test);
  o.timeout = absl::Seconds(20);
  return o;
}

// Steps a server on its own thread until Stop (or destruction); the server's state may be read
// only while stopped.
class ServerThread {
 public:
  explicit ServerThread(std::unique_ptr<Server> server) : server_(std::move(server)) { Start(); }
  ~ServerThread() { Stop(); }
  void Start() {
    stop_ = false;
    thread_ = std::thread([this] { server_->Run(stop_); });
  }
  void Stop() {
    if (!thread_.joinable()) return;
    stop_ = true;
    thread_.join();
  }
  // Runs `check` on the stopped server until it is true (the server steps in between).
  template <typename Check>
  bool WaitFor(Check check, absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      Stop();
      const bool done = check(*server_);
      Start();
      if (done) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }
  Server& server() { return *server_; }

 private:
  std::unique_ptr<Server> server_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace rmem::testing

#endif  // HERD_TESTS_RMEM_RMEM_FIXTURE_H_
