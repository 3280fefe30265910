// hop_server and the one-sided client on a real verbs device (Soft-RoCE in CI, through
// scripts/rxe_vm.sh; skipped, saying so, where no verbs device exists): a sharded trace looked up
// by two threads against two servers with every value checked, joined over TCP and over RDMA-CM.
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/hop_replay.h"
#include "bench/ycsb_trace_gen.h"
#include "gtest/gtest.h"
#include "hopscotch/build.h"
#include "hopscotch/client.h"
#include "hopscotch/hash.h"
#include "hopscotch/server.h"
#include "hopscotch/table.h"
#include "hopscotch/wire.h"
#include "tests/transport/fabric_fixture.h"
#include "transport/cm.h"
#include "transport/fabric.h"

namespace hopscotch {
namespace {

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

class HopOverVerbs : public ::testing::TestWithParam<transport::ConnectMode> {
 protected:
  void SetUp() override {
    device_ = transport::testing::DeviceFor("verbs");  // $HERD_VERBS_DEVICE, else the first
    if (device_.empty()) {
      GTEST_SKIP() << "no verbs device on this machine (scripts/rxe_vm.sh runs this on rxe0)";
    }
    transport::DeviceOptions device;
    device.name = device_;
    auto probe = transport::OpenDevice(device);
    ASSERT_TRUE(probe.ok()) << probe.status();
    address_ = GetParam() == transport::ConnectMode::kCm
                   ? transport::Ipv4OfGid((*probe)->port().gid)
                   : std::string("127.0.0.1");
    if (address_.empty()) GTEST_SKIP() << "the device's GID carries no IPv4 address (RDMA-CM)";
  }
  void TearDown() override {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
  }
  // Starts a server on `table`, stepping on a thread of its own; its address.
  std::string Serve(const std::string& table) {
    ServerOptions options;
    options.table = table;
    options.device.name = device_;
    options.connect = GetParam();
    options.listen_address = address_;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "";
    servers_.push_back(*std::move(server));
    Server* s = servers_.back().get();
    threads_.emplace_back([this, s] { s->Run(stop_); });
    return absl::StrFormat("%s:%u", address_, s->port());
  }
  std::string device_, address_;
  std::atomic<bool> stop_{false};
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::thread> threads_;
};

TEST_P(HopOverVerbs, ShardedLookupsAreCheckedAndUpsertsAreSeen) {
  const std::string trace = TmpPath("verbs_hop.txt");
  bench::TraceCounts counts;
  {
    std::ofstream out(trace);
    bench::TraceOptions options;
    options.records = 5000;  // the guest's rxe moves tens of thousands of READs a second
    options.operations = 5000;
    options.zipfian = true;
    ASSERT_TRUE(bench::WriteTrace(options, out, &counts).ok());
  }
  std::vector<std::string> addresses;
  for (uint32_t shard = 0; shard < 2; ++shard) {
    BuildOptions build;
    build.traces = {trace};
    build.out = TmpPath(absl::StrFormat("verbs_hop%u.hop", shard));
    build.shard = shard;
    build.shards = 2;
    ASSERT_TRUE(BuildTable(build).ok());
    addresses.push_back(Serve(build.out));
    ASSERT_FALSE(addresses.back().empty());
  }
  bench::ReplayOptions replay;
  replay.client.servers = addresses;
  replay.client.device.name = device_;
  replay.client.connect = GetParam();
  replay.client.window = 8;
  replay.traces = {trace};
  replay.threads = 2;
  absl::StatusOr<bench::ReplayResult> r = bench::ReplayLookups(replay);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->passed()) << r->ToJson();
  EXPECT_EQ(r->lookups, counts.reads);
  EXPECT_EQ(r->reads, r->lookups);  // nothing writes, every key present: one READ each
  // Only the READs' bytes: over TCP the join travels on sockets, over RDMA-CM in the CM's
  // private data (no control QP is opened by a client that only looks up).
  EXPECT_EQ(r->fabric.bytes, r->reads * kNeighbourhoodBytes);

  // Upserts through the control connection, seen by the next READ.
  ClientOptions options = replay.client;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<HopUpsert> pairs;
  for (int i = 0; i < 20; ++i) {
    const std::string key = absl::StrFormat("verbs%d", i);
    pairs.push_back(HopUpsert{key, ExpectedValue(key)});
  }
  absl::StatusOr<std::vector<absl::Status>> statuses = (*client)->Upsert(pairs);
  ASSERT_TRUE(statuses.ok()) << statuses.status();
  for (size_t i = 0; i < pairs.size(); ++i) {
    ASSERT_TRUE((*statuses)[i].ok()) << (*statuses)[i];
    absl::StatusOr<LookupResult> found = (*client)->Lookup(pairs[i].key);
    ASSERT_TRUE(found.ok()) << found.status();
    ASSERT_EQ(found->kind, LookupResult::Kind::kFound) << pairs[i].key;
    EXPECT_EQ(found->value, pairs[i].value);
  }
}

// Over RDMA-CM a lookup QP is the client's only connection, joined by the CM's private data; the
// control connection appears with the first upsert or stats request, and both go when the
// client does. A CM request whose private data is not a hop hello, or one past max_clients, is
// rejected. The server serves its table read-only.
TEST_P(HopOverVerbs, CmJoinsUsePrivateDataAndHostileRequestsAreRejected) {
  if (GetParam() != transport::ConnectMode::kCm) GTEST_SKIP() << "RDMA-CM only";
  const std::string table = TmpPath("verbs_cm_join.hop");
  {
    absl::StatusOr<Table> t = Table::Create(table, 1024);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(t->Insert("present", ExpectedValue("present")).ok());
  }
  ServerOptions server_options;
  server_options.table = table;
  server_options.device.name = device_;
  server_options.connect = transport::ConnectMode::kCm;
  server_options.listen_address = address_;
  server_options.max_clients = 2;
  // Read-only: the file is then mapped PROT_READ, which the kernel must still let the device
  // register for remote READ (a read-only SHARED mapping it refuses: table.cc).
  server_options.read_only = true;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Create(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrFormat("%s:%u", address_, (*server)->port());
  // The server steps on this thread while a helper thread connects.
  auto step_until = [&](auto&& done, absl::Duration limit) {
    const absl::Time deadline = absl::Now() + limit;
    while (!done() && absl::Now() < deadline) (*server)->Step(absl::Milliseconds(10));
    return done();
  };
  auto connect_async = [&](auto&& body) {
    std::atomic<bool> finished{false};
    std::thread t([&] {
      body();
      finished = true;
    });
    step_until([&] { return finished.load(); }, absl::Seconds(30));
    t.join();
  };

  ClientOptions options;
  options.servers = {address};
  options.device.name = device_;
  options.connect = transport::ConnectMode::kCm;
  absl::StatusOr<std::unique_ptr<Client>> client = absl::UnknownError("not run");
  connect_async([&] { client = Client::Connect(options); });
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*server)->clients(), 1u);
  EXPECT_EQ((*server)->counters().joins, 1u);
  absl::StatusOr<LookupResult> found = (*client)->Lookup("present");  // no server CPU needed
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->kind, LookupResult::Kind::kFound);
  EXPECT_EQ((*client)->counters().bytes, kNeighbourhoodBytes);

  // Raw CM requests: a hello of another version, and bytes that are no hello.
  transport::DeviceOptions device_options;
  device_options.name = device_;
  auto device = transport::OpenDevice(device_options);
  ASSERT_TRUE(device.ok()) << device.status();
  auto pd = (*device)->AllocatePd();
  ASSERT_TRUE(pd.ok());
  auto cq = (*device)->CreateCq(4);
  ASSERT_TRUE(cq.ok());
  const std::vector<std::vector<uint8_t>> hostile = {{9, 9, 9, 9}, {1, 2, 3, 4, 5, 6, 7}, {2}};
  for (const std::vector<uint8_t>& hello : hostile) {
    transport::QpConfig config;
    config.type = transport::QpType::kRc;
    config.send_cq = cq->get();
    config.recv_cq = cq->get();
    auto qp = (*pd)->CreateQp(config);
    ASSERT_TRUE(qp.ok());
    const uint64_t refused = (*server)->counters().refused;
    absl::StatusOr<std::unique_ptr<transport::CmConnection>> raw = absl::UnknownError("not run");
    connect_async([&] {
      raw = transport::CmConnect(**device, **qp, address_, (*server)->port(), absl::Seconds(10),
                                 hello, nullptr);
    });
    EXPECT_FALSE(raw.ok()) << "hello of " << hello.size() << " bytes accepted";
    EXPECT_EQ((*server)->counters().refused, refused + 1);
  }
  EXPECT_EQ((*server)->clients(), 1u);

  // Stats open the control connection (a second joined connection, asking for no QP).
  absl::StatusOr<std::string> stats = absl::UnknownError("not run");
  connect_async([&] { stats = (*client)->ServerStats(0); });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NE(stats->find("\"clients\":2"), std::string::npos) << *stats;
  // max_clients = 2 is reached: a third join is rejected.
  absl::StatusOr<std::unique_ptr<Client>> third = absl::UnknownError("not run");
  connect_async([&] { third = Client::Connect(options); });
  EXPECT_FALSE(third.ok());
  // The client leaves: both of its connections go.
  client->reset();
  EXPECT_TRUE(step_until([&] { return (*server)->clients() == 0; }, absl::Seconds(30)))
      << (*server)->clients() << " still joined";
}

INSTANTIATE_TEST_SUITE_P(Joins, HopOverVerbs,
                         ::testing::Values(transport::ConnectMode::kTcp,
                                           transport::ConnectMode::kCm),
                         [](const ::testing::TestParamInfo<transport::ConnectMode>& info) {
                           return info.param == transport::ConnectMode::kCm ? "cm" : "tcp";
                         });

}  // namespace
}  // namespace hopscotch
