// What herd_server does once its primary is fenced (--rejoin_when_fenced, issues 35 and 37), in
// the branches the chaos checker never reaches. A fenced primary drops its copy, to come back as a
// backup, only once the stored configuration names another primary, live: a primary whose
// configuration lists no backup keeps its copy and stays up, fenced; one whose stored
// configuration lists a backup (even one it never heard of, the answer to its own write lost)
// keeps it too, until a takeover is stored and its new primary is live, and then rejoins; the
// backup count it reports is the stored configuration's, not the one it last held. A stop signal
// while it rejoins ends the process at once, cleanly. The real binary, a real ZooKeeper; a primary
// is fenced by pausing it (SIGSTOP) until its coordination session is gone, then waking it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "herd/replication/configuration.h"
#include "herd/replication/coordinator.h"
#include "tests/herd/server_binary.h"
#include "tests/herd/tcp_proxy.h"
#include "tests/herd/zookeeper.h"

namespace herd {
namespace {

constexpr char kServerBinary[] = "herd/herd_server";
constexpr int kSessionTimeoutMs = 2000;
// Any awaited change (a start, a session's expiry, a log line) on a loaded 2-core machine.
constexpr absl::Duration kDeadline = absl::Seconds(60);
constexpr absl::Duration kPoll = absl::Milliseconds(20);
constexpr absl::Duration kViewSessionTimeout = absl::Seconds(30);
// A stop must end a server at once (it waits for nothing): far less than the rejoin's retries
// (forever) it must not sit through, far more than a loaded machine needs.
constexpr absl::Duration kStopDeadline = absl::Seconds(10);
constexpr char kFencedNoBackup[] = "fenced with no backup in its configuration";
constexpr char kRejoining[] = "starting again as a backup";
constexpr char kRejoined[] = "rejoined cluster";
constexpr char kKeepsUntilTakeover[] = "fenced: keeping this copy until one of the configuration's";
constexpr char kRejoinRetried[] = "not rejoined yet";
// The stored configuration names a newer primary that is not live (WatchSuccession's log line).
constexpr char kTakeoverNotLive[] = "says succession unknown";
constexpr char kExitWhileRejoining[] = "while rejoining: exiting";
constexpr char kProgress[] = "progress {";
// A primary's progress line while its configuration lists one backup.
constexpr char kHoldsOneBackup[] = "\"role\":\"primary\",\"backups\":1,";
// How much of a server's log a failed assertion prints.
constexpr size_t kLogTailBytes = 6000;

std::string OutputDir() {
  const char* d = getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (d == nullptr) d = getenv("TEST_TMPDIR");
  return d != nullptr ? d : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class FencedPrimaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(zk_.ok()) << zk_.status();
    CoordinatorOptions o;
    o.hosts = zk_.hosts();
    o.cluster = cluster_;
    // The test's own view must outlive any load: only the servers' sessions are meant to expire.
    o.session_timeout = kViewSessionTimeout;
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    view_ = *std::move(c);
  }

  testing::ServerBinary& Server(const std::string& member) {
    std::unique_ptr<testing::ServerBinary>& s = servers_[member];
    if (s == nullptr) {
      s = std::make_unique<testing::ServerBinary>(
          kServerBinary,
          absl::StrCat(OutputDir(), "/fenced-",
                       ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
                       getpid(), "-", member, ".log"));
    }
    return *s;
  }

  absl::Status Start(const std::string& member, bool primary, bool auto_failover) {
    return Server(member).Start(
        {"--coordinator=" + zk_.hosts(), "--cluster=" + cluster_, "--member=" + member,
         primary ? "--role=primary" : "--role=backup", "--port=0",
         absl::StrCat("--replication_port=", testing::UnusedPort()), "--listen_address=127.0.0.1",
         "--workers=1", "--pin_workers=false", "--store_mode=store", "--mica_pool_bytes=4194304",
         "--mica_items=4096", "--max_clients=8", "--shm_fabric_name=" + cluster_,
         absl::StrCat("--session_timeout_ms=", kSessionTimeoutMs),
         absl::StrCat("--auto_failover=", auto_failover ? "true" : "false"), "--logtostderr"},
        kDeadline);
  }

  // Polls `done` until it holds or kDeadline passes.
  template <typename Done>
  bool Await(Done done) {
    const absl::Time give_up = absl::Now() + kDeadline;
    while (absl::Now() < give_up) {
      if (done()) return true;
      absl::SleepFor(kPoll);
    }
    return done();
  }

  // Only a registration the coordinator says is gone counts as gone (an error reading it, e.g.
  // a lost connection under load, does not).
  bool Registered(const std::string& member) {
    return !absl::IsNotFound(view_->Member(member).status());
  }

  // The end of the member's log, for a failed assertion's message (CI shows only that).
  std::string LogTail(const std::string& member) {
    const std::string log = ReadFile(Server(member).log());
    return absl::StrCat(Server(member).log(), ":\n",
                        log.size() > kLogTailBytes ? log.substr(log.size() - kLogTailBytes) : log);
  }

  bool LogHas(const std::string& member, absl::string_view text) {
    return absl::StrContains(ReadFile(Server(member).log()), text);
  }

  // Pauses the member until its coordination session has expired (its registration is gone),
  // runs `while_paused`, then wakes it: it learns it is fenced.
  void PauseUntilFenced(
      const std::string& member, const std::function<void()>& while_paused = [] {}) {
    ASSERT_TRUE(Await([&] { return Registered(member); })) << member << " never registered";
    Server(member).Signal(SIGSTOP);
    ASSERT_TRUE(Await([&] { return !Registered(member); }))
        << member << "'s registration outlived its paused session";
    while_paused();
    Server(member).Signal(SIGCONT);
  }

  // Replaces the stored configuration by change(stored), as the answer to a write the paused
  // primary made and never heard back about, or another member's takeover, would have left it.
  template <typename Change>
  ::testing::AssertionResult ChangeStoredConfiguration(Change change) {
    absl::StatusOr<VersionedConfiguration> current = view_->ReadConfiguration();
    if (!current.ok()) return ::testing::AssertionFailure() << current.status();
    absl::StatusOr<Configuration> next = change(current->configuration);
    if (!next.ok()) return ::testing::AssertionFailure() << next.status();
    if (absl::Status s = view_->ReplaceConfiguration(*current, *next); !s.ok()) {
      return ::testing::AssertionFailure() << s;
    }
    return ::testing::AssertionSuccess();
  }

  // Whether `text` is in the member's log followed by at least two progress lines (two more of
  // its once-a-second passes, each of which could have acted on it).
  bool LogHasTwoPassesAfter(const std::string& member, const std::string& text) {
    const std::string log = ReadFile(Server(member).log());
    const size_t at = log.find(text);
    if (at == std::string::npos) return false;
    const size_t first = log.find(kProgress, at);
    return first != std::string::npos && log.find(kProgress, first + 1) != std::string::npos;
  }

  // A stop ends the member with status 0.
  void StopAndExpectCleanExit(const std::string& member) {
    Server(member).Signal(SIGTERM);
    const int status = AwaitExit(member, kDeadline);
    ASSERT_NE(status, -1) << "a stop did not end " << member;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }

  // Whether the member's process is still running; one that exited is reaped (and forgotten).
  bool StillRunning(const std::string& member, int* status) {
    const pid_t pid = Server(member).pid();
    if (pid <= 0) return false;
    if (waitpid(pid, status, WNOHANG) == 0) return true;
    Server(member).Forget();
    return false;
  }

  // Waits up to `deadline` for the member's process to exit; its wait status, or -1 if it did
  // not.
  int AwaitExit(const std::string& member, absl::Duration deadline) {
    int status = -1;
    const absl::Time give_up = absl::Now() + deadline;
    while (StillRunning(member, &status)) {
      if (absl::Now() >= give_up) return -1;
      absl::SleepFor(kPoll);
    }
    return status;
  }

  std::string cluster_ = absl::StrCat("fenced-", getpid());
  testing::PrivateZooKeeper zk_;
  std::unique_ptr<Coordinator> view_;
  std::map<std::string, std::unique_ptr<testing::ServerBinary>> servers_;
};

// Nobody could take over from it, so its memory holds the only copy of every acknowledged write:
// it says so, keeps running, fenced, and never restarts itself as a backup (which would drop that
// copy and wait for a takeover that cannot come). A stop ends it as usual, with its totals.
TEST_F(FencedPrimaryTest, WithNoBackupItKeepsItsCopyAndStaysUp) {
  ASSERT_TRUE(Start("p", /*primary=*/true, /*auto_failover=*/true).ok());
  PauseUntilFenced("p");
  ASSERT_TRUE(Await([&] { return LogHas("p", kFencedNoBackup); })) << LogTail("p");
  // Its main loop goes on, fenced: two more of its once-a-second progress lines after that one.
  ASSERT_TRUE(Await([&] { return LogHasTwoPassesAfter("p", kFencedNoBackup); }))
      << "its loop stopped after it stayed fenced";
  int status = 0;
  ASSERT_TRUE(StillRunning("p", &status)) << "it exited: " << status;
  EXPECT_FALSE(LogHas("p", kRejoining)) << "a primary with no backup dropped its copy to rejoin";
  StopAndExpectCleanExit("p");
  EXPECT_TRUE(LogHas("p", "{\"server\":")) << "no totals printed at the stop";
}

// The stored configuration gains a backup while the primary is paused, as the answer to its own
// addition, lost, would leave it: that backup was never told it is in sync, so it cannot take
// over, and the primary keeps its copy (before: a backup in the configuration was reason enough
// to drop it). A takeover stored for a primary that is not live (it died after its promotion was
// committed) is no reason either. Once that primary is live, the primary drops its copy and
// rejoins.
TEST_F(FencedPrimaryTest, ItKeepsItsCopyUntilANewPrimaryIsLive) {
  ASSERT_TRUE(Start("p", /*primary=*/true, /*auto_failover=*/true).ok());
  bool added = false;
  PauseUntilFenced("p", [&] {
    added =
        ChangeStoredConfiguration([](const Configuration& c) { return AddBackupIn(c, "p", "b"); });
  });
  ASSERT_TRUE(added);
  ASSERT_TRUE(Await([&] { return LogHasTwoPassesAfter("p", kKeepsUntilTakeover); }))
      << LogTail("p");
  EXPECT_FALSE(LogHas("p", kRejoining)) << "it dropped its copy with no takeover stored";
  EXPECT_FALSE(LogHas("p", kFencedNoBackup)) << "it counted the configuration it held";
  ASSERT_TRUE(ChangeStoredConfiguration([&](const Configuration& c) {
    return PromoteIn(c, "b", view_->session_id(), PrimaryPresence::kGone);
  }));
  ASSERT_TRUE(Await([&] { return LogHasTwoPassesAfter("p", kTakeoverNotLive); })) << LogTail("p");
  EXPECT_FALSE(LogHas("p", kRejoining)) << "it dropped its copy for a primary that is not live";
  // b comes to life in the session its promotion names (the test's).
  MemberInfo b;
  b.client_address = "127.0.0.1:1";
  ASSERT_TRUE(view_->Register("b", b).ok());
  ASSERT_TRUE(Await([&] { return LogHas("p", kRejoined); })) << LogTail("p");
  StopAndExpectCleanExit("p");
}

// The other way: p held b as its backup, and the stored configuration dropped b while p was
// paused (p's own drop, whose answer it lost). p reports the stored configuration: no backup,
// nobody can take over, and it keeps the only copy.
TEST_F(FencedPrimaryTest, ABackupDroppedFromTheStoredConfigurationIsNotCounted) {
  ASSERT_TRUE(Start("p", /*primary=*/true, /*auto_failover=*/true).ok());
  ASSERT_TRUE(Start("b", /*primary=*/false, /*auto_failover=*/false).ok());
  ASSERT_TRUE(Await([&] { return LogHas("p", kHoldsOneBackup); })) << LogTail("p");
  bool dropped = false;
  PauseUntilFenced("p", [&] {
    dropped =
        ChangeStoredConfiguration([](const Configuration& c) { return DropBackupIn(c, "p", "b"); });
  });
  ASSERT_TRUE(dropped);
  ASSERT_TRUE(Await([&] { return LogHasTwoPassesAfter("p", kFencedNoBackup); })) << LogTail("p");
  EXPECT_FALSE(LogHas("p", kRejoining)) << "it dropped the only copy to rejoin";
  int status = 0;
  ASSERT_TRUE(StillRunning("p", &status)) << "it exited: " << status;
  StopAndExpectCleanExit("p");
}

// A fenced primary rejoins once its backup took over. Its new life cannot register while another
// live session holds its name (here the test's, taken while it was paused), so it retries every
// second; a SIGTERM then ends the process at once with status 0, and it never rejoined.
TEST_F(FencedPrimaryTest, AStopWhileItRejoinsEndsItAtOnce) {
  ASSERT_TRUE(Start("p", /*primary=*/true, /*auto_failover=*/true).ok());
  ASSERT_TRUE(Start("b", /*primary=*/false, /*auto_failover=*/true).ok());
  // Paused only once p itself serves with b as its backup (its progress line counts b), so that
  // b holds a whole copy and takes over.
  ASSERT_TRUE(Await([&] { return LogHas("p", kHoldsOneBackup); })) << LogTail("p");
  absl::Status squatted = absl::UnknownError("not tried");
  PauseUntilFenced("p", [&] {
    MemberInfo squatter;
    squatter.client_address = "127.0.0.1:1";
    squatted = view_->Register("p", squatter);
  });
  ASSERT_TRUE(squatted.ok()) << squatted;
  ASSERT_TRUE(Await([&] {
    absl::StatusOr<VersionedConfiguration> v = view_->ReadConfiguration();
    return v.ok() && v->configuration.primary == "b";
  })) << "b never took over";
  ASSERT_TRUE(Await([&] { return LogHas("p", kRejoinRetried); })) << LogTail("p");
  Server("p").Signal(SIGTERM);
  const int status = AwaitExit("p", kStopDeadline);
  ASSERT_NE(status, -1) << "a stop did not end a rejoin that retries";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(LogHas("p", kExitWhileRejoining));
  EXPECT_FALSE(LogHas("p", kRejoined)) << "its name was taken: it cannot have rejoined";
}

}  // namespace
}  // namespace herd
