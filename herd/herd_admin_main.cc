// herd_admin: operator commands for a running herd server, one per run.
//   herd_admin promote HOST:PORT   a backup whose primary is gone becomes the primary (asked
//                                  again while the backup still sees its primary attached)
//   herd_admin stats HOST:PORT     the server's counters (JSON), as herd_kv stats prints them
// Prints the server's JSON answer on stdout; exits 1 with the reason on stderr otherwise.
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/join.h"

DEFINE_double(timeout_s, 30,
              "How long to wait for the server (a promotion replays and checks "
              "every partition: O(region) per worker)");

namespace {
// How often `promote` asks again while the backup still sees its primary attached.
constexpr absl::Duration kPromoteRetryInterval = absl::Milliseconds(50);
}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "herd_admin promote HOST:PORT | herd_admin stats HOST:PORT  (PORT: the clients' port)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (argc != 3) {
    fprintf(stderr, "usage: %s\n", gflags::ProgramUsage());
    return 2;
  }
  const std::string command = argv[1];
  const std::string address = argv[2];
  const absl::Duration timeout = absl::Seconds(FLAGS_timeout_s);
  absl::StatusOr<std::string> answer;
  if (command == "promote") {
    // A backup refuses while its primary is attached; right after the primary died it may not
    // have seen the connection close yet: asked again until the timeout.
    const absl::Time deadline = absl::Now() + timeout;
    answer = herd::RequestPromotion(address, timeout);
    while (!answer.ok() && absl::IsFailedPrecondition(answer.status()) &&
           answer.status().message().find("still attached") != std::string::npos &&
           absl::Now() < deadline) {
      absl::SleepFor(kPromoteRetryInterval);
      answer = herd::RequestPromotion(address, timeout);
    }
  } else if (command == "stats") {
    answer = herd::FetchServerStats(address, timeout);
  } else {
    fprintf(stderr, "herd_admin: unknown command '%s'\nusage: %s\n", command.c_str(),
            gflags::ProgramUsage());
    return 2;
  }
  if (!answer.ok()) {
    fprintf(stderr, "herd_admin %s %s: %s\n", command.c_str(), address.c_str(),
            answer.status().ToString().c_str());
    return 1;
  }
  printf("%s\n", answer->c_str());
  return 0;
}
