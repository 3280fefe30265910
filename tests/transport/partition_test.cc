// The shm fabric's partition fault (transport/shm/partition_table.h): the table's own rules, and
// two processes whose devices obey it: nothing passes between them while they are cut (UD lost
// and counted, RC RETRY_EXCEEDED), in both directions, and everything does again once healed.
// "Nothing arrived" is shown by a later message arriving first, never by waiting.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "tests/transport/fabric_fixture.h"
#include "transport/shm/partition_table.h"

namespace transport::testing {
namespace {

using shm::PartitionTable;

std::string TablePath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name, "-", getpid());
}

TEST(PartitionTableTest, ACutIsSymmetricAndHeals) {
  absl::StatusOr<PartitionTable> t = PartitionTable::Open(TablePath("symmetric"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->IsCut(10, 20));
  ASSERT_TRUE(t->Cut(20, 10).ok());
  EXPECT_TRUE(t->IsCut(10, 20));
  EXPECT_TRUE(t->IsCut(20, 10));
  EXPECT_FALSE(t->IsCut(10, 30));
  ASSERT_TRUE(t->Cut(10, 20).ok());  // already cut: still one pair
  ASSERT_TRUE(t->Cut(10, 30).ok());
  EXPECT_EQ(t->Cuts(), (std::vector<std::pair<int32_t, int32_t>>{{10, 20}, {10, 30}}));
  t->Heal(10, 20);
  EXPECT_FALSE(t->IsCut(20, 10));
  EXPECT_TRUE(t->IsCut(30, 10));
  t->HealAll();
  EXPECT_FALSE(t->IsCut(10, 30));
  EXPECT_TRUE(t->Cuts().empty());
}

TEST(PartitionTableTest, OpenersShareOneTable) {
  const std::string path = TablePath("shared");
  absl::StatusOr<PartitionTable> a = PartitionTable::Open(path);
  absl::StatusOr<PartitionTable> b = PartitionTable::Open(path);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->Cut(1, 2).ok());
  EXPECT_TRUE(b->IsCut(2, 1));
  b->Heal(1, 2);
  EXPECT_FALSE(a->IsCut(1, 2));
}

TEST(PartitionTableTest, BadCutsAndAFullTableAreRefused) {
  absl::StatusOr<PartitionTable> t = PartitionTable::Open(TablePath("full"));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Cut(0, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Cut(-1, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Cut(5, 5).code(), absl::StatusCode::kInvalidArgument);
  for (int32_t i = 0; i < static_cast<int32_t>(PartitionTable::kMaxCuts); ++i) {
    ASSERT_TRUE(t->Cut(1, 100 + i).ok()) << i;
  }
  const absl::Status full = t->Cut(2, 3);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_FALSE(t->IsCut(2, 3));
  t->Heal(1, 100);
  EXPECT_TRUE(t->Cut(2, 3).ok());  // a healed slot is reused
}

TEST(PartitionTableTest, AFileThatIsNoTableIsRefusedAndLeftAlone) {
  const std::string path = TablePath("other");
  {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "not a table", 11), 11);
    close(fd);
  }
  absl::StatusOr<PartitionTable> t = PartitionTable::Open(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("not a partition table"), std::string::npos) << t.status();
  char back[16] = {};
  const int fd = open(path.c_str(), O_RDONLY);
  ASSERT_EQ(read(fd, back, sizeof(back)), 11);
  close(fd);
  EXPECT_STREQ(back, "not a table");
  // The right size but another magic: refused too.
  const std::string sized = TablePath("sized");
  {
    absl::StatusOr<PartitionTable> real = PartitionTable::Open(sized);
    ASSERT_TRUE(real.ok());
  }
  const int wfd = open(sized.c_str(), O_WRONLY);
  ASSERT_EQ(pwrite(wfd, "XXXXXXXX", 8, 0), 8);
  close(wfd);
  EXPECT_FALSE(PartitionTable::Open(sized).ok());
  EXPECT_FALSE(PartitionTable::Open("/nonexistent-dir/table").ok());
}

// The two processes' exchange: the child's UD endpoint and RC endpoint.
struct Endpoints {
  QpEndpoint ud;
  QpEndpoint rc;
};

bool WriteAll(int fd, const void* data, size_t n) {
  return write(fd, data, n) == static_cast<ssize_t>(n);
}
bool ReadAll(int fd, void* data, size_t n) { return read(fd, data, n) == static_cast<ssize_t>(n); }

FaultOptions Partitioned(const std::string& path) {
  FaultOptions faults;
  faults.partition_file = path;
  return faults;
}

// The child: a node obeying the table; on each byte from the parent it sends that byte to the
// parent by UD and reports the send's completion status; it echoes every UD message it receives
// back to the parent's pipe. Exits on 'q'.
int RunChild(const std::string& path, int to_parent, int from_parent) {
  auto node = MakeNode("shm", kAllAccess, 4096, "partition-test", Partitioned(path));
  if (node == nullptr) return 10;
  auto ud = MakeQp(*node, QpType::kUd);
  auto rc = MakeQp(*node, QpType::kRc);
  if (!ud->Connect(ConnectConfig{}).ok()) return 11;
  for (uint64_t i = 0; i < 8; ++i) {
    if (!PostRecv(*ud, *node, i, 4096 + i * 128, kGrhBytes + 64).ok()) return 12;
  }
  Endpoints mine{ud->endpoint(), rc->endpoint()};
  Endpoints theirs;
  if (!WriteAll(to_parent, &mine, sizeof(mine)) || !ReadAll(from_parent, &theirs, sizeof(theirs))) {
    return 13;
  }
  ConnectConfig config;
  config.remote = theirs.rc;
  if (!rc->Connect(config).ok()) return 14;
  auto ah = node->pd->CreateAddressHandle(AddressInfo{theirs.ud.lid, theirs.ud.gid});
  if (!ah.ok()) return 15;
  char command = 0;
  while (ReadAll(from_parent, &command, 1) && command != 'q') {
    if (command == 'r') {  // report the first UD message received since
      std::vector<Completion> got = PollN(*node->recv_cq, 1);
      const char byte =
          got.size() == 1 ? static_cast<char>(node->bytes()[4096 + got[0].wr_id * 128 + kGrhBytes])
                          : '?';
      if (got.size() == 1 &&
          !PostRecv(*ud, *node, got[0].wr_id, 4096 + got[0].wr_id * 128, kGrhBytes + 64).ok()) {
        return 16;
      }
      if (!WriteAll(to_parent, &byte, 1)) return 17;
      continue;
    }
    node->bytes()[0] = static_cast<uint8_t>(command);
    const char status = SendUd(*ud, *node->send_cq, node->sge(0, 1), ah->get(), theirs.ud.qp_num) ==
                                CompletionStatus::kSuccess
                            ? 'S'
                            : 'F';
    if (!WriteAll(to_parent, &status, 1)) return 19;
  }
  return 0;
}

class PartitionedPeers : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TablePath("peers");
    ASSERT_TRUE(pipe(up_) == 0 && pipe(down_) == 0);
    child_ = fork();
    ASSERT_GE(child_, 0);
    if (child_ == 0) {
      close(up_[0]);
      close(down_[1]);
      _exit(RunChild(path_, up_[1], down_[0]));
    }
    close(up_[1]);
    close(down_[0]);
    absl::StatusOr<PartitionTable> table = PartitionTable::Open(path_);
    ASSERT_TRUE(table.ok()) << table.status();
    table_ = std::make_unique<PartitionTable>(*std::move(table));
    node_ = MakeNode("shm", kAllAccess, 4096, "partition-test", Partitioned(path_));
    ASSERT_NE(node_, nullptr);
    ud_ = MakeQp(*node_, QpType::kUd);
    rc_ = MakeQp(*node_, QpType::kRc);
    ASSERT_TRUE(ud_->Connect(ConnectConfig{}).ok());
    for (uint64_t i = 0; i < 8; ++i) {
      ASSERT_TRUE(PostRecv(*ud_, *node_, i, 4096 + i * 128, kGrhBytes + 64).ok());
    }
    ASSERT_TRUE(ReadAll(up_[0], &theirs_, sizeof(theirs_)));
    Endpoints mine{ud_->endpoint(), rc_->endpoint()};
    ASSERT_TRUE(WriteAll(down_[1], &mine, sizeof(mine)));
    ConnectConfig config;
    config.remote = theirs_.rc;
    ASSERT_TRUE(rc_->Connect(config).ok());
    ah_ = *node_->pd->CreateAddressHandle(AddressInfo{theirs_.ud.lid, theirs_.ud.gid});
  }
  void TearDown() override {
    if (child_ <= 0) return;
    WriteAll(down_[1], "q", 1);
    int status = 0;
    ASSERT_EQ(waitpid(child_, &status, 0), child_);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the child failed at step " << WEXITSTATUS(status);
    close(up_[0]);
    close(down_[1]);
  }
  // Sends `byte` to the child by UD; the send's completion status.
  CompletionStatus SendToChild(char byte) {
    node_->bytes()[0] = static_cast<uint8_t>(byte);
    return SendUd(*ud_, *node_->send_cq, node_->sge(0, 1), ah_.get(), theirs_.ud.qp_num);
  }
  // The first UD message the child received since its last report.
  char ChildReceived() {
    char byte = 0;
    EXPECT_TRUE(WriteAll(down_[1], "r", 1));
    EXPECT_TRUE(ReadAll(up_[0], &byte, 1));
    return byte;
  }
  // Has the child send `byte` to us by UD; its send's status ('S' or 'F').
  char ChildSends(char byte) {
    char status = 0;
    EXPECT_TRUE(WriteAll(down_[1], &byte, 1));
    EXPECT_TRUE(ReadAll(up_[0], &status, 1));
    return status;
  }
  // The first UD message we received since the last call.
  char Received() {
    std::vector<Completion> got = PollN(*node_->recv_cq, 1);
    if (got.size() != 1) return '?';
    const char byte = static_cast<char>(node_->bytes()[4096 + got[0].wr_id * 128 + kGrhBytes]);
    EXPECT_TRUE(
        PostRecv(*ud_, *node_, got[0].wr_id, 4096 + got[0].wr_id * 128, kGrhBytes + 64).ok());
    return byte;
  }
  CompletionStatus WriteToChild() {
    Sge sge = node_->sge(0, 8);
    SendWr wr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = Opcode::kWrite;
    wr.remote_addr = 0;  // never reached while cut; the child's region is not ours to name
    wr.rkey = 0;
    wr.flags = kSignaled;
    EXPECT_TRUE(Post(*rc_, wr).ok());
    std::vector<Completion> done = PollN(*node_->send_cq, 1);
    return done.size() == 1 ? done[0].status : CompletionStatus::kFlushed;
  }

  std::string path_;
  int up_[2] = {-1, -1};
  int down_[2] = {-1, -1};
  pid_t child_ = -1;
  std::unique_ptr<PartitionTable> table_;
  std::unique_ptr<Node> node_;
  std::unique_ptr<QueuePair> ud_, rc_;
  std::unique_ptr<AddressHandle> ah_;
  Endpoints theirs_;
};

TEST_F(PartitionedPeers, NothingPassesWhileCutAndEverythingAgainOnceHealed) {
  // Before: both ways.
  ASSERT_EQ(SendToChild('a'), CompletionStatus::kSuccess);
  EXPECT_EQ(ChildReceived(), 'a');
  ASSERT_EQ(ChildSends('b'), 'S');
  EXPECT_EQ(Received(), 'b');

  ASSERT_TRUE(table_->Cut(getpid(), child_).ok());
  const uint64_t dropped_before = ud_->counters().dropped.Get();
  EXPECT_EQ(SendToChild('x'), CompletionStatus::kSuccess);       // UD: lost silently...
  EXPECT_EQ(ud_->counters().dropped.Get(), dropped_before + 1);  // ...and counted
  EXPECT_EQ(ChildSends('y'), 'S');  // the other direction, decided in the child's own device
  // RC gives up on a partitioned peer as on a dead one (and its QP goes to error).
  EXPECT_EQ(WriteToChild(), CompletionStatus::kRetryExceeded);
  EXPECT_EQ(rc_->state(), QpState::kError);

  table_->Heal(child_, getpid());
  ASSERT_EQ(SendToChild('c'), CompletionStatus::kSuccess);
  EXPECT_EQ(ChildReceived(), 'c') << "a message sent while cut arrived";
  ASSERT_EQ(ChildSends('d'), 'S');
  EXPECT_EQ(Received(), 'd') << "a message sent while cut arrived";
}

TEST_F(PartitionedPeers, ACutBetweenOtherProcessesLeavesThisPairAlone) {
  ASSERT_TRUE(table_->Cut(getpid(), child_ + 100000).ok());
  ASSERT_TRUE(table_->Cut(child_, 1).ok());
  ASSERT_EQ(SendToChild('a'), CompletionStatus::kSuccess);
  EXPECT_EQ(ChildReceived(), 'a');
  ASSERT_EQ(ChildSends('b'), 'S');
  EXPECT_EQ(Received(), 'b');
  table_->HealAll();
}

}  // namespace
}  // namespace transport::testing
