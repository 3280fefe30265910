// herd_admin: operator commands for a running herd server, one per run.
//   herd_admin promote HOST:PORT   a backup whose primary is gone becomes the primary
//   herd_admin stats HOST:PORT     the server's counters (JSON), as herd_kv stats prints them
// Prints the server's JSON answer on stdout; exits 1 with the reason on stderr otherwise.
#include <cstdio>
#include <string>

#include "absl/time/time.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/join.h"

DEFINE_double(timeout_s, 30,
              "How long to wait for the server (a promotion replays and checks "
              "every partition: O(region) per worker)");

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
    answer = herd::RequestPromotion(address, timeout);
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
