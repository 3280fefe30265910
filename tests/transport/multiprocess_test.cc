// Fabrics across processes: a forked peer with its own device, as a separate server or client
// process would be (on shm and, where a device exists, on verbs). Also, on shm: a kill -9'd peer
// leaves nothing behind and gets clear errors; a hugepage region is reachable from a peer.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "tests/transport/fabric_fixture.h"

namespace transport::testing {
namespace {

struct Exchange {
  QpEndpoint uc;
  QpEndpoint ud;
  uint64_t addr;
  uint32_t rkey;
};

bool WriteAll(int fd, const void* data, size_t n) {
  return write(fd, data, n) == static_cast<ssize_t>(n);
}
bool ReadAll(int fd, void* data, size_t n) { return read(fd, data, n) == static_cast<ssize_t>(n); }

// Two pipes between a parent and its forked child: `up` (child -> parent) and `down`. Each side
// closes the ends it does not use right after the fork: a parent that kept the child's write end
// would never see end-of-file when the child exits early, and would wait forever on a read.
struct Pipes {
  int up[2] = {-1, -1};
  int down[2] = {-1, -1};
  bool Open() { return pipe(up) == 0 && pipe(down) == 0; }
  void KeepChildEnds() {
    close(up[0]);
    close(down[1]);
  }
  void KeepParentEnds() {
    close(up[1]);
    close(down[0]);
  }
  int to_parent() const { return up[1]; }
  int from_child() const { return up[0]; }
  int to_child() const { return down[1]; }
  int from_parent() const { return down[0]; }
  void CloseParentEnds() {
    close(up[0]);
    close(down[1]);
  }
};

// The child: serve one WRITE + one UD request, answer by UD, exit 0 on success.
int RunPeer(const std::string& backend, int to_parent, int from_parent) {
  auto node = MakeNode(backend);
  if (node == nullptr) return 10;
  auto uc = MakeQp(*node, QpType::kUc);
  auto ud = MakeQp(*node, QpType::kUd);
  if (!ud->Connect(ConnectConfig{}).ok()) return 11;
  // Post the receive before announcing ourselves, so the parent's first UD SEND finds it.
  if (!PostRecv(*ud, *node, 1, 4096, kGrhBytes + 64).ok()) return 14;
  Exchange mine{uc->endpoint(), ud->endpoint(), node->addr(), node->mr->rkey()};
  Exchange theirs;
  if (!WriteAll(to_parent, &mine, sizeof(mine)) || !ReadAll(from_parent, &theirs, sizeof(theirs))) {
    return 12;
  }
  ConnectConfig config;
  config.remote = theirs.uc;
  // Announced once connected: a UC WRITE to a QP not yet ready to receive is dropped on a NIC.
  if (!uc->Connect(config).ok() || !WriteAll(to_parent, "c", 1)) return 13;
  auto got = PollN(*node->recv_cq, 1);
  if (got.size() != 1 || got[0].src_qp != theirs.ud.qp_num) return 15;
  if (std::memcmp(node->bytes() + 100, "cross-process write", 19) != 0) return 16;
  auto ah = node->pd->CreateAddressHandle(AddressInfo{theirs.ud.lid, theirs.ud.gid});
  if (!ah.ok()) return 17;
  std::memcpy(node->bytes() + 8192, "reply", 5);
  // Exit only once it left: a NIC (or the asynchronous fabric) may not have sent it yet.
  return SendUd(*ud, *node->send_cq, node->sge(8192, 5), ah->get(), theirs.ud.qp_num) ==
                 CompletionStatus::kSuccess
             ? 0
             : 19;
}

class ForkedPeer : public ::testing::TestWithParam<std::string> {};

TEST_P(ForkedPeer, WriteAndUdRoundTrip) {
  if (DeviceFor(GetParam()).empty()) {
    GTEST_SKIP() << "no " << GetParam() << " device on this machine (set HERD_VERBS_DEVICE, or "
                 << "run scripts/rxe_vm.sh for Soft-RoCE)";
  }
  Pipes pipes;
  ASSERT_TRUE(pipes.Open());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pipes.KeepChildEnds();
    _exit(RunPeer(GetParam(), pipes.to_parent(), pipes.from_parent()));
  }
  pipes.KeepParentEnds();
  const int* up = pipes.up;
  const int* down = pipes.down;

  // Opened after the fork: a child must not inherit a verbs context or registered memory.
  auto node = MakeNode(GetParam());
  ASSERT_NE(node, nullptr);
  auto uc = MakeQp(*node, QpType::kUc);
  auto ud = MakeQp(*node, QpType::kUd);
  ASSERT_TRUE(ud->Connect(ConnectConfig{}).ok());
  ASSERT_TRUE(PostRecv(*ud, *node, 9, 0, kGrhBytes + 64).ok());
  Exchange theirs;
  ASSERT_TRUE(ReadAll(up[0], &theirs, sizeof(theirs)));
  Exchange mine{uc->endpoint(), ud->endpoint(), node->addr(), node->mr->rkey()};
  ASSERT_TRUE(WriteAll(down[1], &mine, sizeof(mine)));
  ConnectConfig config;
  config.remote = theirs.uc;
  ASSERT_TRUE(uc->Connect(config).ok());
  char connected;
  ASSERT_TRUE(ReadAll(up[0], &connected, 1));

  std::memcpy(node->bytes() + 512, "cross-process write", 19);
  Sge sge = node->sge(512, 19);
  SendWr write;
  write.sg_list = &sge;
  write.num_sge = 1;
  write.opcode = Opcode::kWrite;
  write.remote_addr = theirs.addr + 100;
  write.rkey = theirs.rkey;
  ASSERT_TRUE(Post(*uc, write).ok());

  auto ah = *node->pd->CreateAddressHandle(AddressInfo{theirs.ud.lid, theirs.ud.gid});
  Sge ping = node->sge(512, 4);
  SendWr send;
  send.sg_list = &ping;
  send.num_sge = 1;
  send.ah = ah.get();
  send.remote_qpn = theirs.ud.qp_num;
  send.remote_qkey = ConnectConfig{}.qkey;
  send.flags = kSignaled;  // reaping each resend keeps the send queue from filling up
  // The peer posted its receive before it announced itself, so one SEND should do; UD may still
  // drop, so resend (as a UD client must) until it answers or the deadline passes.
  constexpr absl::Duration kResendInterval = absl::Milliseconds(100);
  std::vector<Completion> reply;
  const absl::Time give_up = absl::Now() + kCompletionDeadline;
  while (reply.empty() && absl::Now() < give_up) {
    ASSERT_TRUE(Post(*ud, send).ok());
    ASSERT_EQ(PollN(*node->send_cq, 1).size(), 1u);
    reply = PollN(*node->recv_cq, 1, kResendInterval);
  }
  // Reap the child first: its exit code says which step failed when no reply came.
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the peer failed at step " << WEXITSTATUS(status);
  ASSERT_EQ(reply.size(), 1u);
  EXPECT_EQ(reply[0].byte_len, kGrhBytes + 5);
  EXPECT_EQ(reply[0].src_qp, theirs.ud.qp_num);
  EXPECT_EQ(std::memcmp(node->bytes() + kGrhBytes, "reply", 5), 0);
  pipes.CloseParentEnds();
}

INSTANTIATE_TEST_SUITE_P(Backends, ForkedPeer, ::testing::Values("shm", "shm_async", "verbs"),
                         [](const auto& info) { return info.param; });

// A peer's hugepage-backed region, registered from inside its second hugepage: the other
// process must map it from a 2 MiB boundary (hugetlbfs refuses any other), then reaches it by
// RC WRITE and READ.
TEST(MultiProcess, AHugepageRegionIsReachableFromAnotherProcess) {
  constexpr size_t kRegionBytes = 2 * kHugePageBytes;
  constexpr size_t kRegistered = kHugePageBytes + 8192;  // 4 KiB-aligned, not 2 MiB-aligned
  constexpr size_t kOffset = kRegistered + 4000;
  constexpr int kNoHugepages = 20;  // the child's "skip" exit code
  struct Region {
    QpEndpoint rc;
    uint64_t addr;
    uint32_t rkey;
  };
  Pipes pipes;
  ASSERT_TRUE(pipes.Open());
  const int* up = pipes.up;
  const int* down = pipes.down;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pipes.KeepChildEnds();
    auto memory = SharedMemory::Allocate(kRegionBytes, "peer-huge", PagePolicy::kHugeRequired);
    if (!memory.ok()) _exit(kNoHugepages);
    auto node = MakeNode("shm");
    auto mr = node->pd->RegisterMemory(memory->data() + kRegistered, kRegionBytes - kRegistered,
                                       kAllAccess);
    auto rc = MakeQp(*node, QpType::kRc);
    if (!mr.ok()) _exit(21);
    std::memcpy(memory->data() + kOffset + 64, "from the child", 14);
    Region mine{rc->endpoint(), reinterpret_cast<uint64_t>(memory->data()), (*mr)->rkey()};
    QpEndpoint theirs;
    if (!WriteAll(up[1], &mine, sizeof(mine)) || !ReadAll(down[0], &theirs, sizeof(theirs))) {
      _exit(22);
    }
    ConnectConfig config;
    config.remote = theirs;
    if (!rc->Connect(config).ok() || !WriteAll(up[1], "c", 1)) _exit(23);
    char done;
    if (!ReadAll(down[0], &done, 1)) _exit(24);  // the parent's WRITE and READ are over
    _exit(std::memcmp(memory->data() + kOffset, "from the parent", 15) == 0 ? 0 : 25);
  }
  pipes.KeepParentEnds();
  Region theirs;
  const bool announced = ReadAll(up[0], &theirs, sizeof(theirs));
  if (!announced) {
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == kNoHugepages) {
      GTEST_SKIP() << "no two free 2 MiB hugepages (as root: echo 16 > /proc/sys/vm/nr_hugepages)";
    }
    pipes.CloseParentEnds();
    FAIL() << "the peer failed before announcing itself (exit status " << status << ")";
  }
  auto node = MakeNode("shm");
  ASSERT_NE(node, nullptr);
  auto rc = MakeQp(*node, QpType::kRc);
  ConnectConfig config;
  config.remote = theirs.rc;
  ASSERT_TRUE(rc->Connect(config).ok());
  const QpEndpoint mine = rc->endpoint();
  ASSERT_TRUE(WriteAll(down[1], &mine, sizeof(mine)));

  std::memcpy(node->bytes(), "from the parent", 15);
  Sge write_sge = node->sge(0, 15);
  SendWr write;
  write.sg_list = &write_sge;
  write.num_sge = 1;
  write.opcode = Opcode::kWrite;
  write.flags = kSignaled;
  write.remote_addr = theirs.addr + kOffset;
  write.rkey = theirs.rkey;
  char connected;
  ASSERT_TRUE(ReadAll(up[0], &connected, 1));
  ASSERT_TRUE(Post(*rc, write).ok());
  std::vector<Completion> done = PollN(*node->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kSuccess);
  Sge read_sge = node->sge(256, 14);
  SendWr read = write;
  read.sg_list = &read_sge;
  read.opcode = Opcode::kRead;
  read.remote_addr = theirs.addr + kOffset + 64;
  ASSERT_TRUE(Post(*rc, read).ok());
  done = PollN(*node->send_cq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kSuccess);
  EXPECT_EQ(std::memcmp(node->bytes() + 256, "from the child", 14), 0);
  ASSERT_TRUE(WriteAll(down[1], "x", 1));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the peer failed at step " << WEXITSTATUS(status);
  pipes.CloseParentEnds();
}

TEST(MultiProcess, AKilledPeerLeavesNothingAndGetsAClearError) {
  Pipes pipes;
  ASSERT_TRUE(pipes.Open());
  const int* up = pipes.up;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pipes.KeepChildEnds();
    auto node = MakeNode("shm");
    auto qp = MakeQp(*node, QpType::kRc);
    const QpEndpoint endpoint = qp->endpoint();
    WriteAll(up[1], &endpoint, sizeof(endpoint));
    pause();  // until killed
    _exit(0);
  }
  pipes.KeepParentEnds();
  QpEndpoint dead;
  ASSERT_TRUE(ReadAll(up[0], &dead, sizeof(dead)));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);

  // A new run starts cleanly (no named segment can be left over), and connecting to the dead
  // peer fails with a message that names it.
  auto node = MakeNode("shm");
  ASSERT_NE(node, nullptr);
  auto qp = MakeQp(*node, QpType::kRc);
  ConnectConfig config;
  config.remote = dead;
  const absl::Status status = qp->Connect(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("unreachable"), std::string::npos) << status;
}

}  // namespace
}  // namespace transport::testing
