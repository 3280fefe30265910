// The project's own adversarial suite: a hostile client (tests/herd/raw_client.h) tries to break
// each promise of docs/architecture.md, "Trust model", while a well-behaved victim herd::Client
// runs a model-checked workload. The victim must see no wrong value, no lost acknowledged write
// and no stall; the server (a forked process) must keep serving and exit cleanly (a crash is a
// failed exit status). Nothing here proves a non-event by sleeping: each test shows it by a later
// event that could only happen after the attack was processed (the victim's or the attacker's
// next answer, a full scan cycle of the worker, a counter that moved). Seeds are fixed and
// printed; every loop is bounded.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "herd/client.h"
#include "herd/join.h"
#include "mica/keyhash.h"
#include "tests/herd/model_workload.h"
#include "tests/herd/raw_client.h"
#include "tests/herd/server_fixture.h"
#include "transport/control/channel.h"
#include "transport/control/wire.h"
#include "transport/shm/segment.h"

namespace herd::testing {
namespace {

using transport::CompletionStatus;

constexpr uint32_t kWorkers = 2;
constexpr uint32_t kMaxClients = 16;
// A victim request that is not answered within this long fails the workload (kTimedOut): a
// stall shows up as a failure in bounded time.
constexpr absl::Duration kVictimDeadline = absl::Seconds(5);
constexpr uint32_t kVictimOps = 1500;
constexpr uint32_t kVictimKeys = 64;
constexpr absl::Duration kCallTimeout = absl::Seconds(5);
constexpr uint32_t kAsyncDelayUs = 100;

ServerOptions Options(const std::string& fabric, RequestVerb verb, uint32_t delay_us = 0) {
  ServerOptions options = SmallServer(fabric);
  options.config.workers = kWorkers;
  options.config.max_clients = kMaxClients;
  options.config.request_verb = verb;
  options.device.faults.delay_us = delay_us;
  return options;
}

ClientOptions VictimOptions(const ServerProcess& server, const std::string& fabric,
                            uint32_t clients, uint32_t delay_us = 0) {
  ClientOptions options;
  options.server = server.address();
  options.clients = clients;
  options.device.fabric = fabric;
  options.device.faults.delay_us = delay_us;
  options.retry_timeout = absl::Milliseconds(5);
  options.request_deadline = kVictimDeadline;
  options.connect_timeout = absl::Seconds(5);
  return options;
}

std::unique_ptr<Client> JoinVictim(const ServerProcess& server, const std::string& fabric,
                                   uint32_t clients, uint32_t delay_us = 0) {
  auto client = Client::Connect(VictimOptions(server, fabric, clients, delay_us));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

std::unique_ptr<RawClient> JoinRaw(const ServerProcess& server, const std::string& fabric,
                                   uint32_t clients, uint32_t delay_us = 0) {
  RawClientOptions options;
  options.server = server.address();
  options.fabric = fabric;
  options.clients = clients;
  options.delay_us = delay_us;
  auto client = RawClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// A key that `worker` of `workers` owns.
std::string KeyOn(uint32_t worker, uint32_t workers, std::string_view prefix) {
  constexpr int kTries = 100000;
  for (int i = 0; i < kTries; ++i) {
    std::string key = absl::StrCat(std::string(prefix), "-", i);
    if (mica::PartitionOf(mica::KeyHash(key), workers) == worker) return key;
  }
  ADD_FAILURE() << "no key of prefix " << prefix << " on worker " << worker;
  return std::string(prefix);
}

uint64_t Seed(uint64_t seed) {
  std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

// The victim's model workload in its own thread, while the test attacks.
class VictimRun {
 public:
  VictimRun(Client& client, uint32_t ops, uint64_t seed)
      : thread_([&client, ops, seed] { RunModelWorkload(client, ops, kVictimKeys, seed); }) {}
  ~VictimRun() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::thread thread_;
};

// Proves that nothing `raw` wrote into its own client-1 slots at `worker` executed: a GET in its
// client-0 slot, answered; the same slot again (the worker scanned EVERY slot, client 1's
// included, in between: a full cycle of its round-robin scan), answered; then a GET of `key`.
// Had an authentic PUT of `key` landed in a client-1 slot before the first GET, it executed
// before the last one was read, and the last GET finds it.
void ExpectNothingExecuted(RawClient& raw, uint32_t worker, const std::string& key,
                           uint64_t* next_seq) {
  const uint32_t window = raw.config().window;
  const std::string probe = KeyOn(worker, raw.config().workers, "probe");
  for (const std::string& k : {probe, probe, key}) {
    RawClient::Request get;
    get.client = 0;
    get.worker = worker;
    get.seq = *next_seq;
    get.op = Op::kGet;
    get.key = k;
    *next_seq += window;  // the same slot each time
    absl::StatusOr<RawResponse> r = raw.Call(get, kCallTimeout);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(static_cast<Status>(r->header.status), Status::kNotFound)
        << "key " << k << " exists: a forged WRITE into another session's slot executed";
  }
}

// ------------------------------------------------------------------------------------------
// 1. WRITEs into other sessions' slots: with the attacker's own rkey (outside its MR), with
//    rkeys guessed around its own (shm: index << 8 | generation), and with the victim's real one
//    (the raw victim's, which the test knows). None may land. The payloads are AUTHENTIC PUTs of
//    the victim (its secret, its id, a slot-consistent sequence number), so one that landed would
//    execute and be seen.

using WriteParam = std::tuple<RequestVerb, uint32_t>;  // verb, fabric delay (us)

class ForeignSlotWrites : public ::testing::TestWithParam<WriteParam> {};

TEST_P(ForeignSlotWrites, NeverLand) {
  const auto [verb, delay_us] = GetParam();
  const bool rc = verb == RequestVerb::kRcWrite;
  const std::string fabric = absl::StrFormat("adv-foreign-%d-%d", static_cast<int>(verb), delay_us);
  ServerProcess server(Options(fabric, verb, delay_us));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 2, delay_us);   // a herd::Client
  auto raw_victim = JoinRaw(server, fabric, 2, delay_us);  // a victim whose keys the test knows
  auto attacker = JoinRaw(server, fabric, 1, delay_us);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(raw_victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  const uint64_t block = c.client_block_bytes();
  const uint32_t own_rkey = attacker->welcome().region_rkey;
  const uint32_t victim_rkey = raw_victim->welcome().region_rkey;
  std::printf("[ keys     ] attacker rkey 0x%x, victim rkey 0x%x\n", own_rkey, victim_rkey);

  // Targets: slot 1 of each worker of the raw victim's client 1 (a PUT signed with its secret),
  // and of the herd victim's client 0 (signed with its secret, far-ahead sequence number).
  struct Target {
    uint32_t worker;
    uint64_t addr;  // where the payload starts (end-aligned in the slot)
    std::vector<uint8_t> payload;
  };
  constexpr uint32_t kSlot = 1;
  constexpr uint64_t kFarAhead = 1000;
  std::vector<Target> targets;
  for (uint32_t w = 0; w < c.workers; ++w) {
    RawClient::Request put;
    put.client = 1;
    put.worker = w;
    put.seq = kFarAhead * c.window + kSlot;
    put.op = Op::kPut;
    put.key = KeyOn(w, c.workers, "landed");
    put.value = "pwned";
    std::vector<uint8_t> bytes = raw_victim->Encode(put);
    targets.push_back(
        {w, raw_victim->SlotAddress(1, w, kSlot) + c.slot_bytes - bytes.size(), std::move(bytes)});
    // The herd victim's block lies at its client id's place in the region.
    put.client_id = victim->first_client_id();
    put.secret = victim->session_secret();
    put.key = KeyOn(w, c.workers, "landed-herd");
    bytes = attacker->Encode(put);
    const uint64_t base = attacker->welcome().region_addr +
                          (uint64_t{victim->first_client_id()} - attacker->first_client_id()) *
                              block;  // wraps below: the arithmetic is modulo 2^64
    targets.push_back(
        {w, base + c.SlotOffset(w, 0, kSlot) + c.slot_bytes - bytes.size(), std::move(bytes)});
  }

  VictimRun run(*victim, kVictimOps, Seed(1));
  auto write = [&](uint32_t worker, uint64_t addr, uint32_t rkey,
                   const std::vector<uint8_t>& bytes) -> CompletionStatus {
    if (!rc) {
      absl::StatusOr<CompletionStatus> s = attacker->Write(worker, addr, rkey, bytes);
      EXPECT_TRUE(s.ok()) << s.status();
      return s.ok() ? *s : CompletionStatus::kOtherError;
    }
    // RC: a refused WRITE puts the QP in error; each try gets a fresh QP to the session's own.
    auto qp =
        attacker->NewConnectedQp(transport::QpType::kRc, attacker->welcome().request_qps[worker]);
    EXPECT_TRUE(qp.ok()) << qp.status();
    if (!qp.ok()) return CompletionStatus::kOtherError;
    absl::StatusOr<CompletionStatus> s = attacker->WriteThrough(**qp, addr, rkey, bytes);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : CompletionStatus::kOtherError;
  };
  // (a) its own rkey, outside its region; (c) the victim's real rkey through its own QP.
  for (const Target& t : targets) {
    const CompletionStatus own = write(t.worker, t.addr, own_rkey, t.payload);
    const CompletionStatus real = write(t.worker, t.addr, victim_rkey, t.payload);
    if (rc) {
      EXPECT_EQ(own, CompletionStatus::kRemoteAccessError) << transport::ToString(own);
      EXPECT_EQ(real, CompletionStatus::kRemoteAccessError)
          << "the victim's rkey through the attacker's QP: " << transport::ToString(real)
          << " (the fabric does not check the QP's protection domain)";
    }
  }
  // (b) rkeys guessed around its own: neighbouring region indices, every generation. UC only (an
  // RC guess costs a QP); RC gets the neighbours of both keys.
  constexpr int kIndexSpread = 8;
  constexpr uint32_t kGenerations = 1u << transport::shm::kMrIndexShift;
  const int own_index = static_cast<int>(own_rkey >> transport::shm::kMrIndexShift);
  uint64_t guesses = 0;
  for (int index = own_index - kIndexSpread; index <= own_index + kIndexSpread; ++index) {
    if (index < 0) continue;
    for (uint32_t generation = 1; generation < kGenerations; ++generation) {
      const uint32_t guess =
          (static_cast<uint32_t>(index) << transport::shm::kMrIndexShift) | generation;
      if (rc && guess != own_rkey + 1 && guess != own_rkey - 1 && guess != victim_rkey + 1 &&
          guess != victim_rkey - 1) {
        continue;
      }
      for (const Target& t : targets) {
        const CompletionStatus s = write(t.worker, t.addr, guess, t.payload);
        if (rc) {
          EXPECT_NE(s, CompletionStatus::kSuccess) << "guessed rkey 0x" << std::hex << guess;
        }
        ++guesses;
      }
    }
  }
  std::printf("[ guesses  ] %llu WRITEs with guessed rkeys\n",
              static_cast<unsigned long long>(guesses));
  // Whatever landed in the raw victim's client-1 slots has executed by now, if it ever will.
  for (uint32_t w = 0; w < c.workers; ++w) {
    uint64_t seq = 1;
    ExpectNothingExecuted(*raw_victim, w, KeyOn(w, c.workers, "landed"), &seq);
  }
  run.Join();
  // The herd victim saw no wrong answer and no stall (RunModelWorkload), and none of the forged
  // PUTs into its slots executed.
  for (uint32_t w = 0; w < c.workers; ++w) {
    const absl::StatusOr<Value> got = victim->Get(KeyOn(w, c.workers, "landed-herd"));
    EXPECT_TRUE(absl::IsNotFound(got.status()))
        << "a PUT forged into the herd victim's slot: "
        << (got.ok() ? absl::StrCat("executed, value ", got->value) : got.status().ToString());
  }
}

INSTANTIATE_TEST_SUITE_P(Verbs, ForeignSlotWrites,
                         ::testing::Combine(::testing::Values(RequestVerb::kUcWrite,
                                                              RequestVerb::kRcWrite),
                                            ::testing::Values(0u, kAsyncDelayUs)),
                         [](const ::testing::TestParamInfo<WriteParam>& info) {
                           return absl::StrCat(std::string(Name(std::get<0>(info.param))),
                                               std::get<1>(info.param) > 0 ? "_async" : "_sync");
                         });

// ------------------------------------------------------------------------------------------
// 2 and 4. Requests that name another client: authentic requests in the attacker's own slots
// (or its own UD SENDs) carrying the victim's client id, with the victim's next sequence numbers
// (the old code let the victim's first PUT be answered OK and never applied) and far-ahead ones.

class ForgedIdentity : public ::testing::TestWithParam<RequestVerb> {};

TEST_P(ForgedIdentity, RequestsNamingAnotherClientDoNotAffectIt) {
  const RequestVerb verb = GetParam();
  const bool slots = verb != RequestVerb::kUdSend;
  const std::string fabric = absl::StrFormat("adv-identity-%d", static_cast<int>(verb));
  ServerProcess server(Options(fabric, verb));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 2);
  auto attacker = JoinRaw(server, fabric, 1);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  uint64_t own_seq = 1;  // the attacker's own, honest, sequence (client 0, per worker the same)
  // Forges one request per (victim client, worker, seq); returns how many.
  auto forge = [&](uint64_t first_seq, uint64_t count, uint64_t secret) {
    for (uint32_t vc = 0; vc < victim->clients(); ++vc) {
      for (uint32_t w = 0; w < c.workers; ++w) {
        for (uint64_t seq = first_seq; seq < first_seq + count; ++seq) {
          RawClient::Request put;
          put.worker = w;
          put.seq = seq;
          put.op = Op::kPut;
          put.key = KeyOn(w, c.workers, "mine");
          put.value = "FORGED";
          put.client_id = victim->first_client_id() + vc;
          put.secret = secret;
          if (slots) {
            // In its own slots: answered, to the attacker, as a bad request.
            absl::StatusOr<RawResponse> r = attacker->Call(put, kCallTimeout);
            ASSERT_TRUE(r.ok()) << r.status() << ": seq " << seq << " to worker " << w
                                << " naming client " << put.client_id;
            EXPECT_EQ(static_cast<Status>(r->header.status), Status::kBadRequest);
            EXPECT_EQ(r->header.client_id, attacker->first_client_id());
          } else {
            absl::StatusOr<CompletionStatus> s = attacker->Send(put);
            ASSERT_TRUE(s.ok()) << s.status();
          }
        }
      }
    }
    if (!slots) {
      // UD receives are processed in arrival order: once the attacker's own next request is
      // answered, every forged one before it was seen (and dropped unanswered).
      for (uint32_t w = 0; w < c.workers; ++w) {
        RawClient::Request get;
        get.worker = w;
        get.seq = own_seq;
        get.op = Op::kGet;
        get.key = KeyOn(w, c.workers, "attacker");
        absl::StatusOr<RawResponse> r = attacker->Call(get, kCallTimeout);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(static_cast<Status>(r->header.status), Status::kNotFound);
      }
      ++own_seq;
    }
  };
  // The victim's next sequence numbers (a fresh client starts at 1 per worker), signed by the
  // attacker's session.
  forge(1, c.window, attacker->welcome().secret);
  // The victim's first request to each worker is a PUT with sequence number 1: applied.
  for (uint32_t w = 0; w < c.workers; ++w) {
    const std::string key = KeyOn(w, c.workers, "mine");
    const std::string value = absl::StrCat("victim-", w);
    ASSERT_TRUE(victim->Put(key, value).ok());
    absl::StatusOr<Value> got = victim->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->value, value) << "the victim's acknowledged PUT was never applied";
  }
  // Far-ahead sequence numbers while the victim runs its workload.
  VictimRun run(*victim, kVictimOps, Seed(2));
  forge(1000 * c.window + 1, c.window, attacker->welcome().secret);
  run.Join();
  for (uint32_t w = 0; w < c.workers; ++w) {
    absl::StatusOr<Value> got = victim->Get(KeyOn(w, c.workers, "mine"));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->value, absl::StrCat("victim-", w));
  }
}

INSTANTIATE_TEST_SUITE_P(Verbs, ForgedIdentity,
                         ::testing::Values(RequestVerb::kUcWrite, RequestVerb::kUdSend),
                         [](const ::testing::TestParamInfo<RequestVerb>& info) {
                           return std::string(Name(info.param));
                         });

// The source-QP check on its own: UD requests naming the victim and signed with the victim's OWN
// secret (as if it leaked; the trust model's forger cannot see it), sent from the attacker's UD
// QP. Only their source QP tells them apart, and the worker must reject them by it.
TEST(Adversarial, UdRequestsFromAnotherQpAreRejectedEvenWithTheVictimsSecret) {
  const std::string fabric = "adv-source-qp";
  ServerProcess server(Options(fabric, RequestVerb::kUdSend));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 1);
  auto attacker = JoinRaw(server, fabric, 1);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  std::printf(
      "[ qpns     ] victim's UD QP 0x%x (device %s), attacker's 0x%x\n",
      victim->UdEndpointForTest().qp_num,
      victim->UdEndpointForTest().gid == attacker->ud_endpoint().gid ? "the same" : "another",
      attacker->ud_endpoint().qp_num);
  for (uint32_t w = 0; w < c.workers; ++w) {
    for (uint64_t seq = 1; seq <= c.window; ++seq) {
      RawClient::Request put;
      put.worker = w;
      put.seq = seq;
      put.op = Op::kPut;
      put.key = KeyOn(w, c.workers, "mine");
      put.value = "FORGED";
      put.client_id = victim->first_client_id();
      put.secret = victim->session_secret();
      ASSERT_TRUE(attacker->Send(put).ok());
    }
    // Receives are handled in arrival order: the attacker's own request, answered, comes after.
    RawClient::Request get;
    get.worker = w;
    get.seq = 1;
    get.key = KeyOn(w, c.workers, "attacker");
    absl::StatusOr<RawResponse> r = attacker->Call(get, kCallTimeout);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  for (uint32_t w = 0; w < c.workers; ++w) {
    const std::string key = KeyOn(w, c.workers, "mine");
    const std::string value = absl::StrCat("victim-", w);
    ASSERT_TRUE(victim->Put(key, value).ok());
    absl::StatusOr<Value> got = victim->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->value, value) << "a forged UD request executed as the victim";
  }
  RunModelWorkload(*victim, 500, kVictimKeys, Seed(13));
}

// ------------------------------------------------------------------------------------------
// 3. Forged responses. The attacker learned the victim's UD QP (a test accessor) and SENDs it
// well-formed answers to its outstanding GETs, under the public kQkey and under the victim's
// real qkey, from its own QP. The server's answers are delayed (20 ms) so every forgery is in the
// victim's receive queue first; the victim must deliver only the real values.

TEST(Adversarial, ForgedUdResponsesAreNeverDelivered) {
  const std::string fabric = "adv-forged-responses";
  constexpr uint32_t kServerDelayUs = 20'000;
  constexpr int kRounds = 20;
  ServerProcess server(Options(fabric, RequestVerb::kUcWrite, kServerDelayUs));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 1);
  auto attacker = JoinRaw(server, fabric, 1);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  const transport::QpEndpoint target = victim->UdEndpointForTest();
  const uint32_t real_qkey = victim->UdQkeyForTest();
  std::printf("[ qpns     ] attacker's UD QP 0x%x; workers' response QPs",
              attacker->ud_endpoint().qp_num);
  for (uint32_t qpn : attacker->welcome().worker_response_qpns) std::printf(" 0x%x", qpn);
  std::printf("\n");
  std::vector<uint64_t> next_seq(c.workers, 1);
  for (uint32_t w = 0; w < c.workers; ++w) {
    ASSERT_TRUE(victim->Put(KeyOn(w, c.workers, "real"), "real").ok());
    ++next_seq[w];
  }
  const uint64_t stray_before = victim->stats().stray;
  uint64_t delivered_forgeries = 0;  // sent under the victim's own qkey: they reach its queue
  std::vector<Result> results(8);
  for (int round = 0; round < kRounds; ++round) {
    const uint32_t w = static_cast<uint32_t>(round) % c.workers;
    const std::string key = KeyOn(w, c.workers, "real");
    ASSERT_TRUE(victim->Submit(0, Op::kGet, key, "", 0, round).ok());
    for (uint32_t qkey : {kQkey, real_qkey}) {
      for (uint32_t attempt : {0u, 1u}) {
        std::vector<uint8_t> message(ResponseBytes(6));
        std::memcpy(message.data(), "FORGED", 6);
        ResponseHeader h{};
        h.keyhash = mica::KeyHash(key);
        h.version = 999;
        h.value_bytes = 6;
        h.client_id = victim->first_client_id();
        h.status = static_cast<uint8_t>(Status::kOk);
        h.worker = static_cast<uint16_t>(w);
        h.attempt = attempt;
        h.seq = next_seq[w];
        EncodeResponseHeader(h, 0, message.data());
        absl::StatusOr<CompletionStatus> s = attacker->SendUd(target, qkey, message);
        ASSERT_TRUE(s.ok()) << s.status();
        if (qkey == real_qkey) ++delivered_forgeries;
      }
    }
    ++next_seq[w];
    size_t got = 0;
    const absl::Time give_up = absl::Now() + kCallTimeout;
    while (got == 0 && absl::Now() < give_up) got = victim->Poll(absl::MakeSpan(results));
    ASSERT_EQ(got, 1u) << "round " << round;
    EXPECT_EQ(results[0].status, Status::kOk);
    EXPECT_EQ(results[0].value, "real") << "a forged response was delivered";
    EXPECT_NE(results[0].version, 999u);
  }
  // Every forgery under the victim's qkey was in its queue before the real answer, and was
  // judged (and dropped) before it: the stray counter moved by at least that many.
  EXPECT_GE(victim->stats().stray - stray_before, delivered_forgeries);
  RunModelWorkload(*victim, 200, kVictimKeys, Seed(3));
}

// ------------------------------------------------------------------------------------------
// 5. UD requests longer than a slot (but within the MTU) at a worker: the sender's loss only.

TEST(Adversarial, OversizeUdRequestsDoNotStopAWorker) {
  const std::string fabric = "adv-oversize";
  ServerProcess server(Options(fabric, RequestVerb::kUdSend));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 2);
  auto attacker = JoinRaw(server, fabric, 1);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  constexpr uint32_t kMtu = 4096;
  for (uint32_t w = 0; w < c.workers; ++w) {
    for (uint32_t bytes : {c.slot_bytes + 1, c.slot_bytes + 64, kMtu}) {
      std::vector<uint8_t> message(bytes, 0xab);
      absl::StatusOr<CompletionStatus> s =
          attacker->SendUd(attacker->welcome().worker_ud[w], kQkey, message);
      ASSERT_TRUE(s.ok()) << s.status();
    }
  }
  // Each worker still answers the attacker's own next request, and the victim's workload.
  for (uint32_t w = 0; w < c.workers; ++w) {
    RawClient::Request get;
    get.worker = w;
    get.seq = 1;
    get.key = KeyOn(w, c.workers, "after-oversize");
    absl::StatusOr<RawResponse> r = attacker->Call(get, kCallTimeout);
    EXPECT_TRUE(r.ok()) << "worker " << w << " stopped serving: " << r.status();
  }
  RunModelWorkload(*victim, 500, kVictimKeys, Seed(4));
}

// ------------------------------------------------------------------------------------------
// 6. Hostile joins.

// What came back on a hostile control connection: a kError message's text, or a closed
// connection (""). A connection the server leaves hanging is a failure (it would stall the
// control thread).
absl::StatusOr<std::string> Refusal(transport::control::Channel& channel) {
  constexpr absl::Duration kRefusalTimeout = absl::Seconds(15);
  absl::StatusOr<transport::control::Message> m = channel.Receive(kRefusalTimeout);
  if (!m.ok()) {
    if (absl::IsDeadlineExceeded(m.status())) return m.status();
    return std::string();  // closed (or reset): a refusal without words
  }
  if (m->type != kError) {
    return absl::InternalError(absl::StrFormat("message %d instead of a refusal", m->type));
  }
  transport::control::WireReader r(m->payload, "error");
  std::string text;
  r.Bytes(&text, 4096);
  return text.empty() ? std::string("(empty refusal)") : text;
}

transport::control::Channel Dial(const ServerProcess& server) {
  auto channel = transport::control::Channel::Connect(server.address(), absl::Seconds(5));
  EXPECT_TRUE(channel.ok()) << channel.status();
  return channel.ok() ? *std::move(channel) : transport::control::Channel(-1);
}

TEST(Adversarial, MalformedHellosAndFramesAreRefusedAndTheServerServesOn) {
  const std::string fabric = "adv-hello";
  ServerProcess server(Options(fabric, RequestVerb::kUcWrite));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 1);
  ASSERT_NE(victim, nullptr);
  struct Case {
    std::string name;
    uint16_t type;
    std::vector<uint8_t> payload;
    std::string must_say;  // non-empty: the refusal must say this
  };
  std::vector<Case> cases = {
      {"clients=0", kHello, herd::Encode(Hello{0}), "at least 1 client"},
      {"clients=max+1", kHello, herd::Encode(Hello{kMaxClients + 1}), "clients asked for"},
      {"clients=2^32-1", kHello, herd::Encode(Hello{0xffffffffu}), "clients asked for"},
      {"hello of 2 bytes", kHello, {1, 0}, ""},
      {"hello of 9 bytes", kHello, std::vector<uint8_t>(9, 1), ""},
      {"join before hello", kJoin, std::vector<uint8_t>(64, 0), ""},
      {"welcome from a client", kWelcome, std::vector<uint8_t>(16, 0), ""},
      {"unknown type", 999, {}, ""},
  };
  int case_number = 0;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const std::string probe = absl::StrCat("hello-", case_number++);
    transport::control::Channel channel = Dial(server);
    ASSERT_TRUE(channel.Send(k.type, k.payload).ok());
    absl::StatusOr<std::string> refusal = Refusal(channel);
    ASSERT_TRUE(refusal.ok()) << refusal.status();
    std::printf("[ refused  ] %s: %s\n", k.name.c_str(),
                refusal->empty() ? "(closed)" : refusal->c_str());
    if (!k.must_say.empty()) {
      EXPECT_NE(refusal->find(k.must_say), std::string::npos) << *refusal;
    }
    ASSERT_TRUE(victim->Put(probe, "served").ok());  // the server still serves
  }
  // Frames that are not frames: another magic, a length past the limit, a frame cut short.
  auto raw_frame = [](uint32_t magic, uint16_t version, uint16_t type, uint32_t length) {
    return transport::control::WireWriter().U32(magic).U16(version).U16(type).U32(length).Take();
  };
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> frames = {
      {"bad magic", raw_frame(0xdeadbeef, transport::control::kControlVersion, kHello, 4)},
      {"bad version", raw_frame(transport::control::kControlMagic, 77, kHello, 4)},
      {"huge length", raw_frame(transport::control::kControlMagic,
                                transport::control::kControlVersion, kHello, 0xfffffff0u)},
  };
  for (const auto& [name, bytes] : frames) {
    SCOPED_TRACE(name);
    transport::control::Channel channel = Dial(server);
    ASSERT_EQ(write(channel.fd(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    absl::StatusOr<std::string> refusal = Refusal(channel);
    ASSERT_TRUE(refusal.ok()) << refusal.status();
    ASSERT_TRUE(victim->Put(absl::StrCat("frame-", case_number++), "served").ok());
  }
  {
    SCOPED_TRACE("frame cut short, then gone");
    transport::control::Channel channel = Dial(server);
    const std::vector<uint8_t> bytes = raw_frame(transport::control::kControlMagic,
                                                 transport::control::kControlVersion, kHello, 4);
    ASSERT_EQ(write(channel.fd(), bytes.data(), 6), 6);
    shutdown(channel.fd(), SHUT_WR);
    absl::StatusOr<std::string> refusal = Refusal(channel);
    ASSERT_TRUE(refusal.ok()) << refusal.status();
  }
  RunModelWorkload(*victim, 300, kVictimKeys, Seed(5));
}

TEST(Adversarial, MalformedJoinsAreRefusedAndTheServerServesOn) {
  const std::string fabric = "adv-join";
  ServerProcess server(Options(fabric, RequestVerb::kUcWrite));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 2);
  ASSERT_NE(victim, nullptr);
  struct Case {
    std::string name;
    std::function<void(herd::Join&)> tamper;
    std::string must_say;
    bool may_be_admitted;  // a join whose only harm falls on its own session
  };
  const transport::Gid victim_gid = victim->UdEndpointForTest().gid;
  transport::Gid garbage_same_fabric = victim_gid;  // this fabric's id, no such process and fd
  const int32_t no_pid = 0x7ffffff0, no_fd = 4242;
  std::memcpy(garbage_same_fabric.data() + 8, &no_pid, sizeof(no_pid));
  std::memcpy(garbage_same_fabric.data() + 12, &no_fd, sizeof(no_fd));
  transport::Gid other_fabric{};
  for (size_t i = 0; i < other_fabric.size(); ++i) other_fabric[i] = static_cast<uint8_t>(0xa5 + i);
  const std::vector<Case> cases = {
      {"no request QPs", [](herd::Join& j) { j.request_qps.clear(); }, "QP lists", false},
      {"one request QP for two workers", [](herd::Join& j) { j.request_qps.resize(1); },
       "endpoint list", false},
      {"three request QPs for two workers",
       [](herd::Join& j) { j.request_qps.push_back(j.request_qps[0]); }, "endpoint list", false},
      {"response QPs for UD responses", [](herd::Join& j) { j.response_qps = j.request_qps; },
       "QP lists", false},
      {"controlled qkey", [](herd::Join& j) { j.ud_qkey |= kControlledQkeyBit; }, "controlled",
       false},
      {"GID of another fabric", [&](herd::Join& j) { j.ud.gid = other_fabric; }, "", false},
      {"GID of no process", [&](herd::Join& j) { j.ud.gid = garbage_same_fabric; }, "", true},
      {"request QPs at a GID of no process",
       [&](herd::Join& j) {
         for (auto& e : j.request_qps) e.gid = garbage_same_fabric;
       },
       "", true},
      {"UD QP of the victim, own qkey", [&](herd::Join& j) { j.ud = victim->UdEndpointForTest(); },
       "", true},
      // Its answers reach the victim's queue: counted stray there, never delivered.
      {"UD QP and qkey of the victim",
       [&](herd::Join& j) {
         j.ud = victim->UdEndpointForTest();
         j.ud_qkey = victim->UdQkeyForTest();
       },
       "", true},
  };
  int case_number = 0;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const std::string probe = absl::StrCat("join-", case_number++);
    RawClientOptions options;
    options.server = server.address();
    options.fabric = fabric;
    options.clients = 1;
    options.tamper = k.tamper;
    options.timeout = absl::Seconds(15);
    auto raw = RawClient::Connect(options);
    std::printf("[ join     ] %s: %s\n", k.name.c_str(),
                raw.ok() ? "admitted" : raw.status().ToString().c_str());
    if (!raw.ok()) {
      EXPECT_FALSE(absl::IsDeadlineExceeded(raw.status())) << "the server left the join hanging";
      if (!k.must_say.empty()) {
        EXPECT_NE(raw.status().message().find(k.must_say), std::string::npos) << raw.status();
      }
    } else {
      EXPECT_TRUE(k.may_be_admitted) << "admitted";
      // Its own request: answered to wherever it pointed (lost), never to the victim.
      RawClient::Request put;
      put.worker = 0;
      put.seq = 1;
      put.op = Op::kPut;
      put.key = KeyOn(0, kWorkers, "hostile-join");
      put.value = "x";
      (void)(*raw)->Send(put);
    }
    ASSERT_TRUE(victim->Put(probe, "served").ok());
    absl::StatusOr<Value> got = victim->Get(probe);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->value, "served");
  }
  RunModelWorkload(*victim, 300, kVictimKeys, Seed(6));
  auto fresh = JoinVictim(server, fabric, 1);
  ASSERT_NE(fresh, nullptr);
  EXPECT_TRUE(fresh->Put("fresh", "join").ok());
}

// A client that leaves with bytes the server never read on its control connection (it sent
// another message after the welcome) has still left: its ids are free for a later join.
TEST(Adversarial, DepartingWithUnreadControlBytesFreesTheClientIds) {
  const std::string fabric = "adv-unread";
  ServerProcess server(Options(fabric, RequestVerb::kUcWrite));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 2);
  ASSERT_NE(victim, nullptr);
  const uint32_t rest = kMaxClients - victim->clients();
  {
    // One goes mid-handshake, the server's ServerConfig unread on its side.
    transport::control::Channel channel = Dial(server);
    ASSERT_TRUE(channel.Send(kHello, herd::Encode(Hello{rest})).ok());
    ASSERT_TRUE(channel.Receive(absl::Seconds(5)).ok());
    ASSERT_TRUE(channel.Send(kHello, herd::Encode(Hello{rest})).ok());  // not the Join
  }
  {
    // Another joins with every free id, then sends one more message, which the server never
    // reads, and goes.
    auto hog = JoinRaw(server, fabric, rest);
    ASSERT_NE(hog, nullptr);
    ASSERT_TRUE(hog->channel().Send(kHello, herd::Encode(Hello{1})).ok());
  }
  // Bounded retries of a join that needs every id the hog held (the victim's 2 stay taken).
  constexpr int kTries = 100;
  constexpr absl::Duration kBetweenTries = absl::Milliseconds(50);
  std::unique_ptr<RawClient> later;
  absl::Status last;
  for (int i = 0; i < kTries && later == nullptr; ++i) {
    RawClientOptions options;
    options.server = server.address();
    options.fabric = fabric;
    options.clients = rest;
    auto raw = RawClient::Connect(options);
    if (raw.ok()) {
      later = *std::move(raw);
    } else {
      last = raw.status();
      absl::SleepFor(kBetweenTries);
    }
  }
  ASSERT_NE(later, nullptr) << "the departed client's ids were never freed: " << last;
  RawClient::Request get;
  get.seq = 1;
  get.key = KeyOn(0, kWorkers, "later");
  EXPECT_TRUE(later->Call(get, kCallTimeout).ok());
  RunModelWorkload(*victim, 300, kVictimKeys, Seed(7));
}

// Many connections that never say Hello must not hold up a well-behaved join.
TEST(Adversarial, IdleConnectionsDoNotDelayAWellBehavedJoin) {
  const std::string fabric = "adv-idle";
  constexpr int kIdle = 220;
  constexpr absl::Duration kJoinBound = absl::Seconds(5);
  ServerProcess server(Options(fabric, RequestVerb::kUcWrite));
  ASSERT_TRUE(server.ok());
  // Raw non-blocking connects: past the listen backlog a blocking connect would wait on SYN
  // retransmissions; these simply sit there, as a slow or hostile peer's would.
  std::vector<int> idle;
  const uint16_t port = static_cast<uint16_t>(std::stoi(server.address().substr(10)));
  for (int i = 0; i < kIdle; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    ASSERT_TRUE(rc == 0 || errno == EINPROGRESS) << std::strerror(errno);
    idle.push_back(fd);
  }
  const absl::Time start = absl::Now();
  ClientOptions options = VictimOptions(server, fabric, 1);
  options.connect_timeout = kJoinBound;
  auto client = Client::Connect(options);
  const absl::Duration took = absl::Now() - start;
  std::printf("[ join     ] behind %d idle connections: %s (%s)\n", kIdle,
              absl::FormatDuration(took).c_str(), client.status().ToString().c_str());
  for (int fd : idle) close(fd);  // before asserting: the server must not be left with them
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_LT(took, kJoinBound);
  RunModelWorkload(**client, 300, kVictimKeys, Seed(8));
}

// A join naming, as its UD QP, a forged shm device segment: a memfd of the attacker's with the
// fabric's magic and id, whose QP entry points the receive ring outside the segment. A peer's
// segment is client-written bytes (docs/architecture.md, "Trust model"): the worker that answers
// this session must not crash, and the victim is served on.
struct SegmentLayout {
  const char* name;
  uint64_t ring_offset;  // the forged QP's receive ring (and receive CQ)
  uint32_t ring_depth;
};

class ForgedSegment : public ::testing::TestWithParam<SegmentLayout> {};

TEST_P(ForgedSegment, AJoinNamingItDoesNotCrashTheServer) {
  namespace shm = transport::shm;
  constexpr uint32_t kForgedQpIndex = 5;
  const SegmentLayout& layout = GetParam();
  {
    const std::string fabric = absl::StrCat("adv-segment-", layout.name);
    ServerProcess server(Options(fabric, RequestVerb::kUcWrite));
    ASSERT_TRUE(server.ok());
    auto victim = JoinVictim(server, fabric, 1);
    ASSERT_NE(victim, nullptr);
    const int fd = memfd_create("adv-forged-segment", 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, shm::kSegmentBytes), 0);
    void* base = mmap(nullptr, shm::kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(base, MAP_FAILED);
    struct Unmap {
      void* base;
      int fd;
      ~Unmap() {
        munmap(base, transport::shm::kSegmentBytes);
        close(fd);
      }
    } unmap{base, fd};
    auto* header = new (base) shm::SegmentHeader();
    shm::ShmAddress own;
    const transport::Gid fabric_gid = victim->UdEndpointForTest().gid;
    std::memcpy(&own, fabric_gid.data(), sizeof(own));
    header->magic = shm::kSegmentMagic;
    header->fabric_id = own.fabric_id;
    header->pid = getpid();
    header->fd = fd;
    header->mtu = 4096;
    header->alive.store(1);
    const uint32_t qkey = 0x1234567;
    shm::QpEntry& qp = header->qps[kForgedQpIndex];
    qp.qp_num.store(kForgedQpIndex);
    qp.state.store(static_cast<uint8_t>(transport::QpState::kRts));
    qp.type = static_cast<uint8_t>(transport::QpType::kUd);
    qp.qkey = qkey;
    qp.recv_ring_offset = layout.ring_offset;
    qp.recv_cq_offset = layout.ring_offset;
    if (layout.ring_offset < shm::kSegmentBytes) {
      auto* ring =
          reinterpret_cast<shm::RecvRing*>(static_cast<uint8_t*>(base) + layout.ring_offset);
      ring->depth = layout.ring_depth;
      ring->tail.store(1);  // "a receive is posted"
    }
    shm::ShmAddress forged{own.fabric_id, getpid(), fd};
    RawClientOptions options;
    options.server = server.address();
    options.fabric = fabric;
    options.tamper = [&](herd::Join& j) {
      j.ud.qp_num = kForgedQpIndex;
      std::memcpy(j.ud.gid.data(), &forged, sizeof(forged));
      j.ud_qkey = qkey;
    };
    auto attacker = RawClient::Connect(options);
    if (attacker.ok()) {
      // A request of its own: the worker answers it by a UD SEND into the forged segment.
      for (uint32_t w = 0; w < kWorkers; ++w) {
        RawClient::Request get;
        get.worker = w;
        get.seq = 1;
        get.key = KeyOn(w, kWorkers, "segment");
        // Its answer goes to the forged segment, never back: Call only retransmits it for a
        // while (a session's first request can beat its route and be dropped).
        constexpr absl::Duration kRetransmitFor = absl::Milliseconds(300);
        (void)(*attacker)->Call(get, kRetransmitFor);
      }
    }
    // The workers answered (or dropped) that request before they answer these.
    RunModelWorkload(*victim, 300, kVictimKeys, Seed(9));
    auto fresh = JoinVictim(server, fabric, 1);
    ASSERT_NE(fresh, nullptr);
    EXPECT_TRUE(fresh->Put("after", "segment").ok());
  }
}

// Past the header, on the ring alignment the fabric requires (a misaligned offset is refused
// before the depth is even read): so the depth of 0 is what the server must survive.
constexpr uint64_t kAlignedRingOffset =
    (sizeof(transport::shm::SegmentHeader) + 4096 + transport::shm::kRingAlignment - 1) /
    transport::shm::kRingAlignment * transport::shm::kRingAlignment;

INSTANTIATE_TEST_SUITE_P(Layouts, ForgedSegment,
                         ::testing::Values(SegmentLayout{"ring_past_the_segment", uint64_t{1} << 40,
                                                         16},
                                           SegmentLayout{"ring_of_depth_0", kAlignedRingOffset, 0}),
                         [](const ::testing::TestParamInfo<SegmentLayout>& info) {
                           return std::string(info.param.name);
                         });

// ------------------------------------------------------------------------------------------
// 7. Garbage everywhere: random bytes at random offsets and lengths of the attacker's own slots,
// random UD messages to the workers and to the victim's UD QP, all while the victim runs. Then
// the victim, a fresh join, and a clean server exit.

using GarbageParam = std::tuple<RequestVerb, uint32_t>;

class Garbage : public ::testing::TestWithParam<GarbageParam> {};

TEST_P(Garbage, EverywhereChangesNoAnswer) {
  const auto [verb, delay_us] = GetParam();
  const std::string fabric = absl::StrFormat("adv-garbage-%d-%d", static_cast<int>(verb), delay_us);
  constexpr int kRounds = 3000;
  ServerProcess server(Options(fabric, verb, delay_us));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 2, delay_us);
  auto attacker = JoinRaw(server, fabric, 2, delay_us);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  const uint64_t own_block_bytes = c.client_block_bytes() * 2;
  const transport::QpEndpoint victim_ud = victim->UdEndpointForTest();
  std::mt19937_64 rng(Seed(10 + static_cast<uint64_t>(verb) + delay_us));
  VictimRun run(*victim, kVictimOps, Seed(11));
  std::vector<uint8_t> bytes;
  for (int round = 0; round < kRounds; ++round) {
    const uint32_t kind = static_cast<uint32_t>(rng() % 4);
    if (kind == 0 && c.request_uses_slots()) {
      // Anywhere in its own block, any length that fits.
      const uint64_t offset = rng() % own_block_bytes;
      const uint64_t length =
          1 + rng() % std::min<uint64_t>(own_block_bytes - offset, 2 * c.slot_bytes);
      bytes.resize(length);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      const uint32_t w = static_cast<uint32_t>(rng() % c.workers);
      absl::StatusOr<CompletionStatus> s = attacker->Write(
          w, attacker->welcome().region_addr + offset, attacker->welcome().region_rkey, bytes);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_EQ(*s, CompletionStatus::kSuccess) << "a WRITE into its own block";
    } else if (kind == 1 || kind == 0) {
      // A UD message to a worker, within a slot's size, mostly under the workers' qkey.
      bytes.resize(1 + rng() % c.slot_bytes);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      if (rng() % 2 == 0 && bytes.size() >= kRequestHeaderBytes) {
        // A plausible header: the attacker's id, lying lengths.
        RequestHeader h{};
        std::memcpy(&h, bytes.data() + bytes.size() - kRequestHeaderBytes, sizeof(h));
        h.client_id = attacker->first_client_id() + static_cast<uint32_t>(rng() % 2);
        std::memcpy(bytes.data() + bytes.size() - kRequestHeaderBytes, &h, sizeof(h));
      }
      const uint32_t w = static_cast<uint32_t>(rng() % c.workers);
      const uint32_t qkey = rng() % 4 == 0 ? static_cast<uint32_t>(rng()) : kQkey;
      ASSERT_TRUE(attacker->SendUd(attacker->welcome().worker_ud[w], qkey, bytes).ok());
    } else {
      // At the victim's UD QP, under a guessed qkey (its real one is the session's secret; a
      // holder of it is beyond the trust model).
      bytes.resize(1 + rng() % 512);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      uint32_t qkey = static_cast<uint32_t>(rng()) & ~kControlledQkeyBit;
      if (kind == 2) qkey = kQkey;  // the public one
      if (qkey == victim->UdQkeyForTest()) ++qkey;
      ASSERT_TRUE(attacker->SendUd(victim_ud, qkey, bytes).ok());
    }
  }
  run.Join();
  // The workers still answer the attacker's own authentic request, after all of that.
  for (uint32_t w = 0; w < c.workers; ++w) {
    RawClient::Request get;
    get.worker = w;
    get.seq = 1000 * c.window + 1;
    get.key = KeyOn(w, c.workers, "after-garbage");
    absl::StatusOr<RawResponse> r = attacker->Call(get, kCallTimeout);
    ASSERT_TRUE(r.ok()) << "worker " << w << ": " << r.status();
  }
  auto fresh = JoinVictim(server, fabric, 1, delay_us);
  ASSERT_NE(fresh, nullptr);
  ASSERT_TRUE(fresh->Put("fresh", "join").ok());
  absl::StatusOr<Value> got = fresh->Get("fresh");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value, "join");
  // ~ServerProcess: the server must exit cleanly.
}

INSTANTIATE_TEST_SUITE_P(Verbs, Garbage,
                         ::testing::Combine(::testing::Values(RequestVerb::kUcWrite,
                                                              RequestVerb::kUdSend),
                                            ::testing::Values(0u, kAsyncDelayUs)),
                         [](const ::testing::TestParamInfo<GarbageParam>& info) {
                           return absl::StrCat(std::string(Name(std::get<0>(info.param))),
                                               std::get<1>(info.param) > 0 ? "_async" : "_sync");
                         });

}  // namespace
}  // namespace herd::testing
