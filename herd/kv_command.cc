#include "herd/kv_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace herd {
namespace {

constexpr uint32_t kMaxPort = 65535;
// What one read(2) of a value file asks for.
constexpr size_t kChunkBytes = 64 << 10;

struct CommandSpec {
  absl::string_view name;
  KvVerb verb;
  absl::string_view synopsis;
  size_t args;       // before VALUE
  bool takes_value;  // VALUE follows them, unless --value_file gives it
};

constexpr CommandSpec kCommands[] = {
    {"get", KvVerb::kGet, "get KEY", 1, false},
    {"put", KvVerb::kPut, "put KEY VALUE", 1, true},
    {"insert", KvVerb::kInsert, "insert KEY VALUE", 1, true},
    {"del", KvVerb::kDelete, "del KEY", 1, false},
    {"cas", KvVerb::kCas, "cas KEY VERSION VALUE", 2, true},
    {"stats", KvVerb::kStats, "stats", 0, false},
};

const CommandSpec* FindCommand(absl::string_view name) {
  for (const CommandSpec& spec : kCommands) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

// An argument as bytes: itself, or decoded from hex.
absl::StatusOr<std::string> Bytes(absl::string_view what, absl::string_view arg, bool hex) {
  if (hex) return DecodeHex(what, arg);
  return std::string(arg);
}

}  // namespace

absl::StatusOr<std::string> DecodeHex(absl::string_view what, absl::string_view hex) {
  const bool digits_only =
      std::all_of(hex.begin(), hex.end(), [](char c) { return absl::ascii_isxdigit(c); });
  if (hex.size() % 2 != 0 || !digits_only) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--hex: %s '%s' is not a hex string (two digits 0-9a-f per byte)", what, hex));
  }
  return absl::HexStringToBytes(hex);
}

absl::StatusOr<std::string> ReadValueFile(const std::string& path, uint64_t max_bytes) {
  const bool from_stdin = path == "-";
  const std::string name = from_stdin ? "- (stdin)" : path;
  const int fd = from_stdin ? STDIN_FILENO : open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--value_file=%s: cannot open it: %s", name, strerror(errno)));
  }
  std::string bytes;
  std::vector<char> chunk(kChunkBytes);
  absl::Status status;
  while (status.ok()) {
    const ssize_t got = read(fd, chunk.data(), chunk.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      status = absl::InvalidArgumentError(
          absl::StrFormat("--value_file=%s: cannot read it: %s", name, strerror(errno)));
    } else if (got == 0) {
      break;
    } else {
      bytes.append(chunk.data(), static_cast<size_t>(got));
      if (bytes.size() > max_bytes) {
        status = absl::InvalidArgumentError(absl::StrFormat(
            "--value_file=%s: longer than the largest value any server accepts (%d bytes)", name,
            max_bytes));
      }
    }
  }
  if (!from_stdin) close(fd);
  if (!status.ok()) return status;
  return bytes;
}

absl::StatusOr<KvCommand> ParseKvCommand(const std::vector<std::string>& args,
                                         const KvInput& input) {
  if (args.empty()) return absl::InvalidArgumentError("no command");
  const CommandSpec* spec = FindCommand(args[0]);
  if (spec == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown command '%s'", args[0]));
  }
  const bool value_in_file = !input.value_file.empty();
  if (value_in_file && !spec->takes_value) {
    return absl::InvalidArgumentError(
        absl::StrCat("--value_file: ", spec->name, " takes no value"));
  }
  const size_t wanted = spec->args + (spec->takes_value && !value_in_file ? 1 : 0);
  if (args.size() - 1 != wanted) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s takes %d argument(s), not %d: %s%s", spec->name, wanted, args.size() - 1,
        spec->synopsis, value_in_file ? " (VALUE from --value_file)" : ""));
  }
  KvCommand command;
  command.verb = spec->verb;
  if (spec->verb == KvVerb::kStats) return command;
  absl::StatusOr<std::string> key = Bytes("KEY", args[1], input.hex);
  if (!key.ok()) return key.status();
  command.key = *std::move(key);
  if (spec->verb == KvVerb::kCas && !absl::SimpleAtoi(args[2], &command.expected_version)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cas: VERSION '%s' is not a version number", args[2]));
  }
  if (!spec->takes_value) return command;
  absl::StatusOr<std::string> value = value_in_file
                                          ? ReadValueFile(input.value_file, input.max_value_bytes)
                                          : Bytes("VALUE", args.back(), input.hex);
  if (!value.ok()) return value.status();
  command.value = *std::move(value);
  return command;
}

bool IsHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  return colon != absl::string_view::npos && absl::SimpleAtoi(address.substr(colon + 1), &port) &&
         port <= kMaxPort;
}

absl::StatusOr<std::vector<std::string>> ServersToTry(const std::string& server,
                                                      bool server_is_default,
                                                      absl::string_view members) {
  std::vector<std::string> servers;
  if (members.empty() || !server_is_default) servers.push_back(server);
  for (absl::string_view member : absl::StrSplit(members, ',', absl::SkipEmpty())) {
    if (!IsHostPort(member)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--members: '%s' is not host:port (e.g. 127.0.0.1:31850,127.0.0.1:31860)", member));
    }
    if (std::find(servers.begin(), servers.end(), member) == servers.end()) {
      servers.emplace_back(member);
    }
  }
  if (servers.empty()) return absl::InvalidArgumentError("--members names no HOST:PORT");
  return servers;
}

}  // namespace herd
