#include "tests/herd/server_binary.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace herd::testing {
namespace {

constexpr char kReady[] = "herd_server ready port=";
constexpr absl::Duration kReadyPoll = absl::Milliseconds(10);
// How long a stopped server may take to exit before it is killed.
constexpr absl::Duration kStopDeadline = absl::Seconds(30);

// The port of the last ready line in `log` past byte `from`, or 0.
uint16_t ReadyPort(const std::string& log, std::streamoff from) {
  std::ifstream in(log);
  in.seekg(from);
  std::string line;
  uint16_t port = 0;
  while (std::getline(in, line)) {
    const size_t at = line.find(kReady);
    if (at == std::string::npos) continue;
    const size_t start = at + sizeof(kReady) - 1;
    const size_t end = line.find(' ', start);
    uint32_t parsed = 0;
    if (absl::SimpleAtoi(line.substr(start, end - start), &parsed) && parsed <= 65535) {
      port = static_cast<uint16_t>(parsed);
    }
  }
  return port;
}

}  // namespace

ServerBinary::~ServerBinary() {
  if (pid_ <= 0) return;
  kill(pid_, SIGCONT);
  kill(pid_, SIGTERM);
  // A server that ignores the stop (a defect a test just found) must not hang the test: killed.
  const absl::Time give_up = absl::Now() + kStopDeadline;
  while (true) {
    const pid_t reaped = waitpid(pid_, nullptr, WNOHANG);
    if (reaped == pid_ || (reaped < 0 && errno == ECHILD)) return;  // gone (or reaped already)
    if (absl::Now() >= give_up) {
      Kill();
      return;
    }
    absl::SleepFor(kReadyPoll);
  }
}

absl::Status ServerBinary::Start(const std::vector<std::string>& flags, absl::Duration timeout) {
  if (pid_ > 0) Kill();
  std::streamoff from = 0;
  {
    std::ifstream in(log_, std::ios::ate);
    if (in) from = in.tellg();
  }
  std::vector<std::string> args = {binary_};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // fork and exec, not posix_spawn: between the two the child sets PR_SET_PDEATHSIG (a test that
  // dies takes its servers with it). Only async-signal-safe calls run there, so the parent's
  // other threads (ZooKeeper's) hold no lock the child needs.
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    pid_ = -1;
    return absl::InternalError(absl::StrCat("fork: ", errno));
  }
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before the line above
    const int log = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int null = open("/dev/null", O_RDONLY);
    if (log < 0 || null < 0) _exit(126);
    dup2(null, STDIN_FILENO);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execv(binary_.c_str(), argv.data());
    _exit(127);
  }
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    port_ = ReadyPort(log_, from);
    if (port_ != 0) return absl::OkStatus();
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::FailedPreconditionError(
          absl::StrCat(binary_, " exited before it was ready (status ", status, "): see ", log_));
    }
    if (absl::Now() >= give_up) {
      Kill();
      return absl::DeadlineExceededError(absl::StrCat(binary_, " not ready: see ", log_));
    }
    absl::SleepFor(kReadyPoll);
  }
}

void ServerBinary::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  port_ = 0;
}

void ServerBinary::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

}  // namespace herd::testing
