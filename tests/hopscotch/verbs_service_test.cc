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
  // The READs' bytes, plus on RDMA-CM the hello messages each connection's control QP sent (a
  // few dozen bytes each; counted by the same device).
  constexpr uint64_t kControlBytesBound = 4096;
  EXPECT_GE(r->fabric.bytes, r->reads * kNeighbourhoodBytes);
  EXPECT_LE(r->fabric.bytes,
            r->reads * kNeighbourhoodBytes +
                (GetParam() == transport::ConnectMode::kCm ? kControlBytesBound : 0));

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

INSTANTIATE_TEST_SUITE_P(Joins, HopOverVerbs,
                         ::testing::Values(transport::ConnectMode::kTcp,
                                           transport::ConnectMode::kCm),
                         [](const ::testing::TestParamInfo<transport::ConnectMode>& info) {
                           return info.param == transport::ConnectMode::kCm ? "cm" : "tcp";
                         });

}  // namespace
}  // namespace hopscotch
