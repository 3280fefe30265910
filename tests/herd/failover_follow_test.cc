// Clients that follow a promotion (issue 16): Client::Follow joins the new primary naming the
// session it had, and hands it every outstanding request; the new primary answers a mutation the
// old one executed from the outcome replicated with it (herd/replication/outcome_table.h).
//   - deterministic: a mutation executed and replicated whose answer never came (the primary's
//     UD responses are all lost) is answered after the failover with the OLD primary's version
//     (a re-execution would take one past the promoted clock's jump), and is not applied twice;
//   - under load, at a random kill: every logical client cycles INSERT, CAS, DELETE over keys
//     of its own, so any double application (EXISTS, CAS_FAILED, NOT_FOUND) or lost
//     acknowledged write shows up in an answer or in the final state, checked against a model.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "herd/join.h"
#include "tests/herd/raw_client.h"
#include "tests/herd/replication_workload.h"
#include "tests/herd/server_fixture.h"

namespace herd {
namespace {

using testing::JsonNumber;
using testing::ReplicatedServer;
using testing::ServerProcess;

// The promoted clock's jump (herd/replication/member_backup.cc): versions at or past it were handed
// out by the new primary.
constexpr uint64_t kPromotedVersions = uint64_t{1} << 32;

ClientOptions Follower(const std::string& fabric, std::vector<std::string> members,
                       uint32_t clients) {
  ClientOptions o;
  o.server = members.front();
  o.members = std::move(members);
  o.clients = clients;
  o.device.fabric = fabric;
  o.retry_timeout = absl::Milliseconds(5);
  o.adaptive_retry = false;
  o.max_attempts = 100000;  // only the deadline ends a request: a failover takes a while
  o.request_deadline = absl::Seconds(60);
  return o;
}

// Polls `client` until it delivers one result (or its server is lost: false).
bool PollOne(Client& client, Result* out) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < give_up) {
    if (client.Poll(absl::MakeSpan(out, 1)) == 1) return true;
    if (!client.health().ok()) return false;
  }
  return false;
}

// `lost`'s primary is dead: a GET of `key` submitted to it goes unanswered, Follow hands it to
// the promoted backup, and *result is the follower's answer to it.
void GetThroughFollow(Client& lost, const std::string& key, std::unique_ptr<Client>* follower,
                      Result* result) {
  constexpr uint64_t kTag = 0x6e7;
  ASSERT_TRUE(lost.Submit(0, Op::kGet, key, "", 0, kTag).ok());
  ASSERT_FALSE(PollOne(lost, result)) << "answered by a dead primary";
  absl::StatusOr<std::unique_ptr<Client>> followed = lost.Follow(absl::Seconds(30));
  ASSERT_TRUE(followed.ok()) << followed.status();
  *follower = *std::move(followed);
  ASSERT_TRUE(PollOne(**follower, result));
  EXPECT_EQ(result->tag, kTag);
}

// A store-mode backup and its primary, processes of their own, started in that order.
struct PrimaryAndBackup {
  explicit PrimaryAndBackup(const std::string& fabric)
      : backup(ReplicatedServer(fabric, mica::StoreMode::kStore, ReplicationRole::kBackup)),
        primary_options(
            ReplicatedServer(fabric, mica::StoreMode::kStore, ReplicationRole::kPrimary)) {
    if (!backup.ok()) return;
    primary_options.replication.backups.push_back(backup.replication_address());
    primary = std::make_unique<ServerProcess>(primary_options);
  }
  bool ok() const { return backup.ok() && primary != nullptr && primary->ok(); }

  ServerProcess backup;
  ServerOptions primary_options;
  std::unique_ptr<ServerProcess> primary;
};

TEST(FailoverFollow, AnUnansweredMutationIsAnsweredFromItsReplicatedOutcome) {
  for (const mica::StoreMode mode : {mica::StoreMode::kCache, mica::StoreMode::kStore}) {
    SCOPED_TRACE(std::string(mica::StoreModeName(mode)));
    const std::string fabric =
        absl::StrCat("follow-replay-", getpid(), "-", static_cast<int>(mode));
    ServerProcess backup(ReplicatedServer(fabric, mode, ReplicationRole::kBackup));
    ASSERT_TRUE(backup.ok());
    ServerOptions options = ReplicatedServer(fabric, mode, ReplicationRole::kPrimary);
    // Its clients never hear from it (every UD response lost); its backup link is clean.
    options.replication.device = options.device;
    options.device.faults.ud_loss = 1.0;
    options.replication.backups.push_back(backup.replication_address());
    auto primary = std::make_unique<ServerProcess>(options);
    ASSERT_TRUE(primary->ok());

    absl::StatusOr<std::unique_ptr<Client>> connected =
        Client::Connect(Follower(fabric, {primary->address(), backup.address()}, 1));
    ASSERT_TRUE(connected.ok()) << connected.status();
    std::unique_ptr<Client> client = *std::move(connected);
    const std::string value = "inserted once";
    ASSERT_TRUE(client->Submit(0, Op::kInsert, "k", value, 0, /*tag=*/7).ok());
    // Until the primary released it: executed, and held by its backup.
    for (int64_t released = 0; released < 1;) {
      ASSERT_FALSE(client->Poll({}) > 0);
      absl::StatusOr<std::string> stats = FetchServerStats(primary->address(), absl::Seconds(5));
      ASSERT_TRUE(stats.ok()) << stats.status();
      released = JsonNumber(*stats, "released");
    }
    primary->Kill();
    absl::StatusOr<std::string> promoted = testing::PromoteOnceDetached(backup.address());
    ASSERT_TRUE(promoted.ok()) << promoted.status();

    Result result;
    ASSERT_FALSE(PollOne(*client, &result)) << "answered by a primary whose answers are all lost";
    absl::StatusOr<std::unique_ptr<Client>> follower = client->Follow(absl::Seconds(30));
    ASSERT_TRUE(follower.ok()) << follower.status();
    client.reset();
    ASSERT_TRUE(PollOne(**follower, &result));
    EXPECT_EQ(result.tag, 7u);
    ASSERT_EQ(result.status, Status::kOk) << StatusName(result.status);
    EXPECT_GT(result.version, 0u);
    EXPECT_LT(result.version, kPromotedVersions) << "executed again at the new primary";
    EXPECT_GE(result.attempts, 1u);
    // Applied once: the key holds that version, and a new INSERT finds it.
    absl::StatusOr<Value> got = (*follower)->Get("k");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->value, value);
    EXPECT_EQ(got->version, result.version);
    EXPECT_TRUE(absl::IsAlreadyExists((*follower)->Insert("k", "again").status()));
    // Writes after the failover continue the sequence numbers and take new versions.
    absl::StatusOr<uint64_t> put = (*follower)->Put("k2", "after");
    ASSERT_TRUE(put.ok()) << put.status();
    EXPECT_GE(*put, kPromotedVersions);
    absl::StatusOr<std::string> stats = FetchServerStats(backup.address(), absl::Seconds(5));
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_GE(JsonNumber(*stats, "resumed_outcomes"), 1) << *stats;
    EXPECT_GE(JsonNumber(*stats, "replays"), 1) << *stats;
  }
}

// Each follower takes over its own session's outcomes and no other's (the rule itself, with a
// resumption naming a foreign session, is worker_rules_test's); a fresh client meanwhile gets
// ids nobody's outcomes await; requests outstanding at the loss are answered by the new primary.
TEST(FailoverFollow, EachFollowerTakesOverItsOwnOutcomes) {
  const std::string fabric = absl::StrCat("follow-foreign-", getpid());
  PrimaryAndBackup servers(fabric);
  ASSERT_TRUE(servers.ok());
  ServerProcess& backup = servers.backup;
  std::unique_ptr<ServerProcess>& primary = servers.primary;
  // Two clients write (outcomes recorded at ids 0 and 1), the primary dies, one follows.
  auto a = Client::Connect(Follower(fabric, {primary->address(), backup.address()}, 1));
  auto b = Client::Connect(Follower(fabric, {primary->address(), backup.address()}, 1));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Put("a", "from a").ok());
  ASSERT_TRUE((*b)->Put("b", "from b").ok());
  primary->Kill();
  ASSERT_TRUE(testing::PromoteOnceDetached(backup.address()).ok());
  // A fresh client joining the promoted backup before a and b came back gets ids whose old
  // outcomes nobody awaits: theirs (0 and 1) are kept for them, unwritten.
  ClientOptions fresh_options;
  fresh_options.server = backup.address();
  fresh_options.device.fabric = fabric;
  auto fresh = Client::Connect(fresh_options);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_GE((*fresh)->first_client_id(), 2u);
  ASSERT_TRUE((*fresh)->Put("fresh", "writes").ok());
  // A request outstanding when the loss is noticed, handed over too.
  Result result;
  std::unique_ptr<Client> follower;
  ASSERT_NO_FATAL_FAILURE(GetThroughFollow(**a, "a", &follower, &result));
  EXPECT_EQ(result.status, Status::kOk);
  EXPECT_EQ(result.value, "from a");
  // Only a's own outcome was taken over; b's awaits b.
  absl::StatusOr<std::string> stats = FetchServerStats(backup.address(), absl::Seconds(5));
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(JsonNumber(*stats, "resumed_outcomes"), 1) << *stats;
  std::unique_ptr<Client> b_follower;
  ASSERT_NO_FATAL_FAILURE(GetThroughFollow(**b, "b", &b_follower, &result));
  EXPECT_EQ(result.value, "from b");
  stats = FetchServerStats(backup.address(), absl::Seconds(5));
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(JsonNumber(*stats, "resumed_outcomes"), 2) << *stats;
}

// Resumptions are client-written: ids past --max_clients (also where first + count wraps 32
// bits) are refused at the join, and one naming a session it never had takes nothing over, nor
// overwrites what it did not take over, even from the honest client's own ids: the real follower
// still finds its outcomes.
TEST(FailoverFollow, HostileResumptionsAreRefusedOrTakeNothing) {
  const std::string fabric = absl::StrCat("follow-hostile-", getpid());
  PrimaryAndBackup servers(fabric);
  ASSERT_TRUE(servers.ok());
  ServerProcess& backup = servers.backup;
  std::unique_ptr<ServerProcess>& primary = servers.primary;
  const ServerOptions& options = servers.primary_options;
  const uint32_t max_clients = options.config.max_clients;
  auto honest = Client::Connect(Follower(fabric, {primary->address(), backup.address()}, 1));
  ASSERT_TRUE(honest.ok()) << honest.status();
  const absl::StatusOr<uint64_t> put = (*honest)->Put("h", "acknowledged");
  ASSERT_TRUE(put.ok()) << put.status();
  primary->Kill();
  ASSERT_TRUE(testing::PromoteOnceDetached(backup.address()).ok());

  struct Case {
    std::string name;
    uint32_t clients;
    uint32_t first;
    bool refused;
  };
  const std::vector<Case> cases = {
      {"the last id and one past it", 2, max_clients - 1, true},
      {"first + count wraps 32 bits", 2, 0xFFFFFFFFu, true},
      {"the honest client's id under a secret it never had", 1, (*honest)->first_client_id(),
       false},
  };
  // Secrets are drawn at random: this one is the lost session's with probability 2^-64.
  constexpr uint64_t kNotTheLostSecret = 0x5EC2E7;
  std::vector<std::unique_ptr<testing::RawClient>> admitted;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    testing::RawClientOptions raw;
    raw.server = backup.address();
    raw.fabric = fabric;
    raw.clients = k.clients;
    raw.tamper = [&](Join& j) {
      j.resume_first_client_id = k.first;
      j.resume_session = kNotTheLostSecret;
    };
    absl::StatusOr<std::unique_ptr<testing::RawClient>> joined = testing::RawClient::Connect(raw);
    if (k.refused) {
      ASSERT_FALSE(joined.ok()) << "admitted";
      EXPECT_NE(joined.status().message().find("past --max_clients"), std::string::npos)
          << joined.status();
    } else {
      ASSERT_TRUE(joined.ok()) << joined.status();
      // It gets the honest client's id itself (free: that session is gone); its PUTs in every
      // slot execute, but must not overwrite the old session's outcome entries there.
      testing::RawClient& hostile = **joined;
      ASSERT_EQ(hostile.first_client_id(), (*honest)->first_client_id())
          << "the guard below is exercised only on the honest client's own id";
      for (uint64_t seq = 1; seq <= hostile.config().window; ++seq) {
        testing::RawClient::Request request;
        request.worker = hostile.WorkerOf("h");
        request.seq = seq;
        request.op = Op::kPut;
        request.key = absl::StrCat("hostile-", seq);
        request.value = "x";
        // Another worker's key is refused; any key of this worker will do.
        while (hostile.WorkerOf(request.key) != request.worker) request.key += "+";
        absl::StatusOr<testing::RawResponse> answer = hostile.Call(request);
        ASSERT_TRUE(answer.ok()) << answer.status();
        EXPECT_EQ(answer->header.status, static_cast<uint8_t>(Status::kOk));
      }
      admitted.push_back(*std::move(joined));
    }
  }
  // The honest client follows (with a GET outstanding) and takes its PUT's outcome over: the
  // entry survived the hostile session's PUTs in every slot of that id, none of them recorded.
  Result result;
  std::unique_ptr<Client> follower;
  ASSERT_NO_FATAL_FAILURE(GetThroughFollow(**honest, "h", &follower, &result));
  EXPECT_EQ(result.status, Status::kOk);
  EXPECT_EQ(result.value, "acknowledged");
  EXPECT_EQ(result.version, *put);
  absl::StatusOr<std::string> stats = FetchServerStats(backup.address(), absl::Seconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(JsonNumber(*stats, "resumed_outcomes"), 1) << "only the honest follower took any";
  EXPECT_EQ(JsonNumber(*stats, "unrecorded_outcomes"), static_cast<int64_t>(options.config.window))
      << "the hostile session's outcomes were recorded over the awaited entries";
}

// Follow goes only to a promoted backup of the lost primary: an unreplicated server (or a
// primary that never lost anything) holds none of the lost session's outcomes, and resending
// there could apply a mutation twice. The requests then end TIMED_OUT (outcome unknown).
TEST(FailoverFollow, FollowRefusesAServerThatIsNotAPromotedBackup) {
  const std::string fabric = absl::StrCat("follow-refuse-", getpid());
  auto lost = std::make_unique<ServerProcess>(testing::SmallServer(fabric));
  ServerProcess other(testing::SmallServer(fabric));
  ASSERT_TRUE(lost->ok() && other.ok());
  ClientOptions o = Follower(fabric, {lost->address(), other.address()}, 1);
  o.request_deadline = absl::Seconds(5);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Put("k", "v").ok());
  lost->Kill();
  ASSERT_TRUE((*client)->Submit(0, Op::kPut, "k", "again", 0, /*tag=*/3).ok());
  Result result;
  ASSERT_FALSE(PollOne(**client, &result));
  absl::StatusOr<std::unique_ptr<Client>> follower = (*client)->Follow(absl::Milliseconds(300));
  ASSERT_FALSE(follower.ok());
  EXPECT_NE(follower.status().message().find("not a promoted backup"), std::string::npos)
      << follower.status();
  // Not followed, its request ends at its deadline with an unknown outcome.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((*client)->Poll(absl::MakeSpan(&result, 1)) == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up);
  }
  EXPECT_EQ(result.status, Status::kTimedOut);
  EXPECT_EQ(result.tag, 3u);
}

int Runs() {
  const char* runs = getenv("HERD_FAILOVER_RUNS");
  return runs != nullptr ? std::max(1, atoi(runs)) : 2;
}
int FirstRun() {
  const char* first = getenv("HERD_FAILOVER_FIRST_RUN");
  return first != nullptr ? std::max(0, atoi(first)) : 0;
}

// One logical client's keys and where each stands: absent, or present at a version with its
// last value; each key cycles INSERT -> CAS -> DELETE.
struct KeyModel {
  bool present = false;
  uint64_t version = 0;
  std::string value;
  int cas_done = 0;
};
constexpr int kKeysPerClient = 2;
constexpr uint32_t kClientsPerThread = 4;
constexpr int kThreads = 2;
// Operations each logical client runs after its thread followed the promotion.
constexpr int kOpsAfterFollow = 30;

std::string KeyOf(int thread, uint32_t client, int k) {
  return absl::StrFormat("x%d-%d-%d", thread, client, k);
}

TEST(FailoverFollow, UnderLoadEveryMutationIsAppliedExactlyOnce) {
  const int first = FirstRun();
  for (int run = first; run < first + Runs(); ++run) {
    std::mt19937_64 rng(7000 + run);
    const mica::StoreMode mode = run % 2 == 0 ? mica::StoreMode::kStore : mica::StoreMode::kCache;
    SCOPED_TRACE(absl::StrCat("run ", run, " ", std::string(mica::StoreModeName(mode))));
    const std::string fabric = absl::StrCat("follow-load-", getpid(), "-", run);
    const uint32_t delay_us = run % 4 < 2 ? 100 : 0;
    std::vector<std::unique_ptr<ServerProcess>> backups;
    ServerOptions options = ReplicatedServer(fabric, mode, ReplicationRole::kBackup);
    options.device.faults.delay_us = delay_us;
    for (int b = 0; b < 2; ++b) {
      backups.push_back(std::make_unique<ServerProcess>(options));
      ASSERT_TRUE(backups.back()->ok());
    }
    options = ReplicatedServer(fabric, mode, ReplicationRole::kPrimary);
    options.device.faults.delay_us = delay_us;
    // Links slower than the clients' fabric: many mutations are executed, in flight to the
    // backups, and unanswered when the primary dies.
    options.replication.device = options.device;
    options.replication.device->faults.delay_us = 2000;
    for (const auto& b : backups) options.replication.backups.push_back(b->replication_address());
    auto primary = std::make_unique<ServerProcess>(options);
    ASSERT_TRUE(primary->ok());
    const std::vector<std::string> members = {primary->address(), backups[0]->address(),
                                              backups[1]->address()};
    const uint64_t kill_after = 50 + rng() % 351;
    std::atomic<uint64_t> acknowledged{0};
    std::atomic<bool> killed{false};
    std::atomic<int> exited{0};  // threads done: a thread that failed early kills nothing
    // Read once here: Kill() below clears the fixture's pid while threads may still be running.
    const pid_t primary_pid = primary->pid();
    std::vector<std::vector<std::vector<KeyModel>>> models(
        kThreads, std::vector<std::vector<KeyModel>>(kClientsPerThread,
                                                     std::vector<KeyModel>(kKeysPerClient)));
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        absl::Cleanup count_exit = [&exited] { exited.fetch_add(1); };
        auto connected = Client::Connect(Follower(fabric, members, kClientsPerThread));
        if (!connected.ok()) {
          errors[t] = connected.status().ToString();
          return;
        }
        std::unique_ptr<Client> client = *std::move(connected);
        std::vector<std::vector<KeyModel>>& model = models[t];
        std::vector<bool> busy(kClientsPerThread, false);
        std::vector<int> next_key(kClientsPerThread, 0), key_of(kClientsPerThread, 0);
        std::vector<int> after_follow(kClientsPerThread, 0);
        std::vector<Op> op_of(kClientsPerThread, Op::kGet);
        std::vector<std::string> value_of(kClientsPerThread);
        uint64_t op_number = 0;
        bool followed = false;
        Result results[8];
        while (true) {
          bool all_done = followed;
          for (uint32_t c = 0; c < kClientsPerThread; ++c) {
            if (followed && after_follow[c] < kOpsAfterFollow) all_done = false;
            if (busy[c] || (followed && after_follow[c] >= kOpsAfterFollow)) continue;
            if (!client->health().ok()) break;
            const int k = next_key[c];
            KeyModel& m = model[c][k];
            const Op op = !m.present ? Op::kInsert : m.cas_done < 2 ? Op::kCas : Op::kDelete;
            const std::string value = absl::StrCat("t", t, "c", c, "k", k, "#", ++op_number);
            const absl::Status s =
                client->Submit(c, op, KeyOf(t, c, k), value, m.version, /*tag=*/c);
            if (absl::IsUnavailable(s)) break;  // lost: follow below
            if (!s.ok()) {
              errors[t] = absl::StrCat("submit: ", s.ToString());
              return;
            }
            busy[c] = true;
            key_of[c] = k;
            op_of[c] = op;
            value_of[c] = value;
          }
          if (all_done) break;
          const size_t n = client->Poll(absl::MakeSpan(results));
          for (size_t i = 0; i < n; ++i) {
            const Result& r = results[i];
            const auto c = static_cast<uint32_t>(r.tag);
            busy[c] = false;
            KeyModel& m = model[c][key_of[c]];
            if (r.status != Status::kOk) {
              // EXISTS / CAS_FAILED / NOT_FOUND: applied twice, or an acknowledged write lost.
              errors[t] = absl::StrFormat("%s of %s answered %s (model: %s v%d)", OpName(op_of[c]),
                                          KeyOf(t, c, key_of[c]), StatusName(r.status),
                                          m.present ? "present" : "absent", m.version);
              return;
            }
            if (r.version <= m.version) {
              errors[t] = absl::StrFormat("%s of %s: version %d not past %d", OpName(op_of[c]),
                                          KeyOf(t, c, key_of[c]), r.version, m.version);
              return;
            }
            m.version = r.version;
            if (op_of[c] == Op::kInsert) {
              m.present = true;
              m.cas_done = 0;
              m.value = value_of[c];
            } else if (op_of[c] == Op::kCas) {
              ++m.cas_done;
              m.value = value_of[c];
            } else {
              m.present = false;
              next_key[c] = (next_key[c] + 1) % kKeysPerClient;
            }
            if (followed) ++after_follow[c];
            if (acknowledged.fetch_add(1) + 1 == kill_after) {
              kill(primary_pid, SIGKILL);
              killed.store(true);
            }
          }
          if (!client->health().ok()) {
            if (followed) {
              errors[t] = "lost the new primary too";
              return;
            }
            absl::StatusOr<std::unique_ptr<Client>> follower = client->Follow(absl::Seconds(60));
            if (!follower.ok()) {
              errors[t] = absl::StrCat("follow: ", follower.status().ToString());
              return;
            }
            client = *std::move(follower);
            followed = true;
          }
        }
      });
    }
    // The operator: once the primary is dead, promote one backup. Reaping it before the killing
    // thread's kill() could let that kill reach a recycled pid: wait for `killed`.
    while (!killed.load() && exited.load() < kThreads) std::this_thread::yield();
    primary->Kill();
    const size_t chosen = rng() % backups.size();
    absl::StatusOr<std::string> promoted = testing::PromoteOnceDetached(backups[chosen]->address());
    for (std::thread& t : threads) t.join();
    ASSERT_TRUE(promoted.ok()) << promoted.status();
    for (int t = 0; t < kThreads; ++t)
      ASSERT_TRUE(errors[t].empty()) << "thread " << t << ": " << errors[t];
    // The new primary holds exactly the model.
    ClientOptions o;
    o.server = backups[chosen]->address();
    o.device.fabric = fabric;
    auto reader = Client::Connect(o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    for (int t = 0; t < kThreads; ++t) {
      for (uint32_t c = 0; c < kClientsPerThread; ++c) {
        for (int k = 0; k < kKeysPerClient; ++k) {
          const KeyModel& m = models[t][c][k];
          const absl::StatusOr<Value> got = (*reader)->Get(KeyOf(t, c, k));
          if (m.present) {
            ASSERT_TRUE(got.ok()) << KeyOf(t, c, k) << ": " << got.status();
            EXPECT_EQ(got->value, m.value) << KeyOf(t, c, k);
            EXPECT_EQ(got->version, m.version) << KeyOf(t, c, k);
          } else {
            EXPECT_TRUE(absl::IsNotFound(got.status())) << KeyOf(t, c, k) << ": " << got.status();
          }
        }
      }
    }
    absl::StatusOr<std::string> stats =
        FetchServerStats(backups[chosen]->address(), absl::Seconds(5));
    ASSERT_TRUE(stats.ok());
    // The takeover ran: every logical client's mutations left outcomes at the new primary.
    EXPECT_GT(JsonNumber(*stats, "resumed_outcomes"), 0) << *stats;
    // One line per run for scripts/failover_check.sh.
    testing::ReportRun(absl::StrFormat(
        "FOLLOW_RUN {\"run\":%d,\"acknowledged\":%d,\"resumed_outcomes\":%d,\"replays\":%d}", run,
        acknowledged.load(), JsonNumber(*stats, "resumed_outcomes"),
        JsonNumber(*stats, "replays")));
  }
}

}  // namespace
}  // namespace herd
