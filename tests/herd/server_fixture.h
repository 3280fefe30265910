// Runs a herd server in a forked child process (the clients stay in the test process), so every
// end-to-end test crosses process boundaries as a real deployment does; or, for tests that read
// its Stats() or reach into its memory, in this process.
#ifndef HERD_TESTS_HERD_SERVER_FIXTURE_H_
#define HERD_TESTS_HERD_SERVER_FIXTURE_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "herd/client.h"
#include "herd/server.h"

namespace herd::testing {

class ServerProcess {
 public:
  // Forks; the child runs a server with `options` until SIGTERM. Returns after it listens.
  explicit ServerProcess(ServerOptions options) {
    int ready[2];
    if (pipe(ready) != 0) return;
    options.port = 0;
    // TCP joins on loopback; RDMA-CM joins on the address the test chose (the device's).
    if (options.connect == transport::ConnectMode::kTcp) options.listen_address = "127.0.0.1";
    host_ = options.listen_address;
    pid_ = fork();
    if (pid_ == 0) {
      close(ready[0]);
      sigset_t term;
      sigemptyset(&term);
      sigaddset(&term, SIGTERM);
      sigprocmask(SIG_BLOCK, &term, nullptr);
      absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
      uint16_t ports[2] = {0, 0};  // clients', and (a backup's) replication
      if (server.ok() && (*server)->Start().ok()) {
        ports[0] = (*server)->port();
        ports[1] = (*server)->replication_port();
      }
      if (!server.ok()) fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
      (void)!write(ready[1], ports, sizeof(ports));
      if (ports[0] == 0) _exit(2);
      int signal = 0;
      sigwait(&term, &signal);
      (*server)->Stop();
      _exit(0);
    }
    close(ready[1]);
    uint16_t ports[2] = {0, 0};
    if (read(ready[0], ports, sizeof(ports)) == sizeof(ports)) {
      port_ = ports[0];
      replication_port_ = ports[1];
    }
    close(ready[0]);
  }
  ~ServerProcess() { Stop(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Shuts the server down as an operator does (SIGTERM: Server::Stop) and reaps it; a test fails
  // unless it exited cleanly.
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    kill(pid_, SIGCONT);  // a test that failed while the server was paused
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the server did not shut down cleanly: status " << status;
  }

  // SIGKILLs the server (a crash: nothing is shut down) and reaps it.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // SIGSTOPs the server and returns true once every one of its threads is stopped (a signal
  // takes effect when the kernel next runs each thread: until then it may still answer
  // requests); false if it died or did not stop within a minute.
  bool Pause() {
    if (pid_ <= 0 || kill(pid_, SIGSTOP) != 0) return false;
    const absl::Time give_up = absl::Now() + absl::Minutes(1);
    const std::string tasks = absl::StrCat("/proc/", pid_, "/task");
    while (absl::Now() < give_up) {
      bool all_stopped = true;
      std::error_code error;
      for (const auto& task : std::filesystem::directory_iterator(tasks, error)) {
        const char state = ThreadState(task.path() / "stat");
        if (state == 'Z' || state == 'X') return false;  // the server died
        all_stopped = all_stopped && (state == 'T' || state == 't' || state == '?');
      }
      if (error) return false;
      if (all_stopped) return true;
      std::this_thread::yield();
    }
    return false;
  }
  bool Resume() { return pid_ > 0 && kill(pid_, SIGCONT) == 0; }

  bool ok() const { return port_ != 0; }
  std::string address() const { return absl::StrCat(host_, ":", port_); }
  // A backup's replication port (ReplicationRole::kBackup).
  std::string replication_address() const { return absl::StrCat(host_, ":", replication_port_); }
  pid_t pid() const { return pid_; }

 private:
  // A thread's state letter from its /proc stat line ("tid (comm) state ...": comm may hold
  // spaces and parentheses, the state follows the last ')'); '?' if the thread is gone.
  static char ThreadState(const std::filesystem::path& stat_path) {
    std::ifstream stat(stat_path);
    std::string line;
    if (!std::getline(stat, line)) return '?';
    const size_t close = line.rfind(')');
    return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
  }

  pid_t pid_ = -1;
  uint16_t port_ = 0;
  uint16_t replication_port_ = 0;
  std::string host_;
};

// A server in this process (its Stats() readable), listening on 127.0.0.1; null on failure.
inline std::unique_ptr<Server> StartInProcess(ServerOptions options) {
  options.port = 0;
  options.listen_address = "127.0.0.1";
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  EXPECT_TRUE((*server)->Start().ok());
  return *std::move(server);
}

inline ServerOptions SmallServer(const std::string& fabric) {
  ServerOptions options;
  options.device.fabric = fabric;
  options.store.log_bytes = uint64_t{4} << 20;
  options.store.expected_items = 4096;
  options.pin_workers = false;  // tests share the machine's cores with their clients
  options.config.workers = 2;
  options.config.max_clients = 16;
  return options;
}

inline std::unique_ptr<Client> Join(const ServerProcess& server, const std::string& fabric,
                                    uint32_t clients = 1, double ud_loss = 0, double uc_loss = 0,
                                    uint32_t delay_us = 0) {
  ClientOptions options;
  options.server = server.address();
  options.clients = clients;
  options.device.fabric = fabric;
  options.device.faults.ud_loss = ud_loss;
  options.device.faults.uc_loss = uc_loss;
  options.device.faults.delay_us = delay_us;  // > 0: the asynchronous fabric
  options.retry_timeout = absl::Milliseconds(5);
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

}  // namespace herd::testing

#endif  // HERD_TESTS_HERD_SERVER_FIXTURE_H_
