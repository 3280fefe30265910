// herd_kv: one key-value operation against a herd server from the command line, as redis-cli or
// memcached's tools do it: by hand, or from scripts (binary-safe with --hex or --value_file).
// Each run joins the server as one client, runs one synchronous request, prints its answer and
// leaves. kSynopsis and kDetails below are its manual (--help).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/client.h"
#include "herd/join.h"
#include "herd/kv_command.h"
#include "herd/replication/coordinator.h"
#include "transport/flags.h"

DECLARE_bool(help);  // gflags'
DECLARE_bool(helpshort);

DEFINE_string(server, "127.0.0.1:31850", "host:port of the server's control plane");
DEFINE_uint32(timeout_ms, 5000,
              "Bounds connecting (and joining), and then the request itself, in milliseconds");
DEFINE_bool(hex, false,
            "KEY and VALUE arguments are hex strings (binary-safe), and get prints the value in "
            "hex");
DEFINE_string(value_file, "",
              "put/insert/cas: take the value from this file ('-' = stdin), byte for byte, "
              "instead of a VALUE argument");
DEFINE_bool(show_version, false, "get: also print the value's version on stderr, as version=N");
DEFINE_string(members, "",
              "A replicated store's members, HOST:PORT,...: tried in turn (after --server, when "
              "it is given) while one cannot be reached, or (a backup) answers NOT_PRIMARY or "
              "BACKUP_BUSY; a mutation outstanding at a server that dies goes to the member "
              "promoted in its place (Client::Follow)");

DEFINE_string(coordinator, "",
              "A coordinated cluster's ZooKeeper, HOST:PORT[,...]: its members (the primary "
              "first) are taken from there, as --members");
DEFINE_string(cluster, "herd", "--coordinator: the cluster's name");

namespace {

// --helpshort lists the flags defined in files whose names contain this.
constexpr char kMainFile[] = "herd_kv_main";

// Exit statuses.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;       // the operation failed: NOT_FOUND, EXISTS, NO_MEMORY, ...
constexpr int kExitUsage = 2;        // a bad command line: command, arguments, flags, hex
constexpr int kExitUnreachable = 3;  // the server could not be reached, or did not answer

constexpr char kAbout[] = "runs one key-value operation against a herd server\n\n";
// What a usage error prints after its line; --help prints it between kAbout and kDetails.
constexpr char kSynopsis[] = R"(usage: herd_kv [flags] COMMAND [ARGS]

  get KEY                 prints KEY's value
  put KEY VALUE           stores VALUE; prints the new version
  insert KEY VALUE        stores VALUE if KEY is absent (else EXISTS); prints the new version
  del KEY                 deletes KEY; prints the new version
  cas KEY VERSION VALUE   stores VALUE if KEY is at VERSION (else CAS_FAILED naming the
                          current version); prints the new version
  stats                   prints the server's counters: one JSON line
)";

constexpr char kDetails[] = R"(
put, insert and cas take the value from --value_file=FILE ('-' = stdin) instead of VALUE.
--hex: KEY and VALUE are hex strings, and get prints hex. Arguments that start with '-' go
after '--': herd_kv put K -- -1.

Output: get writes the value's bytes exactly as stored, adding a newline only when stdout is a
terminal (so `herd_kv get K > F` returns what `herd_kv put K --value_file=F` stored); with
--hex, the value in hex and a newline. --show_version adds "version=N" on stderr. Versions
print in decimal, then a newline.

Exit status: 0 done; 1 the operation failed (NOT_FOUND, EXISTS, CAS_FAILED, KEY_TOO_LONG,
VALUE_TOO_LONG, NO_MEMORY, INTERNAL, ...); 2 a usage error; 3 the server could not be
reached or did not answer (UNAVAILABLE, TIMED_OUT, ...). A failure prints one line on stderr,
"herd_kv: NAME: what happened".

A replicated store: --members=HOST:PORT,... names its servers. The request goes to --server
(when given), then to each member in turn while the one tried cannot be reached or refuses it
unexecuted (a backup answers a mutation NOT_PRIMARY, a GET it cannot read whole BACKUP_BUSY),
so after a failover it finds the promoted backup; each try may take --timeout_ms. A request
outstanding at a server that is lost (killed, its connection gone) is handed to the member
promoted in its place, within --timeout_ms: a mutation the lost primary executed is answered
from its replicated outcome, never applied twice; with none promoted in time its outcome is
unknown (TIMED_OUT, exit 3). A failure names every member's answer. stats asks --server only.

Flags: --server, --members, --timeout_ms, --hex, --value_file, --show_version, and the
transport's (--fabric, --shm_fabric_name, --device, --gid_index, ...), as herd_server takes them.
--helpshort lists herd_kv's own flags, --help every flag.)";

// The line a failure prints: the status's message when it already starts with a NAME (every
// client library error does: "NOT_FOUND: no such key"), else the absl code's name first.
std::string Describe(const absl::Status& status) {
  const absl::string_view message = status.message();
  const size_t colon = message.find(':');
  const absl::string_view head = message.substr(0, colon);
  const bool named =
      colon != absl::string_view::npos && !head.empty() &&
      head.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ_") == absl::string_view::npos;
  if (named) return std::string(message);
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", message);
}

int Fail(int exit_code, const absl::Status& status) {
  fprintf(stderr, "herd_kv: %s\n", Describe(status).c_str());
  return exit_code;
}

int UsageFailure(const absl::Status& status) {
  Fail(kExitUsage, status);
  fprintf(stderr, "%s(herd_kv --help: output, exit statuses, flags)\n", kSynopsis);
  return kExitUsage;
}

// --help and --helpshort exit 0 here (gflags' own handling exits 1, which herd_kv's exit statuses
// give another meaning); gflags handles the other help flags.
bool ShowHelp(const char* argv0) {
  if (FLAGS_help) {
    gflags::ShowUsageWithFlags(argv0);
  } else if (FLAGS_helpshort) {
    gflags::ShowUsageWithFlagsRestrict(argv0, kMainFile);
  } else {
    gflags::HandleCommandLineHelpFlags();
    return false;
  }
  return true;
}

// A request's failure: the server's answer (1), or no answer at all (3: the client library says
// TIMED_OUT as kDeadlineExceeded, and a lost connection or a dead QP as kUnavailable).
int ExitCodeOf(const absl::Status& status) {
  return absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status) ? kExitUnreachable
                                                                         : kExitFailed;
}

bool IsBoolFlag(const std::string& name) {
  gflags::CommandLineFlagInfo info;
  return gflags::GetCommandLineFlagInfo(name.c_str(), &info) && info.type == "bool";
}

// Removes '--' and what follows it from argv, and returns what followed (arguments, whatever they
// look like). gflags would move those before the other arguments: herd_kv keeps their order.
std::vector<std::string> TakeArgumentsAfterDashes(int* argc, char** argv) {
  for (int i = 1; i < *argc; ++i) {
    if (absl::string_view(argv[i]) == "--") {
      std::vector<std::string> rest(argv + i + 1, argv + *argc);
      *argc = i;
      return rest;
    }
  }
  return {};
}

// gflags exits 1, in its own words, on a flag it does not know or a value it cannot take. herd_kv
// reports those as usage errors (exit 2), so it checks the flags against gflags' registry first.
absl::Status CheckFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-') continue;  // an argument ("-" too)
    const absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t equals = body.find('=');
    const std::string name(body.substr(0, equals));
    const bool inline_value = equals != absl::string_view::npos;
    if (!inline_value &&
        (IsBoolFlag(name) || (absl::StartsWith(name, "no") && IsBoolFlag(name.substr(2))))) {
      continue;
    }
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    std::string value;
    if (inline_value) {
      value = std::string(body.substr(equals + 1));
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
    // Parsed again, for good, by gflags.
    if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--%s=%s: not a valid %s", name, value, info.type));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckServerAddress(absl::string_view server) {
  if (herd::IsHostPort(server)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("--server=%s is not host:port (e.g. 127.0.0.1:31850)", server));
}

// --server, then each --members entry not already listed. With --members and --server left at
// its default, the members alone: a request for a replicated store never goes to whatever
// happens to listen on the default port.
absl::StatusOr<std::vector<std::string>> ServersFromFlags() {
  if (!FLAGS_coordinator.empty()) {
    if (!FLAGS_members.empty()) {
      return absl::InvalidArgumentError("--coordinator names the members: drop --members");
    }
    herd::CoordinatorOptions options;
    options.hosts = FLAGS_coordinator;
    options.cluster = FLAGS_cluster;
    options.connect_timeout = absl::Milliseconds(FLAGS_timeout_ms);
    absl::StatusOr<std::vector<std::string>> members = herd::ClusterAddresses(options);
    if (!members.ok()) return members.status();
    FLAGS_members = absl::StrJoin(*members, ",");  // followed as --members are
    return members;
  }
  return herd::ServersToTry(FLAGS_server, gflags::GetCommandLineFlagInfoOrDie("server").is_default,
                            FLAGS_members);
}

absl::StatusOr<herd::ClientOptions> ClientOptionsFromFlags() {
  if (absl::Status s = CheckServerAddress(FLAGS_server); !s.ok()) return s;
  if (FLAGS_timeout_ms == 0) return absl::InvalidArgumentError("--timeout_ms must be at least 1");
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  if (!device.ok()) return device.status();
  absl::StatusOr<transport::ConnectMode> connect = transport::ConnectModeFromFlags();
  if (!connect.ok()) return connect.status();
  herd::ClientOptions options;
  options.server = FLAGS_server;
  options.connect = *connect;
  options.device = *device;
  options.connect_timeout = absl::Milliseconds(FLAGS_timeout_ms);
  options.request_deadline = absl::Milliseconds(FLAGS_timeout_ms);
  return options;
}

void PrintVersion(uint64_t version) { printf("%llu\n", static_cast<unsigned long long>(version)); }

void PrintValue(const herd::Value& value) {
  if (FLAGS_hex) {
    printf("%s\n", absl::BytesToHexString(value.value).c_str());
  } else {
    fwrite(value.value.data(), 1, value.value.size(), stdout);
    if (isatty(STDOUT_FILENO)) putchar('\n');
  }
  if (FLAGS_show_version) {
    fprintf(stderr, "version=%llu\n", static_cast<unsigned long long>(value.version));
  }
}

herd::Op OpOf(herd::KvVerb verb) {
  switch (verb) {
    case herd::KvVerb::kPut:
      return herd::Op::kPut;
    case herd::KvVerb::kInsert:
      return herd::Op::kInsert;
    case herd::KvVerb::kDelete:
      return herd::Op::kDelete;
    case herd::KvVerb::kCas:
      return herd::Op::kCas;
    case herd::KvVerb::kGet:
    case herd::KvVerb::kStats:  // never sent (RunStats)
      break;
  }
  return herd::Op::kGet;
}

// Runs `command` on *client (logical client 0) and prints its answer. With --members, a server
// lost while the request was outstanding hands it to the promoted member (Client::Follow, which
// then becomes *client): a mutation the lost primary executed is answered from its replicated
// outcome, never applied twice. With no member promoted within --timeout_ms, the outcome stays
// unknown (TIMED_OUT). A GET is asked of the next member instead (UNAVAILABLE here).
absl::Status RunRequest(std::unique_ptr<herd::Client>& client, const herd::KvCommand& command) {
  constexpr uint64_t kTag = 1;
  if (absl::Status s = client->Submit(0, OpOf(command.verb), command.key, command.value,
                                      command.expected_version, kTag);
      !s.ok()) {
    return s;
  }
  herd::Result result;
  while (client->Poll(absl::MakeSpan(&result, 1)) == 0) {
    if (client->health().ok() || FLAGS_members.empty()) continue;
    if (command.verb == herd::KvVerb::kGet) {  // changes nothing: any member may be asked instead
      return absl::UnavailableError(
          absl::StrCat("UNAVAILABLE: the server was lost before it answered (",
                       client->health().message(), ")"));
    }
    absl::StatusOr<std::unique_ptr<herd::Client>> follower =
        client->Follow(absl::Milliseconds(FLAGS_timeout_ms));
    if (!follower.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "TIMED_OUT: the server was lost with the request outstanding and no member took it "
          "over (",
          follower.status().message(), "): its outcome is unknown"));
    }
    client = *std::move(follower);
  }
  if (absl::Status error = herd::ResultError(result); !error.ok()) return error;
  if (command.verb == herd::KvVerb::kGet) {
    PrintValue(herd::Value{std::string(result.value), result.version});
  } else {
    PrintVersion(result.version);
  }
  return absl::OkStatus();
}

int RunStats(const herd::ClientOptions& options) {
  // Over RDMA-CM the stats connection needs a device of its own; over TCP none.
  std::unique_ptr<transport::Device> device;
  if (options.connect == transport::ConnectMode::kCm) {
    absl::StatusOr<std::unique_ptr<transport::Device>> opened =
        transport::OpenDevice(options.device);
    if (!opened.ok()) return Fail(kExitUnreachable, opened.status());
    device = *std::move(opened);
  }
  absl::StatusOr<std::string> json = herd::FetchServerStats(
      FLAGS_server, absl::Milliseconds(FLAGS_timeout_ms), options.connect, device.get());
  if (!json.ok()) return Fail(kExitUnreachable, json.status());
  printf("%s\n", json->c_str());
  return kExitOk;
}

// Answers a member gives a request it did not execute: the next member may take it.
bool RefusedUnexecuted(const absl::Status& status) {
  return absl::StartsWith(status.message(), "NOT_PRIMARY:") ||
         absl::StartsWith(status.message(), "BACKUP_BUSY:");
}

int Run(const herd::KvCommand& command, const herd::ClientOptions& options,
        const std::vector<std::string>& servers) {
  if (command.verb == herd::KvVerb::kStats) return RunStats(options);
  absl::Status last;
  int last_exit = kExitUnreachable;
  std::vector<std::string> tried;  // "HOST:PORT NAME" per member, for the failure's line
  for (const std::string& server : servers) {
    herd::ClientOptions at = options;
    at.server = server;
    if (!FLAGS_members.empty()) at.members = servers;  // for Follow (RunRequest)
    absl::StatusOr<std::unique_ptr<herd::Client>> client = herd::Client::Connect(at);
    absl::Status done = client.ok() ? RunRequest(*client, command) : client.status();
    if (done.ok()) return kExitOk;
    const bool lost_get = command.verb == herd::KvVerb::kGet && absl::IsUnavailable(done);
    if (client.ok() && !RefusedUnexecuted(done) && !lost_get) {
      return Fail(ExitCodeOf(done), done);
    }
    const std::string line = Describe(done);
    tried.push_back(absl::StrCat(server, " ", line.substr(0, line.find(':'))));
    last_exit = client.ok() ? ExitCodeOf(done) : kExitUnreachable;
    last = std::move(done);
  }
  if (servers.size() > 1) {  // the last member's words, and what each member said
    last = absl::Status(
        last.code(),
        absl::StrCat(Describe(last), " (members tried: ", absl::StrJoin(tried, ", "), ")"));
  }
  return Fail(last_exit, last);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(absl::StrCat(kAbout, kSynopsis, kDetails));
  // Quiet by default: stderr carries one line per failure. --minloglevel=0 shows the library's.
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = google::GLOG_ERROR;
  const std::vector<std::string> after_dashes = TakeArgumentsAfterDashes(&argc, argv);
  if (absl::Status s = CheckFlags(argc, argv); !s.ok()) return UsageFailure(s);
  gflags::ParseCommandLineNonHelpFlags(&argc, &argv, /*remove_flags=*/true);
  if (ShowHelp(argv[0])) return kExitOk;
  google::InitGoogleLogging(argv[0]);

  std::vector<std::string> arguments(argv + 1, argv + argc);
  arguments.insert(arguments.end(), after_dashes.begin(), after_dashes.end());
  herd::KvInput input;
  input.hex = FLAGS_hex;
  input.value_file = FLAGS_value_file;
  input.max_value_bytes = herd::kMaxLargeValueBytes;
  absl::StatusOr<herd::KvCommand> command = herd::ParseKvCommand(arguments, input);
  if (!command.ok()) return UsageFailure(command.status());
  absl::StatusOr<herd::ClientOptions> options = ClientOptionsFromFlags();
  if (!options.ok()) return UsageFailure(options.status());
  absl::StatusOr<std::vector<std::string>> servers = ServersFromFlags();
  if (!servers.ok()) {
    // A bad flag is a usage error; a coordinator that does not answer, or a cluster with no
    // member registered, is a server that cannot be reached.
    return absl::IsInvalidArgument(servers.status()) ? UsageFailure(servers.status())
                                                     : Fail(kExitUnreachable, servers.status());
  }
  const int exit_code = Run(*command, *options, *servers);
  if (fflush(stdout) != 0 && exit_code == kExitOk) {
    return Fail(kExitFailed,
                absl::DataLossError(absl::StrCat("writing stdout: ", strerror(errno))));
  }
  return exit_code;
}
