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

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
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
#include "herd/worker.h"
#include "mica/keyhash.h"
#include "mica/remote_item.h"
#include "tests/herd/client_test_peer.h"
#include "tests/herd/model_workload.h"
#include "tests/herd/raw_client.h"
#include "tests/herd/server_fixture.h"
#include "transport/control/channel.h"
#include "transport/control/wire.h"
#include "transport/shm/segment.h"
#include "transport/shm/shm_internal.h"

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
  VictimRun(Client& client, uint32_t ops, uint64_t seed, bool large_values = false)
      : thread_([&client, ops, seed, large_values] {
          RunModelWorkload(client, ops, kVictimKeys, seed, large_values);
        }) {}
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
    put.secret = herd::ClientTestPeer::SessionSecret(*victim);
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
    // RC: a refused WRITE puts the QP in error, and the fabric (as a NIC) accepts nothing from a
    // QP the server's end is not connected to: each try joins a session of its own, whose QPs
    // are connected, and attacks from there (any session's QP is an attacker's).
    auto fresh = JoinRaw(server, fabric, 1, delay_us);
    EXPECT_NE(fresh, nullptr);
    if (fresh == nullptr) return CompletionStatus::kOtherError;
    absl::StatusOr<CompletionStatus> s = fresh->Write(worker, addr, rkey, bytes);
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
// 2 and 4. Requests that name another client, with the victim's next sequence numbers (the old
// code let the victim's first PUT be answered OK and never applied) and far-ahead ones. A UD SEND
// names its client in the immediate: the attacker names the victim there, signing with its own
// secret. In a slot the slot alone names the client (the bytes carry no id): the attacker's
// request is its own, whatever it meant, and touches only its own dedupe state.

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
    // In a slot the victim cannot be named: once is enough (the same sends again would only be
    // duplicates of the attacker's own).
    const uint32_t victims = slots ? 1 : victim->clients();
    for (uint32_t vc = 0; vc < victims; ++vc) {
      for (uint32_t w = 0; w < c.workers; ++w) {
        for (uint64_t seq = first_seq; seq < first_seq + count; ++seq) {
          RawClient::Request put;
          put.worker = w;
          put.seq = seq;
          put.op = Op::kPut;
          put.value = "FORGED";
          put.secret = secret;
          if (slots) {
            // In its own slots: the attacker's own PUT (of its own key), answered to it.
            put.key = KeyOn(w, c.workers, "attacker-own");
            absl::StatusOr<RawResponse> r = attacker->Call(put, kCallTimeout);
            ASSERT_TRUE(r.ok()) << r.status() << ": seq " << seq << " to worker " << w;
            EXPECT_EQ(static_cast<Status>(r->header.status), Status::kOk);
            EXPECT_EQ(r->header.client_id, attacker->first_client_id());
          } else {
            put.key = KeyOn(w, c.workers, "mine");
            put.client_id = victim->first_client_id() + vc;
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
  std::printf("[ qpns     ] victim's UD QP 0x%x (device %s), attacker's 0x%x\n",
              herd::ClientTestPeer::UdEndpoint(*victim).qp_num,
              herd::ClientTestPeer::UdEndpoint(*victim).gid == attacker->ud_endpoint().gid
                  ? "the same"
                  : "another",
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
      put.secret = herd::ClientTestPeer::SessionSecret(*victim);
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
  const transport::QpEndpoint target = herd::ClientTestPeer::UdEndpoint(*victim);
  const uint32_t real_qkey = herd::ClientTestPeer::UdQkey(*victim);
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
        h.version = 999;
        h.value_bytes = 6;
        h.status = static_cast<uint8_t>(Status::kOk);
        h.worker = static_cast<uint16_t>(w);
        h.attempt = attempt;
        h.seq = next_seq[w];
        EncodeResponseHeader(h, 0, message.data());
        // Naming the victim in the immediate, as the worker's responses do.
        absl::StatusOr<CompletionStatus> s =
            attacker->SendUd(target, qkey, message, victim->first_client_id());
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
  const transport::Gid victim_gid = herd::ClientTestPeer::UdEndpoint(*victim).gid;
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
      {"UD QP of the victim, own qkey",
       [&](herd::Join& j) { j.ud = herd::ClientTestPeer::UdEndpoint(*victim); }, "", true},
      // Its answers reach the victim's queue: counted stray there, never delivered.
      {"UD QP and qkey of the victim",
       [&](herd::Join& j) {
         j.ud = herd::ClientTestPeer::UdEndpoint(*victim);
         j.ud_qkey = herd::ClientTestPeer::UdQkey(*victim);
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
    const transport::Gid fabric_gid = herd::ClientTestPeer::UdEndpoint(*victim).gid;
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
      ring->owner.store(kForgedQpIndex);  // its QP's: the sender goes on to the ring itself
      ring->tail.store(1);                // "a receive is posted"
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
  const transport::QpEndpoint victim_ud = herd::ClientTestPeer::UdEndpoint(*victim);
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
      // Mostly a plausible sender: the attacker's own id in the immediate, lying lengths.
      std::optional<uint32_t> imm;
      if (rng() % 2 == 0) imm = attacker->first_client_id() + static_cast<uint32_t>(rng() % 2);
      if (rng() % 8 == 0) imm = static_cast<uint32_t>(rng());
      const uint32_t w = static_cast<uint32_t>(rng() % c.workers);
      const uint32_t qkey = rng() % 4 == 0 ? static_cast<uint32_t>(rng()) : kQkey;
      ASSERT_TRUE(attacker->SendUd(attacker->welcome().worker_ud[w], qkey, bytes, imm).ok());
    } else {
      // At the victim's UD QP, under a guessed qkey (its real one is the session's secret; a
      // holder of it is beyond the trust model).
      bytes.resize(1 + rng() % 512);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      uint32_t qkey = static_cast<uint32_t>(rng()) & ~kControlledQkeyBit;
      if (kind == 2) qkey = kQkey;  // the public one
      if (qkey == herd::ClientTestPeer::UdQkey(*victim)) ++qkey;
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

// ------------------------------------------------------------------------------------------
// 7.1 Memory pulled from under the server. The file behind a client's receive buffers is the
//     client's to name (its region's entry in its own segment). Had the server mapped one its
//     owner can shrink, the client's ftruncate would make a worker's next answer touch a page
//     past the file's end: a SIGBUS, the server dead. The shm fabric maps only files sealed
//     against shrinking (SharedMemory's, which cannot be truncated at all), so the attacker
//     loses only its own answers.

TEST(Adversarial, AClientThatTruncatesTheFileOfItsReceivesCannotKillTheServer) {
  const std::string fabric = "adv-truncate";
  ServerProcess server(Options(fabric, RequestVerb::kUcWrite));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 2);
  auto attacker = JoinRaw(server, fabric, 1);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  RawClient::Request get;
  get.key = KeyOn(0, attacker->config().workers, "truncate");
  get.seq = 1;
  ASSERT_TRUE(attacker->Call(get, kCallTimeout).ok()) << "no answer into sealed memory";
  const int sealed = attacker->receives().fd();
  EXPECT_NE(ftruncate(sealed, 0), 0) << "registered memory shrank";
  // So the attacker names a file that can shrink, of the same size, in its region's entry; a
  // new registration number makes the worker map the region again.
  const auto bytes = static_cast<off_t>(attacker->receives().size());
  const int unsealed = memfd_create("adv-unsealed", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, bytes), 0);
  transport::shm::MrEntry& entry =
      dynamic_cast<transport::shm::ShmDevice&>(attacker->device())
          .segment()
          .header()
          ->mrs[attacker->receives_mr().lkey() >> transport::shm::kMrIndexShift];
  std::atomic_ref<int32_t>(entry.extents[0].fd).store(unsealed, std::memory_order_relaxed);
  entry.registration.fetch_add(1, std::memory_order_release);
  // The worker's answer to the next GET: delivered into the new file, or refused. A completion
  // at the attacker's receive queue either way.
  get.seq = 2;
  ASSERT_TRUE(attacker->Send(get).ok());
  EXPECT_NE(attacker->Receive(kCallTimeout).status().code(), absl::StatusCode::kDeadlineExceeded)
      << "the worker never answered";
  // Then the file is pulled, and a GET asks for an answer into it.
  ASSERT_EQ(ftruncate(unsealed, 0), 0);
  get.seq = 3;
  ASSERT_TRUE(attacker->Send(get).ok());
  // The victim is served after it (its requests to worker 0 come after that one), and the
  // server shuts down cleanly (ServerProcess::Stop): nothing killed it.
  RunModelWorkload(*victim, 500, kVictimKeys, Seed(71));
  close(unsealed);
}

// ------------------------------------------------------------------------------------------
// 8. The large-value path (Config::large_values(); docs/architecture.md, "Trust model"): a large
// PUT is a WRITE_WITH_IMM into one of the session's landing buffers at a worker, its immediate
// naming a client id and a buffer; a large GET is answered with a descriptor the client READs (of
// its item in the worker's log, or of a copy in a landing buffer it named). Each session's landing
// buffers and its view of the logs are registered in its own PD, the logs for READ only.
//
// Silence is proven by the attacker's own next large PUT to the same worker: every session's
// WRITE_WITH_IMMs at a worker complete on that worker's one imm CQ, which the worker takes in
// order, so that PUT's answer comes after the worker looked at everything sent there before it.
// The server's counters (its stats over the control plane) then say what it made of them: exactly,
// where no retransmission of the tests' own requests can add to them.

constexpr uint32_t kLargeValueBytes = 64 << 10;
constexpr uint32_t kLargeMaxClients = 32;  // the fuzz below joins a new attacker session often
// The raw clients' staging: room for a WRITE far past the end of a session's landing memory,
// however its size was rounded (to 2 MiB with hugepages).
constexpr uint64_t kPastTheEnd = (uint64_t{2} << 20) + 8;
constexpr uint64_t kLargeRawBuffer = uint64_t{4} << 20;
// Far above any sequence number the tests use otherwise: the probes' own.
constexpr uint64_t kProbeSeq = 1'000'000;

ServerOptions LargeOptions(const std::string& fabric) {
  ServerOptions options = Options(fabric, RequestVerb::kUcWrite);
  options.config.max_clients = kLargeMaxClients;
  options.config.max_value_bytes = kLargeValueBytes;
  options.store.max_value_bytes = kLargeValueBytes;
  options.store.log_bytes = uint64_t{8} << 20;
  return options;
}

std::unique_ptr<RawClient> JoinLargeRaw(const ServerProcess& server, const std::string& fabric,
                                        uint32_t clients = 1) {
  RawClientOptions options;
  options.server = server.address();
  options.fabric = fabric;
  options.clients = clients;
  options.buffer_bytes = kLargeRawBuffer;
  auto client = RawClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  EXPECT_TRUE((*client)->config().large_values());
  return *std::move(client);
}

// The server's counters (herd/server_stats.cc), summed over its workers.
struct Counters {
  uint64_t bad = 0, duplicates = 0, rejected = 0, dropped = 0;
  std::vector<uint64_t> out_of_line, copied_values;  // per worker
};

// The number after "name": in the "stats" object of the server's JSON (its herd counters come
// before the fabric's, whose names they share).
uint64_t StatsNumber(const std::string& json, std::string_view name) {
  const std::string field = absl::StrCat("\"", std::string(name), "\":");
  const size_t at = json.find(field, json.find("\"stats\":"));
  EXPECT_NE(at, std::string::npos) << name << " in " << json;
  return at == std::string::npos ? 0 : std::strtoull(json.c_str() + at + field.size(), nullptr, 10);
}

std::vector<uint64_t> StatsNumbers(const std::string& json, std::string_view name) {
  const std::string field = absl::StrCat("\"", std::string(name), "\":[");
  const size_t at = json.find(field, json.find("\"stats\":"));
  EXPECT_NE(at, std::string::npos) << name << " in " << json;
  std::vector<uint64_t> out;
  if (at == std::string::npos) return out;
  const char* p = json.c_str() + at + field.size();
  while (*p != ']' && *p != '\0') {
    char* end = nullptr;
    out.push_back(std::strtoull(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

Counters FetchCounters(const ServerProcess& server) {
  Counters c;
  absl::StatusOr<std::string> json = FetchServerStats(server.address(), absl::Seconds(10));
  EXPECT_TRUE(json.ok()) << json.status();
  if (!json.ok()) return c;
  c.bad = StatsNumber(*json, "bad");
  c.duplicates = StatsNumber(*json, "duplicates");
  c.rejected = StatsNumber(*json, "rejected");
  c.dropped = StatsNumber(*json, "dropped");
  c.out_of_line = StatsNumbers(*json, "out_of_line");
  c.copied_values = StatsNumbers(*json, "copied_values");
  return c;
}

// Per worker, `after` minus `before`.
std::vector<uint64_t> Moved(const std::vector<uint64_t>& after,
                            const std::vector<uint64_t>& before) {
  std::vector<uint64_t> out(after.size());
  for (size_t w = 0; w < after.size(); ++w) out[w] = after[w] - (w < before.size() ? before[w] : 0);
  return out;
}

// The attacker's own authentic large PUT to `worker` (a WRITE_WITH_IMM into its landing buffer 0
// there, retransmitted until answered), answered OK: the worker has looked at every
// WRITE_WITH_IMM that reached it before. `seq`: the attacker's next sequence number there.
void ProbeLarge(RawClient& raw, uint32_t worker, uint64_t* seq) {
  RawClient::Request put;
  put.worker = worker;
  put.seq = (*seq)++;
  put.op = Op::kPut;
  put.key = KeyOn(worker, raw.config().workers, absl::StrCat("probe-", raw.first_client_id()));
  put.value = std::string(raw.config().inline_limit() + 1, 'p');  // out of line
  put.landing = 0;
  absl::StatusOr<RawResponse> r = raw.Call(put, kCallTimeout);
  ASSERT_TRUE(r.ok()) << "worker " << worker << " no longer answers a large PUT: " << r.status();
  EXPECT_EQ(static_cast<Status>(r->header.status), Status::kOk);
}

// A GET of `key` by `raw`'s client 0 in its own slot: the response (status, flags, value).
RawResponse GetBy(RawClient& raw, const std::string& key, uint64_t* seq,
                  int64_t copy_to_landing = -1) {
  RawClient::Request get;
  get.worker = raw.WorkerOf(key);
  get.seq = (*seq)++;
  get.op = Op::kGet;
  get.key = key;
  get.copy_to_landing = copy_to_landing;
  absl::StatusOr<RawResponse> r = raw.Call(get, kCallTimeout);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RawResponse{};
}

// The value a descriptor names, READ by `raw` (a bare copy, or an item checked whole and named).
std::string ReadDescribed(RawClient& raw, const std::string& key, const RawResponse& r) {
  ValueDescriptor d{};
  EXPECT_EQ(r.value.size(), sizeof(d));
  if (r.value.size() != sizeof(d)) return "";
  std::memcpy(&d, r.value.data(), sizeof(d));
  absl::StatusOr<RawClient::ReadResult> read =
      raw.Read(raw.WorkerOf(key), d.addr, d.rkey, d.length);
  EXPECT_TRUE(read.ok()) << read.status();
  if (!read.ok()) return "";
  EXPECT_EQ(read->status, CompletionStatus::kSuccess) << transport::ToString(read->status);
  if ((r.header.flags & kResponseCopied) != 0) return read->bytes;
  absl::StatusOr<mica::VerifiedItem> item =
      mica::VerifyItem(reinterpret_cast<const uint8_t*>(read->bytes.data()), read->bytes.size(),
                       mica::KeyHash(key), r.header.version, key);
  EXPECT_TRUE(item.ok()) << item.status();
  return item.ok() ? std::string(item->value) : "";
}

// A value whose bytes all differ from its neighbours' (a splice would show).
std::string LargeValue(uint32_t bytes, uint64_t seed) {
  std::string v(bytes, '\0');
  std::mt19937_64 rng(seed);
  for (char& ch : v) ch = static_cast<char>(rng());
  return v;
}

// 8.1 An immediate names a client id, but the worker takes it only through the large-value QP of
// that client's own session (ClientRoute::large_qpn). The attacker's WRITE_WITH_IMMs, through its
// own QP into its own landing buffers, name the victim's ids and each of its buffers, and carry a
// PUT of the victim's own key signed with the victim's secret (as if it leaked). Every one must be
// rejected: never executed, and never looked for in the victim's landing buffers, where the
// victim's own large PUTs of the same length lie (found there, they would count as duplicate
// landings or as the victim's bad requests, not as rejections).
TEST(AdversarialLarge, ImmediateNamingAnotherSessionsClientIsRejected) {
  const std::string fabric = "adv-large-foreign-imm";
  ServerProcess server(LargeOptions(fabric));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 2);
  auto attacker = JoinLargeRaw(server, fabric);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  ASSERT_TRUE(victim->config().large_values());
  constexpr uint32_t kValueBytes = 20000;
  ASSERT_GT(kValueBytes, c.inline_limit());
  // Both victim clients PUT a large value to each worker at once: both of the session's landing
  // buffers there hold one of its PUTs.
  std::vector<std::vector<std::string>> keys(c.workers);  // [worker][victim client]
  std::vector<std::vector<std::string>> values(c.workers);
  std::vector<Result> results(4);
  for (uint32_t w = 0; w < c.workers; ++w) {
    for (uint32_t vc = 0; vc < victim->clients(); ++vc) {
      keys[w].push_back(KeyOn(w, c.workers, absl::StrCat("victim-big-", vc)));
      values[w].push_back(LargeValue(kValueBytes, w * 10 + vc));
      ASSERT_TRUE(victim->Submit(vc, Op::kPut, keys[w][vc], values[w][vc], 0, vc).ok());
    }
    size_t got = 0;
    const absl::Time give_up = absl::Now() + kCallTimeout;
    while (got < victim->clients() && absl::Now() < give_up) {
      const size_t n = victim->Poll(absl::MakeSpan(results).subspan(got));
      for (size_t i = got; i < got + n; ++i) ASSERT_EQ(results[i].status, Status::kOk);
      got += n;
    }
    ASSERT_EQ(got, victim->clients());
  }
  const Counters before = FetchCounters(server);
  uint64_t sent = 0;
  constexpr uint64_t kFarAhead = 1000;
  for (uint32_t w = 0; w < c.workers; ++w) {
    for (uint32_t vc = 0; vc < victim->clients(); ++vc) {
      RawClient::Request put;
      put.worker = w;
      put.seq = kFarAhead * c.window + 1;
      put.op = Op::kPut;
      put.key = keys[w][vc];
      put.value = std::string(kValueBytes, 'F');
      put.client_id = victim->first_client_id() + vc;
      put.secret = herd::ClientTestPeer::SessionSecret(*victim);
      const std::vector<uint8_t> bytes = attacker->Encode(put);
      for (uint32_t b = 0; b < c.landing_buffers; ++b) {
        absl::StatusOr<CompletionStatus> s = attacker->WriteWithImm(
            w, attacker->LandingAddress(w, b), attacker->welcome().landing_rkey,
            LandingImmediate(victim->first_client_id() + vc, b), bytes);
        ASSERT_TRUE(s.ok()) << s.status();
        EXPECT_EQ(*s, CompletionStatus::kSuccess) << "a WRITE_WITH_IMM into its own landing buffer";
        ++sent;
      }
    }
  }
  std::vector<uint64_t> seq(c.workers, kProbeSeq);
  for (uint32_t w = 0; w < c.workers; ++w) ProbeLarge(*attacker, w, &seq[w]);
  const Counters after = FetchCounters(server);
  std::printf("[ counters ] rejected +%llu, duplicates +%llu, bad +%llu for %llu forgeries\n",
              static_cast<unsigned long long>(after.rejected - before.rejected),
              static_cast<unsigned long long>(after.duplicates - before.duplicates),
              static_cast<unsigned long long>(after.bad - before.bad),
              static_cast<unsigned long long>(sent));
  EXPECT_EQ(after.rejected - before.rejected, sent)
      << "an immediate naming another session's client was not rejected";
  EXPECT_EQ(after.duplicates - before.duplicates, 0u)
      << "the worker parsed the victim's landing buffers for the attacker's immediates";
  EXPECT_EQ(after.bad - before.bad, 0u);
  EXPECT_EQ(attacker->unexpected_responses(), 0u);
  // The victim's keys hold its own values.
  for (uint32_t w = 0; w < c.workers; ++w) {
    for (uint32_t vc = 0; vc < victim->clients(); ++vc) {
      const absl::StatusOr<Value> got = victim->Get(keys[w][vc]);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->value == values[w][vc]) << "the victim's key " << keys[w][vc] << " changed";
    }
  }
  // Both are served on.
  RunModelWorkload(*victim, 300, kVictimKeys, Seed(20), /*large_values=*/true);
  for (uint32_t w = 0; w < c.workers; ++w) ProbeLarge(*attacker, w, &seq[w]);
}

// 8.2 Immediates of the attacker's own client id naming landing buffers past landing_buffers, and
// immediates naming client ids nobody holds (inside max_clients, and past it): rejected, nothing
// executed, nothing answered. Where buffer `landing_buffers` at worker w would lie (worker w+1's
// buffer 0 of the same session) the attacker planted an authentic PUT of its own, of a key w owns:
// a worker that took the index unchecked would find it there and execute it.
// A WRITE_WITH_IMM takes one of the session's receives at the worker, and the worker gives it
// back to that QP whatever the immediate names (the receive's own wr_id says whose it is): many
// more bad immediates than the QP has receives leave the session's large PUTs working.
TEST(AdversarialLarge, BadImmediatesNeverUseUpTheSendersReceives) {
  const std::string fabric = "adv-large-receives";
  ServerProcess server(LargeOptions(fabric));
  ASSERT_TRUE(server.ok());
  auto attacker = JoinLargeRaw(server, fabric);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  const uint32_t rkey = attacker->welcome().landing_rkey;
  const uint32_t kBad = 3 * LargeReceiveDepth(c);
  const std::vector<uint8_t> zeros(64, 0);
  for (uint32_t i = 0; i < kBad; ++i) {
    // Naming a client id nobody holds.
    absl::StatusOr<CompletionStatus> s = attacker->WriteWithImm(
        0, attacker->LandingAddress(0, 0), rkey, LandingImmediate(kLargeMaxClients - 1, 0), zeros);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(*s, CompletionStatus::kSuccess) << i << ": " << transport::ToString(*s);
  }
  // The session's own large PUT still goes through (its WRITE_WITH_IMM finds a receive).
  RawClient::Request put;
  put.worker = 0;
  put.seq = 1;
  put.op = Op::kPut;
  put.key = KeyOn(0, c.workers, "k");
  put.value = LargeValue(kLargeValueBytes / 2, 3);
  put.landing = 0;
  absl::StatusOr<RawResponse> r = attacker->Call(put, kCallTimeout);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(static_cast<Status>(r->header.status), Status::kOk);
}

TEST(AdversarialLarge, ImmediateNamingNoSuchLandingBufferOrClientIsRejected) {
  const std::string fabric = "adv-large-bad-imm";
  ServerProcess server(LargeOptions(fabric));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 1);
  auto attacker = JoinLargeRaw(server, fabric);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  const uint32_t own = attacker->first_client_id();
  const uint32_t rkey = attacker->welcome().landing_rkey;
  const uint32_t unused = kLargeMaxClients - 1;
  ASSERT_NE(unused, own);
  ASSERT_NE(unused, victim->first_client_id());
  ASSERT_GE(c.landing_buffers, 2u);
  std::vector<uint64_t> seq(c.workers, 1);
  std::vector<std::string> planted(c.workers);
  std::vector<uint64_t> lengths(c.workers);
  for (uint32_t w = 0; w < c.workers; ++w) {
    RawClient::Request put;
    put.worker = w;
    put.seq = seq[w]++;
    put.op = Op::kPut;
    put.key = planted[w] = KeyOn(w, c.workers, "planted");
    put.value = "planted";
    const std::vector<uint8_t> bytes = attacker->Encode(put);
    lengths[w] = bytes.size();
    if (w + 1 < c.workers) {
      // A plain WRITE: no receive, no completion at the server.
      absl::StatusOr<CompletionStatus> s =
          attacker->WriteLarge(w, attacker->LandingAddress(w, c.landing_buffers), rkey, bytes);
      ASSERT_TRUE(s.ok()) << s.status();
      ASSERT_EQ(*s, CompletionStatus::kSuccess);
    }
  }
  const Counters before = FetchCounters(server);
  uint64_t sent = 0;
  for (uint32_t w = 0; w < c.workers; ++w) {
    // The WRITE_WITH_IMMs carry zeros of the planted PUT's length into the worker's last buffer
    // (no planted PUT lies there): only the immediate points at the plant.
    const std::vector<uint8_t> zeros(lengths[w], 0);
    const uint64_t into = attacker->LandingAddress(w, c.landing_buffers - 1);
    for (uint32_t buffer : {c.landing_buffers, c.landing_buffers + 1, 0xffffu}) {
      absl::StatusOr<CompletionStatus> s =
          attacker->WriteWithImm(w, into, rkey, LandingImmediate(own, buffer), zeros);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_EQ(*s, CompletionStatus::kSuccess);
      ++sent;
    }
    for (uint32_t id : {unused, 0xffffu}) {
      absl::StatusOr<CompletionStatus> s =
          attacker->WriteWithImm(w, into, rkey, LandingImmediate(id, 0), zeros);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_EQ(*s, CompletionStatus::kSuccess);
      ++sent;
    }
  }
  for (uint32_t w = 0; w < c.workers; ++w) ProbeLarge(*attacker, w, &seq[w]);
  const Counters after = FetchCounters(server);
  EXPECT_EQ(after.rejected - before.rejected, sent);
  EXPECT_EQ(after.bad - before.bad, 0u);
  EXPECT_EQ(after.duplicates - before.duplicates, 0u);
  EXPECT_EQ(attacker->unexpected_responses(), 0u) << "an answer to a rejected immediate";
  for (uint32_t w = 0; w < c.workers; ++w) {
    const RawResponse r = GetBy(*attacker, planted[w], &seq[w]);
    EXPECT_EQ(static_cast<Status>(r.header.status), Status::kNotFound)
        << "the PUT planted past the last landing buffer executed";
  }
  RunModelWorkload(*victim, 200, kVictimKeys, Seed(21), /*large_values=*/true);
  auto fresh = JoinVictim(server, fabric, 1);
  ASSERT_NE(fresh, nullptr);
  const std::string value = LargeValue(kLargeValueBytes, 21);
  ASSERT_TRUE(fresh->Put("fresh", value).ok());
  absl::StatusOr<Value> got = fresh->Get("fresh");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->value == value);
}

// 8.3 Bytes that are no request, landed whole by WRITE_WITH_IMMs of the attacker's own id into
// its own buffers: random bytes of every length up to a landing buffer's; authentic headers whose
// lengths reach before the message (patched past any size, and an authentic PUT whose first bytes
// were laid just before the buffer, so that only its last bytes are the message: a worker that
// read before the message would find it whole); and a message longer than a landing buffer, inside
// the session's memory, ending in an authentic PUT. All rejected, unanswered, unexecuted. A WRITE
// past the end of the session's landing memory, or from before its start, fails at the fabric
// (remote access error at the attacker) and never reaches the worker.
TEST(AdversarialLarge, GarbageInLandingBuffersIsRejectedAndWritesPastThemFail) {
  const std::string fabric = "adv-large-garbage";
  ServerProcess server(LargeOptions(fabric));
  ASSERT_TRUE(server.ok());
  auto attacker = JoinLargeRaw(server, fabric);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  ASSERT_GE(c.landing_buffers, 2u);
  const uint32_t own = attacker->first_client_id();
  const uint32_t rkey = attacker->welcome().landing_rkey;
  const uint64_t lb = c.landing_bytes();
  std::mt19937_64 rng(Seed(22));
  std::vector<uint64_t> seq(c.workers, 1);
  std::vector<std::string> keys;  // authentic PUTs that must not execute
  const Counters before = FetchCounters(server);
  uint64_t sent = 0;
  auto land = [&](uint32_t w, uint32_t buffer, absl::Span<const uint8_t> bytes) {
    absl::StatusOr<CompletionStatus> s = attacker->WriteWithImm(
        w, attacker->LandingAddress(w, buffer), rkey, LandingImmediate(own, buffer), bytes);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, CompletionStatus::kSuccess) << "inside its own landing memory";
    ++sent;
  };
  for (uint32_t w = 0; w < c.workers; ++w) {
    // Random bytes.
    for (uint64_t length : {uint64_t{1}, uint64_t{kRequestTrailerBytes - 1},
                            uint64_t{kRequestTrailerBytes}, uint64_t{1000}, lb}) {
      std::vector<uint8_t> bytes(length);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      land(w, 0, bytes);
    }
    // An authentic PUT's header with lengths patched past the message (its checksum no longer
    // matches, but the lengths are checked first: nothing before the message may be read).
    RawClient::Request put;
    put.worker = w;
    put.seq = seq[w]++;
    put.op = Op::kPut;
    put.key = KeyOn(w, c.workers, "spanning");
    put.value = LargeValue(2000, w);
    keys.push_back(put.key);
    const std::vector<uint8_t> request = attacker->Encode(put);
    const uint64_t header_at = request.size() - kRequestTrailerBytes;
    for (int patch = 0; patch < 3; ++patch) {
      std::vector<uint8_t> bytes = request;
      RequestTrailer h;
      std::memcpy(&h, bytes.data() + header_at, sizeof(h));
      if (patch == 0) h.value_bytes = 0xffffffffu;
      if (patch == 1) h.value_bytes = static_cast<uint32_t>(lb);
      if (patch == 2) h.key_bytes = 0xffff;
      std::memcpy(bytes.data() + header_at, &h, sizeof(h));
      land(w, 0, bytes);
    }
    // The same PUT, whole and authentic, but its message is only its last kTail bytes, in buffer
    // 1; the rest lies at the end of buffer 0 (a plain WRITE: no completion at the server).
    constexpr uint64_t kTail = 512;
    ASSERT_GT(request.size(), kTail);
    const uint64_t head = request.size() - kTail;
    absl::StatusOr<CompletionStatus> s = attacker->WriteLarge(
        w, attacker->LandingAddress(w, 1) - head, rkey, absl::MakeConstSpan(request.data(), head));
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(*s, CompletionStatus::kSuccess);
    land(w, 1, absl::MakeConstSpan(request.data() + head, kTail));
    // Looked at before the next message overwrites the end of buffer 0.
    ProbeLarge(*attacker, w, &seq[w]);
    // A message 8 bytes longer than a landing buffer (into the next one of the session's, so the
    // fabric lets it through) that ends in an authentic PUT.
    RawClient::Request overlong = put;
    overlong.seq = seq[w]++;
    overlong.key = KeyOn(w, c.workers, "overlong");
    overlong.value = "x";
    keys.push_back(overlong.key);
    const std::vector<uint8_t> tail = attacker->Encode(overlong);
    std::vector<uint8_t> bytes(lb + 8, 0);
    std::memcpy(bytes.data() + bytes.size() - tail.size(), tail.data(), tail.size());
    land(w, 0, bytes);
    ProbeLarge(*attacker, w, &seq[w]);
  }
  // Past the end of a session's landing memory (from its last buffer, 2 MiB on: whatever its
  // size was rounded to) and from just before its start: refused by the fabric. Each from a
  // session of its own (an RC error moves its QP to the error state), at its own landing memory.
  const uint32_t last = c.workers - 1;
  struct Outside {
    const char* name;
    uint64_t buffer;  // from the start of this landing buffer, or (0) before the memory's start
    uint64_t length;
  };
  for (const Outside& o : {Outside{"past the end", c.landing_buffers - 1, lb + kPastTheEnd},
                           Outside{"before the start", 0, 64}}) {
    SCOPED_TRACE(o.name);
    auto fresh = JoinLargeRaw(server, fabric);
    ASSERT_NE(fresh, nullptr);
    const uint64_t addr =
        o.buffer == 0 ? fresh->welcome().landing_addr - 8 : fresh->LandingAddress(last, o.buffer);
    const std::vector<uint8_t> bytes(o.length, 0xee);
    absl::StatusOr<CompletionStatus> s = fresh->WriteWithImm(
        last, addr, fresh->welcome().landing_rkey,
        LandingImmediate(fresh->first_client_id(), c.landing_buffers - 1), bytes);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, CompletionStatus::kRemoteAccessError) << transport::ToString(*s);
  }
  for (uint32_t w = 0; w < c.workers; ++w) ProbeLarge(*attacker, w, &seq[w]);
  const Counters after = FetchCounters(server);
  EXPECT_EQ(after.rejected - before.rejected, sent)
      << "each landed message rejected once, and nothing from the refused WRITEs";
  EXPECT_EQ(after.bad - before.bad, 0u);
  EXPECT_EQ(attacker->unexpected_responses(), 0u) << "garbage was answered";
  for (const std::string& key : keys) {
    const RawResponse r = GetBy(*attacker, key, &seq[attacker->WorkerOf(key)]);
    EXPECT_EQ(static_cast<Status>(r.header.status), Status::kNotFound)
        << key << ": a PUT read from outside its message executed";
  }
  // A fresh client is served, large values included.
  auto fresh = JoinVictim(server, fabric, 1);
  ASSERT_NE(fresh, nullptr);
  RunModelWorkload(*fresh, 200, kVictimKeys, Seed(23), /*large_values=*/true);
}

// 8.4 Protection domains and access rights. Another session's landing buffers are out of reach
// of the attacker's large-value QP whatever the rkey (its own, the victim's real one, guesses
// around both): WRITE_WITH_IMM, WRITE and READ all fail with a remote access error, and the
// victim's buffer is unchanged. The logs are READable through the attacker's own session (an
// out-of-line GET's descriptor: the item checks out) but not writable, and not through another
// session's registration of them.
TEST(AdversarialLarge, LandingBuffersAndLogsAreReachableOnlyAsRegistered) {
  const std::string fabric = "adv-large-pd";
  ServerProcess server(LargeOptions(fabric));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 1);
  auto raw_victim = JoinLargeRaw(server, fabric);  // a victim whose addresses the test knows
  auto attacker = JoinLargeRaw(server, fabric);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(raw_victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  const uint32_t own_rkey = attacker->welcome().landing_rkey;
  const uint32_t victim_rkey = raw_victim->welcome().landing_rkey;
  std::printf("[ keys     ] attacker landing rkey 0x%x, victim's 0x%x\n", own_rkey, victim_rkey);
  std::vector<uint64_t> seq(c.workers, 1), victim_seq(c.workers, 1);
  std::vector<uint32_t> rkeys = {own_rkey, victim_rkey};
  for (uint32_t k : {own_rkey, victim_rkey}) {
    for (uint32_t guess : {k + 1, k - 1, k + (1u << transport::shm::kMrIndexShift),
                           k - (1u << transport::shm::kMrIndexShift)}) {
      rkeys.push_back(guess);
    }
  }
  enum class Verb { kWriteWithImm, kWrite, kRead };
  // One try from a session of its own (an RC error moves its QP to the error state, and the
  // fabric accepts nothing from a QP the server's end is not connected to), through its own
  // large-value QP at `w`.
  auto attempt = [&](uint32_t w, Verb verb, uint64_t addr, uint32_t rkey,
                     uint64_t length) -> CompletionStatus {
    auto fresh = JoinLargeRaw(server, fabric);
    EXPECT_NE(fresh, nullptr);
    if (fresh == nullptr) return CompletionStatus::kOtherError;
    const std::vector<uint8_t> payload(length, 'A');
    absl::StatusOr<CompletionStatus> s;
    if (verb == Verb::kRead) {
      absl::StatusOr<RawClient::ReadResult> r =
          fresh->Read(w, addr, rkey, static_cast<uint32_t>(length));
      s = r.ok() ? absl::StatusOr<CompletionStatus>(r->status) : r.status();
    } else if (verb == Verb::kWrite) {
      s = fresh->WriteLarge(w, addr, rkey, payload);
    } else {
      s = fresh->WriteWithImm(w, addr, rkey, LandingImmediate(fresh->first_client_id(), 0),
                              payload);
    }
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : CompletionStatus::kOtherError;
  };
  const char* const kVerbNames[] = {"WRITE_WITH_IMM", "WRITE", "READ"};
  constexpr uint32_t kBytes = 4096;
  for (uint32_t w = 0; w < c.workers; ++w) {
    // The victim's large PUT lies in its landing buffer 0 here.
    RawClient::Request put;
    put.worker = w;
    put.seq = victim_seq[w]++;
    put.op = Op::kPut;
    put.key = KeyOn(w, c.workers, "victim-landing");
    put.value = LargeValue(kBytes, w);
    put.landing = 0;
    absl::StatusOr<RawResponse> r = raw_victim->Call(put, kCallTimeout);
    ASSERT_TRUE(r.ok()) << r.status();
    const uint64_t target = raw_victim->LandingAddress(w, 0);
    absl::StatusOr<RawClient::ReadResult> before = raw_victim->Read(w, target, victim_rkey, kBytes);
    ASSERT_TRUE(before.ok()) << before.status();
    ASSERT_EQ(before->status, CompletionStatus::kSuccess) << "a session READs its own buffer";
    for (uint32_t rkey : rkeys) {
      for (Verb verb : {Verb::kWriteWithImm, Verb::kWrite, Verb::kRead}) {
        const CompletionStatus s = attempt(w, verb, target, rkey, kBytes);
        EXPECT_EQ(s, CompletionStatus::kRemoteAccessError)
            << kVerbNames[static_cast<int>(verb)] << " of another session's landing buffer, rkey 0x"
            << std::hex << rkey << ": " << transport::ToString(s);
      }
    }
    absl::StatusOr<RawClient::ReadResult> after = raw_victim->Read(w, target, victim_rkey, kBytes);
    ASSERT_TRUE(after.ok()) << after.status();
    ASSERT_EQ(after->status, CompletionStatus::kSuccess);
    EXPECT_TRUE(after->bytes == before->bytes) << "the victim's landing buffer changed";
  }
  // The logs.
  for (uint32_t w = 0; w < c.workers; ++w) {
    RawClient::Request put;
    put.worker = w;
    put.seq = seq[w]++;
    put.op = Op::kPut;
    put.key = KeyOn(w, c.workers, "readable");
    put.value = LargeValue(30000, 100 + w);
    put.landing = 0;
    absl::StatusOr<RawResponse> stored = attacker->Call(put, kCallTimeout);
    ASSERT_TRUE(stored.ok()) << stored.status();
    ASSERT_EQ(static_cast<Status>(stored->header.status), Status::kOk);
    const RawResponse got = GetBy(*attacker, put.key, &seq[w]);
    ASSERT_EQ(static_cast<Status>(got.header.status), Status::kOk);
    ASSERT_EQ(got.header.flags, kResponseOutOfLine);
    EXPECT_TRUE(ReadDescribed(*attacker, put.key, got) == put.value)
        << "the log is readable through the session's own registration";
    ValueDescriptor d;
    std::memcpy(&d, got.value.data(), sizeof(d));
    for (Verb verb : {Verb::kWrite, Verb::kWriteWithImm}) {
      const CompletionStatus s = attempt(w, verb, d.addr, d.rkey, d.length);
      EXPECT_EQ(s, CompletionStatus::kRemoteAccessError)
          << kVerbNames[static_cast<int>(verb)] << " into the log: " << transport::ToString(s);
    }
    // The raw victim's GET names the same item under its own session's rkey.
    const RawResponse theirs = GetBy(*raw_victim, put.key, &victim_seq[w]);
    ASSERT_EQ(static_cast<Status>(theirs.header.status), Status::kOk);
    ASSERT_EQ(theirs.value.size(), sizeof(ValueDescriptor));
    ValueDescriptor dv;
    std::memcpy(&dv, theirs.value.data(), sizeof(dv));
    EXPECT_NE(dv.rkey, d.rkey);
    EXPECT_EQ(attempt(w, Verb::kRead, dv.addr, dv.rkey, dv.length),
              CompletionStatus::kRemoteAccessError)
        << "a READ through another session's registration of the log";
    // The item is as it was.
    EXPECT_TRUE(ReadDescribed(*attacker, put.key, GetBy(*attacker, put.key, &seq[w])) == put.value);
  }
  RunModelWorkload(*victim, 200, kVictimKeys, Seed(24), /*large_values=*/true);
  for (uint32_t w = 0; w < c.workers; ++w) ProbeLarge(*attacker, w, &seq[w]);
}

// 8.5 A GET asking for a copy into a landing buffer the session does not have (past
// landing_buffers, past 16 bits, 2^32 - 1), in a slot or landed by WRITE_WITH_IMM, is answered
// BAD_REQUEST and copies nothing (the server counts no copy); the worker's next answers are right:
// a copy into the session's last buffer, and an item in the log.
TEST(AdversarialLarge, CopyToLandingNamingNoSuchBufferIsABadRequest) {
  const std::string fabric = "adv-large-copy";
  ServerProcess server(LargeOptions(fabric));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 1);
  auto attacker = JoinLargeRaw(server, fabric);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config& c = attacker->config();
  const uint32_t buffers = c.landing_buffers;
  std::vector<uint64_t> seq(c.workers, 1);
  std::vector<std::string> keys, values;
  for (uint32_t w = 0; w < c.workers; ++w) {
    RawClient::Request put;
    put.worker = w;
    put.seq = seq[w]++;
    put.op = Op::kPut;
    put.key = KeyOn(w, c.workers, "copied");
    put.value = LargeValue(30000, 200 + w);
    put.landing = 0;
    absl::StatusOr<RawResponse> r = attacker->Call(put, kCallTimeout);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(static_cast<Status>(r->header.status), Status::kOk);
    keys.push_back(put.key);
    values.push_back(put.value);
  }
  const Counters before = FetchCounters(server);
  uint64_t bad = 0;
  for (uint32_t w = 0; w < c.workers; ++w) {
    for (uint64_t buffer : {uint64_t{buffers}, uint64_t{buffers} + 1, uint64_t{0xffff},
                            uint64_t{0x10000}, uint64_t{0xffffffff}}) {
      for (const bool landed : {false, true}) {
        SCOPED_TRACE(absl::StrFormat("worker %d, buffer %d, %s", w, buffer,
                                     landed ? "landed" : "in a slot"));
        RawClient::Request get;
        get.worker = w;
        get.seq = seq[w]++;
        get.op = Op::kGet;
        get.key = keys[w];
        get.copy_to_landing = static_cast<int64_t>(buffer);
        if (landed) get.landing = 0;
        absl::StatusOr<RawResponse> r = attacker->Call(get, kCallTimeout);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(static_cast<Status>(r->header.status), Status::kBadRequest);
        EXPECT_EQ(r->header.flags, 0) << "answered with a descriptor";
        EXPECT_TRUE(r->value.empty());
        ++bad;
      }
    }
  }
  const Counters middle = FetchCounters(server);
  EXPECT_GE(middle.bad - before.bad, bad);  // more if a retransmission (100 ms) was answered too
  for (uint32_t w = 0; w < c.workers; ++w) {
    EXPECT_EQ(Moved(middle.copied_values, before.copied_values)[w], 0u) << "worker " << w;
    EXPECT_EQ(Moved(middle.out_of_line, before.out_of_line)[w], 0u) << "worker " << w;
  }
  for (uint32_t w = 0; w < c.workers; ++w) {
    const RawResponse copy = GetBy(*attacker, keys[w], &seq[w], buffers - 1);
    ASSERT_EQ(static_cast<Status>(copy.header.status), Status::kOk);
    EXPECT_EQ(copy.header.flags, kResponseOutOfLine | kResponseCopied);
    ASSERT_EQ(copy.value.size(), sizeof(ValueDescriptor));
    ValueDescriptor d;
    std::memcpy(&d, copy.value.data(), sizeof(d));
    EXPECT_EQ(d.addr, attacker->LandingAddress(w, buffers - 1));
    EXPECT_EQ(d.rkey, attacker->welcome().landing_rkey);
    EXPECT_EQ(d.length, values[w].size());
    EXPECT_TRUE(ReadDescribed(*attacker, keys[w], copy) == values[w]);
    const RawResponse item = GetBy(*attacker, keys[w], &seq[w]);
    ASSERT_EQ(static_cast<Status>(item.header.status), Status::kOk);
    EXPECT_EQ(item.header.flags, kResponseOutOfLine);
    EXPECT_TRUE(ReadDescribed(*attacker, keys[w], item) == values[w]);
  }
  const Counters after = FetchCounters(server);
  for (uint32_t w = 0; w < c.workers; ++w) {
    EXPECT_GE(Moved(after.copied_values, middle.copied_values)[w], 1u) << "worker " << w;
    EXPECT_GE(Moved(after.out_of_line, middle.out_of_line)[w], 1u) << "worker " << w;
  }
  RunModelWorkload(*victim, 200, kVictimKeys, Seed(25), /*large_values=*/true);
}

// 8.6 Fuzz: WRITE_WITH_IMMs with random immediates (the attacker's own ids, the victim's, ids
// nobody holds, any 16 bits; buffers in range and not), random lengths up to a landing buffer,
// random bytes, half of them ending in an authentic request of the attacker's own session with
// random fields (some then damaged), while the victim runs a model-checked large-value workload.
// The victim sees only right answers and no stall, and the server serves on. (Every receive goes
// back to the QP it was taken from whatever the immediate says: one attacker session throughout.)
TEST(AdversarialLarge, FuzzedLargePutsLeaveAnHonestLargeValueWorkloadIntact) {
  const std::string fabric = "adv-large-fuzz";
  constexpr int kRounds = 2000;
  constexpr uint32_t kLargeVictimOps = 600;
  ServerProcess server(LargeOptions(fabric));
  ASSERT_TRUE(server.ok());
  auto victim = JoinVictim(server, fabric, 2);
  auto attacker = JoinLargeRaw(server, fabric, 2);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(attacker, nullptr);
  const Config c = attacker->config();
  const uint64_t lb = c.landing_bytes();
  std::mt19937_64 rng(Seed(26));
  auto log_uniform = [&](uint64_t max) -> uint64_t {
    const int top = 64 - __builtin_clzll(max + 1);
    const uint64_t upper = uint64_t{1} << (rng() % top);
    return std::min<uint64_t>(upper / 2 + rng() % (upper / 2 + 1), max);
  };
  uint64_t sessions = 1, authentic = 0, foreign = 0;
  const Counters before = FetchCounters(server);
  VictimRun run(*victim, kLargeVictimOps, Seed(27), /*large_values=*/true);
  for (int round = 0; round < kRounds; ++round) {
    const uint32_t w = static_cast<uint32_t>(rng() % c.workers);
    const uint32_t own = attacker->first_client_id();
    uint32_t id = 0;
    switch (rng() % 4) {
      case 0:
      case 1:
        id = own + static_cast<uint32_t>(rng() % 2);
        break;
      case 2:
        id = victim->first_client_id() + static_cast<uint32_t>(rng() % victim->clients());
        break;
      default:
        id = static_cast<uint32_t>(rng() & 0xffff);
        break;
    }
    const uint32_t buffer = rng() % 4 == 0 ? static_cast<uint32_t>(rng() & 0xffff)
                                           : static_cast<uint32_t>(rng() % c.landing_buffers);
    const bool ours = id == own || id == own + 1;
    const uint64_t length = 1 + (rng() % 2 == 0 ? rng() % lb : log_uniform(lb - 1));
    std::vector<uint8_t> bytes(length);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    if (rng() % 2 == 0) {
      // An authentic request of the attacker's session, fields drawn at random, at the end.
      RawClient::Request r;
      r.client = static_cast<uint32_t>(rng() % 2);
      r.seq = rng() % 8 == 0 ? rng() : 1 + rng() % (8 * c.window);
      r.attempt = static_cast<uint32_t>(rng() % 3);
      r.op = static_cast<Op>(rng() % (kOpCount + 2));
      r.key = std::string(1 + rng() % (c.max_key_bytes + 2), '\0');
      r.key[0] = '\xff';  // never one of the victim's keys
      for (size_t i = 1; i < r.key.size(); ++i) r.key[i] = static_cast<char>('a' + rng() % 4);
      const uint64_t room = lb - RequestBytes(r.op, static_cast<uint32_t>(r.key.size()), 0);
      if (rng() % 2 == 0) r.value = std::string(log_uniform(std::min<uint64_t>(room, lb)), 'v');
      if (rng() % 8 == 0) r.expected_version = rng() % 4;
      if (rng() % 8 == 0) r.client_id = static_cast<int64_t>(rng() % kLargeMaxClients);
      if (rng() % 8 == 0) r.copy_to_landing = static_cast<int64_t>(rng() % (c.landing_buffers + 2));
      const std::vector<uint8_t> request = attacker->Encode(r);
      if (request.size() > bytes.size()) bytes.resize(request.size());
      std::memcpy(bytes.data() + bytes.size() - request.size(), request.data(), request.size());
      if (rng() % 4 == 0) bytes[rng() % bytes.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      ++authentic;
    }
    ASSERT_LE(bytes.size(), lb);
    // Where the worker looks, if the immediate is the attacker's own; anywhere in its own landing
    // memory otherwise.
    const uint64_t addr = ours && buffer < c.landing_buffers
                              ? attacker->LandingAddress(w, buffer)
                              : attacker->LandingAddress(static_cast<uint32_t>(rng() % c.workers),
                                                         rng() % c.landing_buffers);
    absl::StatusOr<CompletionStatus> s = attacker->WriteWithImm(
        w, addr, attacker->welcome().landing_rkey, LandingImmediate(id, buffer), bytes);
    ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.status();
    ASSERT_EQ(*s, CompletionStatus::kSuccess)
        << "round " << round << ": " << transport::ToString(*s);
    // Answers to its authentic requests, if any: taken, so its receives stay posted.
    while (attacker->Receive(absl::ZeroDuration()).ok()) {
    }
    if (!ours) ++foreign;
  }
  run.Join();
  // The probe comes from a new session: the attacker's own authentic requests claimed sequence
  // numbers far ahead in its slots, so its probe would be stale there. A new session's large PUT
  // completes on the same imm CQ after everything the attacker sent (BadImmediatesNever... shows
  // the attacker's own QP keeps its receives).
  attacker.reset();
  attacker = JoinLargeRaw(server, fabric, 2);
  ASSERT_NE(attacker, nullptr);
  std::vector<uint64_t> seq(c.workers, kProbeSeq);
  for (uint32_t w = 0; w < c.workers; ++w) ProbeLarge(*attacker, w, &seq[w]);
  const Counters after = FetchCounters(server);
  std::printf(
      "[ fuzz     ] %d WRITE_WITH_IMMs (%llu authentic-looking, %llu naming no client of the "
      "attacker's), %llu attacker sessions; server: rejected +%llu, bad +%llu, dropped +%llu\n",
      kRounds, static_cast<unsigned long long>(authentic), static_cast<unsigned long long>(foreign),
      static_cast<unsigned long long>(sessions),
      static_cast<unsigned long long>(after.rejected - before.rejected),
      static_cast<unsigned long long>(after.bad - before.bad),
      static_cast<unsigned long long>(after.dropped - before.dropped));
  EXPECT_GE(after.rejected - before.rejected, foreign);
  // A fresh client is served (the victim's model is done: its keys hold its last values).
  auto fresh = JoinVictim(server, fabric, 1);
  ASSERT_NE(fresh, nullptr);
  const std::string value = LargeValue(kLargeValueBytes, 28);
  ASSERT_TRUE(fresh->Put("fresh", value).ok());
  absl::StatusOr<Value> got = fresh->Get("fresh");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->value == value);
  // ~ServerProcess: the server must exit cleanly.
}

}  // namespace
}  // namespace herd::testing
