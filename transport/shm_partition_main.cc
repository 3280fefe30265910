// shm_partition: cuts and heals processes of the shm fabric apart (transport/shm/
// partition_table.h), for a partition by hand or from a script. The processes must run with
// --shm_partition_file=FILE.
//
//   shm_partition FILE cut PID PID    nothing passes between them from now on
//   shm_partition FILE heal PID PID
//   shm_partition FILE heal-all
//   shm_partition FILE list           one "PID PID" line per pair cut
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "transport/shm/partition_table.h"

namespace {

constexpr int kUsageError = 2;

int Usage() {
  fprintf(stderr, "usage: shm_partition FILE cut|heal PID PID | FILE heal-all | FILE list\n");
  return kUsageError;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string command = argv[2];
  int32_t a = 0, b = 0;
  const bool pair = command == "cut" || command == "heal";
  if (pair && (argc != 5 || !absl::SimpleAtoi(argv[3], &a) || !absl::SimpleAtoi(argv[4], &b))) {
    return Usage();
  }
  if (!pair && (argc != 3 || (command != "heal-all" && command != "list"))) return Usage();
  absl::StatusOr<transport::shm::PartitionTable> table =
      transport::shm::PartitionTable::Open(argv[1]);
  if (!table.ok()) {
    fprintf(stderr, "shm_partition: %s\n", table.status().ToString().c_str());
    return 1;
  }
  if (command == "cut") {
    const absl::Status cut = table->Cut(a, b);
    if (!cut.ok()) {
      fprintf(stderr, "shm_partition: %s\n", cut.ToString().c_str());
      return 1;
    }
  } else if (command == "heal") {
    table->Heal(a, b);
  } else if (command == "heal-all") {
    table->HealAll();
  } else {
    for (const auto& [x, y] : table->Cuts()) printf("%d %d\n", x, y);
  }
  return 0;
}
