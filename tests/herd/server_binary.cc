#include "tests/herd/server_binary.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace herd::testing {
namespace {

constexpr char kReady[] = "herd_server ready port=";
constexpr absl::Duration kReadyPoll = absl::Milliseconds(10);

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
  waitpid(pid_, nullptr, 0);
}

absl::Status ServerBinary::Start(const std::vector<std::string>& flags, absl::Duration timeout) {
  if (pid_ > 0) Kill();
  std::streamoff from = 0;
  {
    std::ifstream in(log_, std::ios::ate);
    if (in) from = in.tellg();
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> args = {binary_};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = posix_spawn(&pid_, binary_.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    pid_ = -1;
    return absl::InternalError(absl::StrCat("posix_spawn ", binary_, ": ", rc));
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
