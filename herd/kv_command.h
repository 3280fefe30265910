// What a herd_kv command line asks for, read and checked with no server and no flags: the
// command (get, put, insert, del, cas, stats), its key and value as bytes (plain, hex, or a
// value file), and the servers to ask. herd_kv_main.cc runs it; tests/herd/kv_command_test.cc
// holds the table of what is accepted and what is refused.
//
// Contract: every refusal is an InvalidArgumentError whose message names the argument or flag
// at fault, in herd_kv's words (herd_kv prints it and exits 2); nothing here aborts, whatever a
// value file turns out to be (a directory, a closed stdin, /dev/zero, /proc/self/mem).
#ifndef HERD_HERD_KV_COMMAND_H_
#define HERD_HERD_KV_COMMAND_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace herd {

enum class KvVerb { kGet, kPut, kInsert, kDelete, kCas, kStats };

struct KvCommand {
  KvVerb verb = KvVerb::kGet;
  std::string key;
  std::string value;
  uint64_t expected_version = 0;  // cas
};

// How the arguments are read: --hex and --value_file.
struct KvInput {
  bool hex = false;        // KEY and VALUE are hex strings (two digits per byte)
  std::string value_file;  // non-empty: VALUE comes from this file ("-": stdin)
  // A value file longer than this is refused once this much plus one chunk has been read (set
  // it to the largest value any server accepts, herd::kMaxLargeValueBytes: a file is never read
  // to its end only to be refused). 0 refuses every non-empty value file.
  uint64_t max_value_bytes = 0;
};

// `args`: the command's name, then its arguments (as they came, after '--' included).
absl::StatusOr<KvCommand> ParseKvCommand(const std::vector<std::string>& args,
                                         const KvInput& input);

// `hex` decoded; `what` names it in the refusal ("KEY", "VALUE").
absl::StatusOr<std::string> DecodeHex(absl::string_view what, absl::string_view hex);

// The bytes of `path` ("-": stdin) read with read(2): a read error is never taken for the end
// of the value, and reading stops past `max_bytes`.
absl::StatusOr<std::string> ReadValueFile(const std::string& path, uint64_t max_bytes);

// Whether `address` is HOST:PORT with a port of 0-65535 (the host is the resolver's to judge).
bool IsHostPort(absl::string_view address);

// The servers a request is tried on, in order: `server` (unless `members` is given and
// `server_is_default`), then each entry of `members` (comma-separated HOST:PORT) not listed yet.
absl::StatusOr<std::vector<std::string>> ServersToTry(const std::string& server,
                                                      bool server_is_default,
                                                      absl::string_view members);

}  // namespace herd

#endif  // HERD_HERD_KV_COMMAND_H_
