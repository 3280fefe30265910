#include "tests/herd/zookeeper.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace herd::testing {
namespace {

// Under `bazel test` the runfiles root is the working directory; by hand, the repository root.
constexpr char kScript[] = "scripts/zk.sh";

}  // namespace

PrivateZooKeeper::PrivateZooKeeper() {
  const char* tmp = getenv("TEST_TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/zk.XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    status_ = absl::InternalError("mkdtemp failed");
    return;
  }
  dir_ = pattern;
  status_ = Start();
}

PrivateZooKeeper::~PrivateZooKeeper() {
  std::string ignored;
  if (!dir_.empty()) (void)Run("stop", &ignored);
}

absl::Status PrivateZooKeeper::Run(const std::string& verb, std::string* output) {
  // HERD_ZK_OWNER: the server goes when this test process does, even if it crashes.
  const std::string command =
      absl::StrCat("HERD_ZK_OWNER=", getpid(), " ", kScript, " ", verb, " ", dir_,
                   verb == "start" ? absl::StrCat(" ", port_) : "", " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("popen ", command));
  char buffer[512];
  output->clear();
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) output->append(buffer);
  const int rc = pclose(pipe);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(command, " failed (", rc, "): ", *output));
  }
  return absl::OkStatus();
}

absl::Status PrivateZooKeeper::Start() {
  std::string output;
  if (absl::Status s = Run("start", &output); !s.ok()) return s;
  hosts_ = std::string(absl::StripAsciiWhitespace(output));
  port_ = hosts_.substr(hosts_.rfind(':') + 1);
  return absl::OkStatus();
}

absl::Status PrivateZooKeeper::Kill() {
  std::string output;
  return Run("kill", &output);
}

}  // namespace herd::testing
