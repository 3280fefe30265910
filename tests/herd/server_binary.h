// A herd_server binary run as an operator runs it (the real program and its flags, exec'd), for
// tests whose own threads talk to ZooKeeper: a fork without exec would copy into the child a lock
// one of those threads holds. It dies with the test process (PR_SET_PDEATHSIG). Its output goes
// to a log file; Start returns once it printed its "herd_server ready port=N" line.
#ifndef HERD_TESTS_HERD_SERVER_BINARY_H_
#define HERD_TESTS_HERD_SERVER_BINARY_H_

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace herd::testing {

class ServerBinary {
 public:
  // `binary`: the herd_server path; `log`: where its stdout and stderr go (appended).
  ServerBinary(std::string binary, std::string log) : binary_(std::move(binary)), log_(log) {}
  ~ServerBinary();
  ServerBinary(const ServerBinary&) = delete;
  ServerBinary& operator=(const ServerBinary&) = delete;

  // Starts it with `flags` (replacing a stopped one); waits up to `timeout` for its ready line.
  absl::Status Start(const std::vector<std::string>& flags, absl::Duration timeout);
  void Kill();              // SIGKILL and reap: a crash
  void Signal(int signal);  // SIGSTOP, SIGCONT, ...
  // The caller reaped it (waitpid on pid()): nothing left to stop or kill.
  void Forget() {
    pid_ = -1;
    port_ = 0;
  }
  bool running() const { return pid_ > 0; }
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }

 private:
  std::string binary_;
  std::string log_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

}  // namespace herd::testing

#endif  // HERD_TESTS_HERD_SERVER_BINARY_H_
