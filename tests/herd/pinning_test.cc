// Core choice for workers and client threads (hwloc), on whatever machine the test runs.
#include "herd/pinning.h"

#include <sched.h>

#include <thread>

#include "gtest/gtest.h"

namespace herd {
namespace {

class Pinning : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loaded = Topology::Load();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    topology_ = *std::move(loaded);
    ASSERT_GE(topology_->cores(), 1);
  }
  std::unique_ptr<Topology> topology_;
};

TEST_F(Pinning, WithoutANumaNodeEveryCoreIsACandidateInOrder) {
  const std::vector<int> all = topology_->CoresOf(-1);
  ASSERT_EQ(all.size(), static_cast<size_t>(topology_->cores()));
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], static_cast<int>(i));
}

TEST_F(Pinning, WorkersTakeTheFirstCoresOrTheListedOnes) {
  auto first = topology_->PickCores(1, "", -1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, std::vector<int>{0});
  auto listed = topology_->PickCores(1, "0", -1);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(*listed, std::vector<int>{0});
  const auto beyond = topology_->PickCores(1, std::to_string(topology_->cores()), -1);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.status().message().find("this machine has cores"), std::string::npos);
  const auto too_many = topology_->PickCores(topology_->cores() + 1, "", -1);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
}

// A client's list beyond the machine is an error naming the client's flag, not the server's.
TEST_F(Pinning, AClientCoreBeyondTheMachineNamesTheClientsFlag) {
  const std::string beyond = std::to_string(topology_->cores());
  const auto picked = topology_->PickClientCores(1, beyond, -1);
  EXPECT_EQ(picked.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(picked.status().message());
  EXPECT_NE(message.find("--client_cores=" + beyond), std::string::npos) << message;
  EXPECT_EQ(message.find("--worker_cores"), std::string::npos) << message;
}

TEST_F(Pinning, ClientThreadsTakeTheLastCoresClearOfTheWorkers) {
  const int cores = topology_->cores();
  auto one = topology_->PickClientCores(1, "auto", -1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, std::vector<int>{cores - 1});
  auto all = topology_->PickClientCores(static_cast<uint32_t>(cores), "auto", -1);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), static_cast<size_t>(cores));
  EXPECT_EQ(all->front(), 0);
  auto none = topology_->PickClientCores(cores + 5, "none", -1);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());  // not pinned: the scheduler places them
  const auto too_many = topology_->PickClientCores(cores + 1, "auto", -1);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("--client_cores=none"), std::string::npos);
  auto listed = topology_->PickClientCores(1, "0", -1);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, std::vector<int>{0});
  const auto bad = topology_->PickClientCores(1, "x", -1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--client_cores=x"), std::string::npos) << bad.status();
}

TEST_F(Pinning, APinnedThreadRunsOnlyOnItsCore) {
  const int last = topology_->cores() - 1;
  std::thread pinned([&] {
    ASSERT_TRUE(topology_->PinCurrentThread(last).ok());
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
    // Allowed: the core's hardware threads only (one, or two with SMT), never every CPU.
    EXPECT_GE(CPU_COUNT(&set), 1);
    if (topology_->cores() > 1) {
      EXPECT_LT(static_cast<unsigned>(CPU_COUNT(&set)), std::thread::hardware_concurrency());
    }
    EXPECT_TRUE(CPU_ISSET(sched_getcpu(), &set));
  });
  pinned.join();
  EXPECT_EQ(topology_->PinCurrentThread(topology_->cores()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace herd
