// herd_kv's command line, with no server: what each command accepts, what it refuses and in
// which words, and value files that are not plain files (herd/kv_command.h's contract).
#include "herd/kv_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace herd {
namespace {

constexpr uint64_t kMaxValueBytes = 16u << 20;  // herd's largest value (config.h)

KvInput Plain() {
  KvInput input;
  input.max_value_bytes = kMaxValueBytes;
  return input;
}

KvInput Hex() {
  KvInput input = Plain();
  input.hex = true;
  return input;
}

KvInput FromFile(const std::string& path, uint64_t max_bytes = kMaxValueBytes) {
  KvInput input = Plain();
  input.value_file = path;
  input.max_value_bytes = max_bytes;
  return input;
}

struct Accepted {
  std::vector<std::string> args;
  KvInput input;
  KvVerb verb;
  std::string key, value;
  uint64_t expected_version;
};

TEST(KvCommand, AcceptsEachCommandWithItsArguments) {
  const Accepted table[] = {
      {{"get", "k"}, Plain(), KvVerb::kGet, "k", "", 0},
      {{"put", "k", "v"}, Plain(), KvVerb::kPut, "k", "v", 0},
      {{"put", "k", ""}, Plain(), KvVerb::kPut, "k", "", 0},
      {{"put", "k", "-1"}, Plain(), KvVerb::kPut, "k", "-1", 0},  // after '--' on the command line
      {{"insert", "k", "v"}, Plain(), KvVerb::kInsert, "k", "v", 0},
      {{"del", "k"}, Plain(), KvVerb::kDelete, "k", "", 0},
      {{"cas", "k", "18446744073709551615", "v"},
       Plain(),
       KvVerb::kCas,
       "k",
       "v",
       18446744073709551615ull},
      {{"stats"}, Plain(), KvVerb::kStats, "", "", 0},
      {{"put", "00ff", "6869"}, Hex(), KvVerb::kPut, std::string("\0\xff", 2), "hi", 0},
      {{"get", "4B"}, Hex(), KvVerb::kGet, "K", "", 0},
  };
  for (const Accepted& row : table) {
    SCOPED_TRACE(row.args[0] + " with " + std::to_string(row.args.size() - 1) + " argument(s)");
    absl::StatusOr<KvCommand> command = ParseKvCommand(row.args, row.input);
    ASSERT_TRUE(command.ok()) << command.status();
    EXPECT_EQ(command->verb, row.verb);
    EXPECT_EQ(command->key, row.key);
    EXPECT_EQ(command->value, row.value);
    EXPECT_EQ(command->expected_version, row.expected_version);
  }
}

struct Refused {
  std::vector<std::string> args;
  KvInput input;
  std::string says;  // the refusal's message contains this
};

TEST(KvCommand, RefusesWhatIsMalformedNamingIt) {
  const Refused table[] = {
      {{}, Plain(), "no command"},
      {{"fetch", "k"}, Plain(), "unknown command 'fetch'"},
      {{"GET", "k"}, Plain(), "unknown command 'GET'"},
      {{"get"}, Plain(), "get takes 1 argument(s), not 0: get KEY"},
      {{"get", "k", "v"}, Plain(), "get takes 1 argument(s), not 2"},
      {{"put", "k"}, Plain(), "put takes 2 argument(s), not 1: put KEY VALUE"},
      {{"cas", "k", "v"}, Plain(), "cas takes 3 argument(s), not 2"},
      {{"cas", "k", "seven", "v"}, Plain(), "cas: VERSION 'seven' is not a version number"},
      {{"cas", "k", "-1", "v"}, Plain(), "cas: VERSION '-1' is not a version number"},
      {{"cas", "k", "18446744073709551616", "v"}, Plain(), "is not a version number"},
      {{"stats", "x"}, Plain(), "stats takes 0 argument(s), not 1"},
      {{"get", "abc"}, Hex(), "--hex: KEY 'abc' is not a hex string"},
      {{"put", "ab", "zz"}, Hex(), "--hex: VALUE 'zz' is not a hex string"},
      {{"get", "k"}, FromFile("/dev/null"), "--value_file: get takes no value"},
      {{"stats"}, FromFile("/dev/null"), "--value_file: stats takes no value"},
      {{"put", "k", "v"},
       FromFile("/dev/null"),
       "put takes 1 argument(s), not 2: put KEY VALUE "
       "(VALUE from --value_file)"},
      {{"put", "k"},
       FromFile("/nonexistent/value"),
       "--value_file=/nonexistent/value: cannot open it"},
      {{"put", "k"}, FromFile("/"), "--value_file=/: cannot read it"},  // a directory
      {{"put", "k"},
       FromFile("/dev/zero", 1 << 20),
       "--value_file=/dev/zero: longer than the largest value any server accepts (1048576 bytes)"},
  };
  for (const Refused& row : table) {
    SCOPED_TRACE(row.says);
    absl::StatusOr<KvCommand> command = ParseKvCommand(row.args, row.input);
    ASSERT_FALSE(command.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(command.status())) << command.status();
    EXPECT_TRUE(absl::StrContains(command.status().message(), row.says)) << command.status();
  }
}

TEST(KvCommand, AValueFileIsReadWholeByteForByte) {
  const char* dir = getenv("TEST_TMPDIR");
  std::string path_template = std::string(dir != nullptr ? dir : "/tmp") + "/value.XXXXXX";
  char* path = path_template.data();
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  // Over one read chunk (64 KiB), with every byte value, NULs included.
  std::string bytes;
  for (int i = 0; i < 200000; ++i) bytes.push_back(static_cast<char>(i * 7));
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  close(fd);
  absl::StatusOr<KvCommand> command = ParseKvCommand({"put", "k"}, FromFile(path));
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->value, bytes);
  // Exactly the limit is accepted; one byte more is refused.
  EXPECT_TRUE(ReadValueFile(path, bytes.size()).ok());
  EXPECT_FALSE(ReadValueFile(path, bytes.size() - 1).ok());
  unlink(path);
}

TEST(KvCommand, AClosedStdinIsAnErrorNotAnEmptyValue) {
  const int saved = dup(STDIN_FILENO);
  ASSERT_GE(saved, 0);
  close(STDIN_FILENO);
  absl::StatusOr<KvCommand> command = ParseKvCommand({"put", "k"}, FromFile("-"));
  ASSERT_EQ(dup2(saved, STDIN_FILENO), STDIN_FILENO);
  close(saved);
  ASSERT_FALSE(command.ok());
  EXPECT_TRUE(absl::StrContains(command.status().message(), "--value_file=- (stdin): cannot read"))
      << command.status();
}

TEST(KvCommand, ServersAreTheServerThenEachNewMember) {
  using Servers = std::vector<std::string>;
  EXPECT_EQ(*ServersToTry("h:1", true, ""), Servers{"h:1"});
  // --members with --server left at its default: the members alone.
  EXPECT_EQ(*ServersToTry("h:1", true, "a:2,b:3"), (Servers{"a:2", "b:3"}));
  // --server given: it first, then the members not listed yet.
  EXPECT_EQ(*ServersToTry("a:2", false, "a:2,b:3,b:3,,c:4"), (Servers{"a:2", "b:3", "c:4"}));
  for (const char* bad : {"a", "a:", "a:x", "a:65536", "a:2,b"}) {
    SCOPED_TRACE(bad);
    absl::StatusOr<Servers> servers = ServersToTry("h:1", true, bad);
    ASSERT_FALSE(servers.ok());
    EXPECT_TRUE(absl::StrContains(servers.status().message(), "is not host:port"));
  }
  EXPECT_FALSE(ServersToTry("h:1", true, ",,").ok());  // names no member
  EXPECT_TRUE(IsHostPort("10.0.0.1:65535"));
  EXPECT_TRUE(IsHostPort("[::1]:31850"));
  EXPECT_FALSE(IsHostPort("10.0.0.1:-1"));
}

}  // namespace
}  // namespace herd
