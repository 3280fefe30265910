// Tests of the shared-memory fabric's internals: the completion ring under concurrent producers,
// CQ overruns, and peers whose segments are hostile.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/fabric_fixture.h"
#include "transport/shm/shm_internal.h"

namespace transport::testing {
namespace {

// The ring a signalled producer stalls on (see StallUntilHeadMoves).
std::atomic<shm::CqRing*> g_stalled_ring{nullptr};

// A signal handler that stalls the interrupted producer wherever it is (as a preemption would)
// until the consumer has moved on by a ring's worth, or a bounded while: a producer stalled
// between reading the tail and reading the head then sees a head past its tail.
void StallUntilHeadMoves(int) {
  constexpr uint64_t kSpinLimit = 200000;  // bounded: the ring may be waiting for this producer
  shm::CqRing* ring = g_stalled_ring.load();
  if (ring == nullptr) return;
  const uint64_t start = ring->head.load(std::memory_order_acquire);
  for (uint64_t i = 0; i < kSpinLimit; ++i) {
    if (ring->head.load(std::memory_order_acquire) - start > ring->depth) return;
  }
}

shm::ShmCq& AsShm(CompletionQueue& cq) { return dynamic_cast<shm::ShmCq&>(cq); }
shm::CqRing* RingOf(shm::ShmCq& cq) { return cq.device()->segment().At<shm::CqRing>(cq.offset()); }

// Several producers push into a small completion ring while one consumer drains it. Each
// producer keeps at most its share of the ring outstanding, so the ring can never really be
// full: every push must succeed and every completion must arrive, exactly once. A producer whose
// view of the tail is stale (others pushed and the consumer caught up past it) must not take
// that for an overflow.
TEST(ShmCompletionRing, ConcurrentProducersNeverLoseACompletion) {
  constexpr uint32_t kProducers = 4;
  constexpr uint32_t kDepth = 8;                    // small: head passes a stale tail often
  constexpr uint32_t kShare = kDepth / kProducers;  // outstanding per producer: never full
  constexpr uint64_t kPushesPerProducer = 200000;   // bounded; about a second here
  constexpr uint32_t kSeed = 20240601;              // fixed: reproducible pacing
  auto node = MakeNode("shm");
  ASSERT_NE(node, nullptr);
  auto cq = node->device->CreateCq(kDepth);
  ASSERT_TRUE(cq.ok()) << cq.status();
  shm::ShmCq& ring_cq = AsShm(**cq);
  shm::CqRing* ring = RingOf(ring_cq);

  // Stall producers at random points, often: the race that a scheduler produces now and then on
  // a loaded machine happens within the test's bounded run.
  struct sigaction action = {};
  action.sa_handler = StallUntilHeadMoves;
  ASSERT_EQ(sigaction(SIGUSR1, &action, nullptr), 0);
  g_stalled_ring.store(ring);

  std::atomic<uint64_t> received[kProducers] = {};
  std::atomic<uint64_t> failed_pushes{0};
  std::atomic<uint32_t> producers_done{0};
  std::vector<std::thread> producers;
  for (uint32_t p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (uint64_t i = 0; i < kPushesPerProducer; ++i) {
        while (i - received[p].load(std::memory_order_acquire) >= kShare) {
        }
        Completion c;
        c.wr_id = (uint64_t{p} << 48) | i;
        c.qp_num = p;
        if (!shm::PushCompletion(ring, kDepth, ring_cq.id(), c, 0)) {
          failed_pushes.fetch_add(1);
          received[p].fetch_add(1);  // lost: do not wait for it
        }
      }
      producers_done.fetch_add(1);
    });
  }
  std::atomic<bool> stop_stalls{false};
  std::thread staller([&] {
    constexpr auto kStallInterval = std::chrono::microseconds(50);
    std::mt19937 random(kSeed);
    while (!stop_stalls.load()) {
      pthread_kill(producers[random() % kProducers].native_handle(), SIGUSR1);
      std::this_thread::sleep_for(kStallInterval);
    }
  });
  uint64_t out_of_order = 0;
  uint64_t next[kProducers] = {};
  Completion buffer[kDepth];
  uint64_t total = 0;
  while (total < kProducers * kPushesPerProducer) {
    const size_t n = (*cq)->Poll(absl::MakeSpan(buffer, kDepth));
    for (size_t k = 0; k < n; ++k) {
      const uint32_t p = buffer[k].qp_num;
      ASSERT_LT(p, kProducers);
      if ((buffer[k].wr_id & ((uint64_t{1} << 48) - 1)) != next[p]) ++out_of_order;
      next[p] = (buffer[k].wr_id & ((uint64_t{1} << 48) - 1)) + 1;
      received[p].fetch_add(1, std::memory_order_release);
    }
    total += n;
    if (n == 0 && producers_done.load() == kProducers) {
      total = 0;
      for (uint32_t p = 0; p < kProducers; ++p) total += received[p].load();
      if (total == kProducers * kPushesPerProducer) break;
    }
  }
  stop_stalls.store(true);
  staller.join();
  for (std::thread& t : producers) t.join();
  g_stalled_ring.store(nullptr);
  EXPECT_EQ(failed_pushes.load(), 0u) << "a push into a ring with room reported an overflow";
  EXPECT_EQ(out_of_order, 0u);
}

// A receive CQ too shallow for what arrives: the completions that do not fit are lost, and that
// is never silent. The CQ counts the overruns, the receiving QP counts the messages dropped, the
// device's counters (and their JSON) show both.
TEST(ShmCompletionRing, ARealOverrunShowsUpInTheCounters) {
  constexpr uint32_t kCqDepth = 2;
  constexpr uint32_t kMessages = 5;  // kMessages - kCqDepth completions cannot fit
  auto a = MakeNode("shm");
  auto b = MakeNode("shm");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto shallow = *b->device->CreateCq(kCqDepth);
  QpConfig config;
  config.type = QpType::kUd;
  config.send_cq = b->send_cq.get();
  config.recv_cq = shallow.get();
  auto qb = *b->pd->CreateQp(config);
  auto qa = MakeQp(*a, QpType::kUd);
  ASSERT_TRUE(qa->Connect(ConnectConfig{}).ok());
  ASSERT_TRUE(qb->Connect(ConnectConfig{}).ok());
  for (uint32_t i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(PostRecv(*qb, *b, i, 256 * i, 256).ok());
  }
  auto ah = *a->pd->CreateAddressHandle(AddressInfo{0, b->device->port().gid});
  Sge sge = a->sge(0, 16);
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.ah = ah.get();
  wr.remote_qpn = qb->qp_num();
  wr.remote_qkey = ConnectConfig{}.qkey;
  for (uint32_t i = 0; i < kMessages; ++i) ASSERT_TRUE(Post(*qa, wr).ok());
  // The synchronous fabric delivers inside PostSend: everything that will arrive has.
  Completion polled[kMessages];
  EXPECT_EQ(shallow->Poll(absl::MakeSpan(polled, kMessages)), kCqDepth);
  EXPECT_EQ(shallow->counters().overruns.Get(), kMessages - kCqDepth);
  EXPECT_EQ(qb->counters().dropped.Get(), kMessages - kCqDepth);
  const CounterSnapshot counters = b->device->counters();
  EXPECT_EQ(counters.cq_overruns, kMessages - kCqDepth);
  EXPECT_EQ(counters.dropped, kMessages - kCqDepth);
  EXPECT_NE(counters.ToJson().find("\"cq_overruns\":3"), std::string::npos) << counters.ToJson();
}

// ---------------------------------------------------------------- hostile peer segments
// Everything a peer's segment says is input from the peer, as a request's bytes are: a forged or
// corrupt one must give an error or a counted drop, never SIGBUS, SIGFPE or SIGSEGV here.
class HostileSegment : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = MakeNode("shm");
    b_ = MakeNode("shm");
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
  }
  // A GID in our fabric that names file descriptor `fd` of this process.
  Gid ForgedGid(int fd) const {
    shm::ShmAddress address;
    std::memcpy(&address, a_->device->port().gid.data(), sizeof(address));
    address.pid = getpid();
    address.fd = fd;
    Gid gid;
    std::memcpy(gid.data(), &address, sizeof(address));
    return gid;
  }
  shm::SegmentMapping& SegmentOf(Node& node) {
    return dynamic_cast<shm::ShmDevice&>(*node.device).segment();
  }
  shm::QpEntry& EntryOf(Node& node, const QueuePair& qp) {
    return SegmentOf(node).header()->qps[qp.qp_num() & ((1u << shm::kQpIndexBits) - 1)];
  }
  // Sends one UD message from a new QP of a_ to `qb` of b_; returns the sender's completion.
  Completion SendUd(QueuePair& qb) {
    qa_ = MakeQp(*a_, QpType::kUd);
    EXPECT_TRUE(qa_->Connect(ConnectConfig{}).ok());
    ah_ = *a_->pd->CreateAddressHandle(AddressInfo{0, b_->device->port().gid});
    Sge sge = a_->sge(0, 16);
    SendWr wr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.flags = kSignaled;
    wr.ah = ah_.get();
    wr.remote_qpn = qb.qp_num();
    wr.remote_qkey = ConnectConfig{}.qkey;
    EXPECT_TRUE(Post(*qa_, wr).ok());
    std::vector<Completion> done = PollN(*a_->send_cq, 1);
    EXPECT_EQ(done.size(), 1u);
    return done.empty() ? Completion{} : done[0];
  }
  std::unique_ptr<Node> a_, b_;
  std::unique_ptr<QueuePair> qa_;
  std::unique_ptr<AddressHandle> ah_;
};

// Counts the opens of one file anyone makes from now on (inotify IN_OPEN): how a test shows what
// the fabric opened, or never opened.
class OpenWatch {
 public:
  explicit OpenWatch(const std::string& path) : fd_(inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    if (fd_ >= 0 && inotify_add_watch(fd_, path.c_str(), IN_OPEN) < 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~OpenWatch() {
    if (fd_ >= 0) close(fd_);
  }
  OpenWatch(const OpenWatch&) = delete;
  OpenWatch& operator=(const OpenWatch&) = delete;
  bool ok() const { return fd_ >= 0; }
  // Opens seen since the last call.
  uint64_t opens() const {
    alignas(inotify_event) char events[4096];
    uint64_t count = 0;
    ssize_t got;
    while ((got = read(fd_, events, sizeof(events))) > 0) {
      for (ssize_t at = 0; at < got;) {
        const auto* event = reinterpret_cast<const inotify_event*>(events + at);
        if ((event->mask & IN_OPEN) != 0) ++count;
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
    return count;
  }

 private:
  int fd_;
};

// A regular file of `bytes` in the test's temporary directory (a file system no memfd lives on),
// open read-write, its opens watched from here on; removed when this goes.
class DiskFile {
 public:
  explicit DiskFile(uint64_t bytes) {
    const char* dir = std::getenv("TEST_TMPDIR");
    path_ = std::string(dir != nullptr ? dir : "/tmp") + "/shm_test_disk_file.XXXXXX";
    fd_ = mkstemp(path_.data());
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(bytes)) != 0) return;
    watch_ = std::make_unique<OpenWatch>(path_);
  }
  ~DiskFile() {
    watch_.reset();
    if (fd_ >= 0) close(fd_);
    unlink(path_.c_str());
  }
  bool ok() const { return fd_ >= 0 && watch_ != nullptr && watch_->ok(); }
  int fd() const { return fd_; }
  uint64_t opens() const { return watch_->opens(); }

 private:
  std::string path_;
  int fd_ = -1;
  std::unique_ptr<OpenWatch> watch_;
};

// A GID names a descriptor; what it is open on is the peer's choice. A file that is no memfd is
// refused without being opened: an open runs its file system's code (a FUSE daemon may never
// answer it; a terminal would become ours), and the peer could swap the file between a check and
// the open. (The O_PATH resolution that identifies it opens nothing.)
TEST_F(HostileSegment, AGidNamingAFileThatIsNoMemfdIsRefusedUnopened) {
  DiskFile file(shm::kSegmentBytes);
  ASSERT_TRUE(file.ok());
  auto qa = MakeQp(*a_, QpType::kRc);
  ConnectConfig config;
  config.remote.qp_num = 1;
  config.remote.gid = ForgedGid(file.fd());
  const absl::Status status = qa->Connect(config);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("no memfd"), std::string::npos) << status;
  EXPECT_EQ(file.opens(), 0u) << "the fabric opened a file a peer named before knowing what it is";
}

TEST_F(HostileSegment, AGidNamingAnEmptyFileIsAnErrorNotSigbus) {
  const int fd = memfd_create("empty", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto qa = MakeQp(*a_, QpType::kRc);
  ConnectConfig config;
  config.remote.qp_num = 1;
  config.remote.gid = ForgedGid(fd);
  const absl::Status status = qa->Connect(config);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("not a shm device"), std::string::npos) << status;
  close(fd);
}

TEST_F(HostileSegment, AFullSizeFileOfGarbageIsAnError) {
  constexpr uint32_t kSeed = 7;
  const int fd = memfd_create("garbage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, shm::kSegmentBytes), 0);
  // Garbage where the header is; sealed as a real segment is, so only the contents are wrong.
  std::vector<uint8_t> garbage(sizeof(shm::SegmentHeader));
  std::mt19937 random(kSeed);
  for (uint8_t& byte : garbage) byte = static_cast<uint8_t>(random());
  ASSERT_EQ(pwrite(fd, garbage.data(), garbage.size(), 0), static_cast<ssize_t>(garbage.size()));
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  auto qa = MakeQp(*a_, QpType::kUc);
  ConnectConfig config;
  config.remote.qp_num = 1;
  config.remote.gid = ForgedGid(fd);
  EXPECT_FALSE(qa->Connect(config).ok());
  close(fd);
}

TEST_F(HostileSegment, AReceiveRingOfDepthZeroIsADropNotSigfpe) {
  auto qb = MakeQp(*b_, QpType::kUd);
  ASSERT_TRUE(qb->Connect(ConnectConfig{}).ok());
  ASSERT_TRUE(PostRecv(*qb, *b_, 1, 0, 256).ok());
  shm::QpEntry& entry = EntryOf(*b_, *qb);
  SegmentOf(*b_).At<shm::RecvRing>(entry.recv_ring_offset)->depth = 0;
  EXPECT_EQ(SendUd(*qb).status, CompletionStatus::kSuccess);  // UD: silently dropped
  EXPECT_EQ(qa_->counters().dropped.Get(), 1u);
  EXPECT_EQ(qb->counters().dropped.Get(), 1u);
}

TEST_F(HostileSegment, RingsOutsideTheSegmentAreADropNotSigsegv) {
  auto qb = MakeQp(*b_, QpType::kUd);
  ASSERT_TRUE(qb->Connect(ConnectConfig{}).ok());
  ASSERT_TRUE(PostRecv(*qb, *b_, 1, 0, 256).ok());
  shm::QpEntry& entry = EntryOf(*b_, *qb);
  const uint64_t cq_offset = entry.recv_cq_offset;
  entry.recv_cq_offset = shm::kSegmentBytes - 8;  // the ring's header would end past the segment
  EXPECT_EQ(SendUd(*qb).status, CompletionStatus::kSuccess);
  EXPECT_EQ(qa_->counters().dropped.Get(), 1u);
  entry.recv_cq_offset = cq_offset;
  // A depth that reaches past the segment's end.
  SegmentOf(*b_).At<shm::CqRing>(cq_offset)->depth = 0xffffffffu;
  EXPECT_EQ(SendUd(*qb).status, CompletionStatus::kSuccess);
  EXPECT_EQ(qa_->counters().dropped.Get(), 1u);
}

// A forged MR entry: b_'s region (kNodeMemoryBytes of one memfd) described by other extents.
struct ForgedExtents {
  const char* what;
  uint32_t count;
  shm::MrExtent extents[kMaxMrExtents];  // fd -1: b_'s memfd
};

class HostileMrEntry : public HostileSegment {
 protected:
  shm::MrEntry& EntryOf(const MemoryRegion& mr) {
    return SegmentOf(*b_).header()->mrs[mr.rkey() >> shm::kMrIndexShift];
  }
  void Forge(const ForgedExtents& forged) {
    shm::MrEntry& entry = EntryOf(*b_->mr);
    entry.extent_count = forged.count;
    for (uint32_t i = 0; i < kMaxMrExtents; ++i) {
      entry.extents[i] = forged.extents[i];
      if (entry.extents[i].fd == -1) entry.extents[i].fd = b_->memory->fd();
    }
  }
  // An RC WRITE of 8 bytes from a_ to b_'s region at `offset`, on a new QP pair (a new mapping
  // of b_'s regions); returns its completion status.
  CompletionStatus WriteAt(size_t offset) {
    auto qa = MakeQp(*a_, QpType::kRc);
    auto qb = MakeQp(*b_, QpType::kRc);
    ConnectPair(*qa, *qb);
    Sge sge = a_->sge(0, 8);
    SendWr wr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = Opcode::kWrite;
    wr.flags = kSignaled;
    wr.remote_addr = b_->addr(offset);
    wr.rkey = b_->mr->rkey();
    EXPECT_TRUE(Post(*qa, wr).ok());
    std::vector<Completion> done = PollN(*a_->send_cq, 1);
    EXPECT_EQ(done.size(), 1u);
    return done.empty() ? CompletionStatus::kOtherError : done[0].status;
  }
};

constexpr uint64_t kHalf = kNodeMemoryBytes / 2;

// An entry whose extents are fine: b_'s memfd's first half, twice. A WRITE to the second half
// lands in the first, so the forged layout, not the file's, is what got mapped.
TEST_F(HostileMrEntry, AWellFormedForgedLayoutIsMappedAsItSays) {
  Forge({"first half twice", 2, {{-1, 0, 0, kHalf}, {-1, 0, 0, kHalf}}});
  std::memcpy(a_->bytes(), "mirrored", 8);
  ASSERT_EQ(WriteAt(kHalf + 16), CompletionStatus::kSuccess);
  EXPECT_EQ(std::memcmp(b_->bytes() + 16, "mirrored", 8), 0);
}

// Every bad layout is a remote access error for the WR, never a crash or a mapping of memory
// the layout does not describe.
TEST_F(HostileMrEntry, ABadLayoutIsARemoteAccessError) {
  constexpr uint64_t kAll = kNodeMemoryBytes;
  constexpr uint64_t kMax = ~uint64_t{0};
  constexpr int32_t kNoSuchFd = 1 << 20;  // descriptors stay below fs.nr_open (2^20 by default)
  const ForgedExtents cases[] = {
      {"no extents", 0, {{-1, 0, 0, kAll}}},
      {"one extent too many", kMaxMrExtents + 1, {{-1, 0, 0, kAll}}},
      {"a huge count", 0xffffffffu, {{-1, 0, 0, kAll}}},
      {"lengths short of the region", 2, {{-1, 0, 0, kHalf}, {-1, 0, kHalf, kHalf / 2}}},
      {"lengths past the region", 2, {{-1, 0, 0, kAll}, {-1, 0, 0, kHalf}}},
      {"lengths that wrap to the region's",
       2,
       {{-1, 0, 0, kMax - kHalf + 1}, {-1, 0, 0, 2 * kHalf}}},
      {"an empty extent", 2, {{-1, 0, 0, kAll}, {-1, 0, 0, 0}}},
      {"an extent past the file's end", 2, {{-1, 0, 0, kHalf}, {-1, 0, kAll, kHalf}}},
      {"one extent past the file's end", 1, {{-1, 0, 4096, kAll}}},
      {"a file offset that wraps", 2, {{-1, 0, 0, kHalf}, {-1, 0, kMax - 100, kHalf}}},
      {"a second extent mid-page in its file", 2, {{-1, 0, 0, kHalf}, {-1, 0, 100, kHalf}}},
      {"a boundary mid-page in memory", 2, {{-1, 0, 0, kHalf - 100}, {-1, 0, 0, kHalf + 100}}},
      {"a file that is not there", 2, {{-1, 0, 0, kHalf}, {kNoSuchFd, 0, 0, kHalf}}},
  };
  for (const ForgedExtents& forged : cases) {
    Forge(forged);
    EXPECT_EQ(WriteAt(0), CompletionStatus::kRemoteAccessError) << forged.what;
  }
}

// Issue 36: every QP's receive ring and every CQ was carved from the device's segment by a bump
// allocator that never freed, so a server that many short sessions joined (each with QPs and
// CQs of its own) refused every join after ~189,000 of them ("shm device segment full").
// Destroyed rings are reused now, once their quarantine passed; with deep rings the segment
// would be full within a few thousand of these cycles without it.
TEST(ShmSegment, DestroyedRingsAreReusedSoTheSegmentNeverFillsUp) {
  auto node = MakeNode("shm");
  ASSERT_NE(node, nullptr);
  shm::ShmDevice& device = dynamic_cast<shm::ShmDevice&>(*node->device);
  device.set_ring_quarantine(std::chrono::nanoseconds(0));
  constexpr uint32_t kDepth = 4096;  // ~450 KiB of CQ and ring per cycle
  constexpr int kCycles = 2000;      // ~900 MiB in all: 3.5 segments' worth
  uint64_t high_water = 0;
  for (int i = 0; i < kCycles; ++i) {
    auto cq = node->device->CreateCq(kDepth);
    ASSERT_TRUE(cq.ok()) << "cycle " << i << ": " << cq.status();
    QpConfig config;
    config.type = QpType::kUd;
    config.send_cq = cq->get();
    config.recv_cq = cq->get();
    config.max_send_wr = 16;
    config.max_recv_wr = kDepth;
    auto qp = node->pd->CreateQp(config);
    ASSERT_TRUE(qp.ok()) << "cycle " << i << ": " << qp.status();
    high_water = device.segment().header()->arena_used.load();
  }
  EXPECT_LT(high_water, uint64_t{4} << 20) << "the arena grew with every cycle";
}

// A fresh device's segment is a new memfd, all zeros, which is its header's initial state:
// writing the header's ~770 KB (193 pages) of MR and QP tables at open allocated every page of them
// in every process that opened a device, and was most of a client's join. Opening a device (with a
// PD, a CQ pair and a region, as MakeNode does) touches only the pages it uses.
TEST(ShmSegment, OpeningADeviceTouchesOnlyThePagesItUses) {
  auto node = MakeNode("shm");
  ASSERT_NE(node, nullptr);
  shm::ShmDevice& device = dynamic_cast<shm::ShmDevice&>(*node->device);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t header_pages = (sizeof(shm::SegmentHeader) + page - 1) / page;
  std::vector<unsigned char> resident(header_pages);
  ASSERT_EQ(mincore(device.segment().base(), header_pages * page, resident.data()), 0)
      << std::strerror(errno);
  size_t touched = 0;
  for (unsigned char r : resident) touched += r & 1;
  EXPECT_LT(touched, header_pages / 8) << touched << " of the header's " << header_pages
                                       << " pages are resident after opening one device";
}

// A released ring waits out its quarantine: a peer that found the old QP an instant before it
// was destroyed may still be writing a completion into its CQ.
TEST(ShmSegment, ARingIsNotReusedBeforeItsQuarantineEnds) {
  auto node = MakeNode("shm");
  ASSERT_NE(node, nullptr);
  shm::ShmDevice& device = dynamic_cast<shm::ShmDevice&>(*node->device);
  device.set_ring_quarantine(std::chrono::hours(1));
  uint64_t first = 0;
  {
    auto cq = node->device->CreateCq(64);
    ASSERT_TRUE(cq.ok()) << cq.status();
    first = AsShm(**cq).offset();
  }
  auto cq = node->device->CreateCq(64);
  ASSERT_TRUE(cq.ok()) << cq.status();
  EXPECT_NE(AsShm(**cq).offset(), first);
  device.set_ring_quarantine(std::chrono::nanoseconds(0));
  auto again = node->device->CreateCq(64);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(AsShm(**again).offset(), first) << "released and past its quarantine: reused";
}

// A sender that looked a QP up just before it was destroyed, and whose ring and CQ another QP
// and CQ then took over, lands nothing there: the ring names its QP and the CQ its id, checked
// after every head or tail read, and the new life's counters start past the old one's, so a
// claim begun on the old ring fails its CAS and retries into the owner check.
TEST(ShmSegment, AReusedRingRefusesWhoeverFoundItsOldOwner) {
  auto node = MakeNode("shm");
  ASSERT_NE(node, nullptr);
  shm::ShmDevice& device = dynamic_cast<shm::ShmDevice&>(*node->device);
  device.set_ring_quarantine(std::chrono::nanoseconds(0));
  const auto make = [&](CompletionQueue* cq) {
    QpConfig config;
    config.type = QpType::kUd;
    config.send_cq = cq;
    config.recv_cq = cq;
    config.max_send_wr = 4;
    config.max_recv_wr = 8;
    auto qp = node->pd->CreateQp(config);
    EXPECT_TRUE(qp.ok()) << qp.status();
    ConnectConfig connect;
    connect.qkey = 7;
    EXPECT_TRUE((*qp)->Connect(connect).ok());
    return *std::move(qp);
  };
  const auto post = [&](QueuePair& qp) {
    Sge sge{reinterpret_cast<uint64_t>(node->memory->data()), 64, node->mr->lkey()};
    RecvWr wr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    RecvWr* bad = nullptr;
    EXPECT_TRUE(qp.PostRecv(&wr, &bad).ok());
  };
  const auto entry_of = [&](uint32_t qpn) -> shm::QpEntry& {
    return device.segment().header()->qps[qpn & ((1u << shm::kQpIndexBits) - 1)];
  };
  auto old_cq = node->device->CreateCq(16);
  ASSERT_TRUE(old_cq.ok());
  auto old_qp = make(old_cq->get());
  post(*old_qp);
  const uint32_t old_qpn = old_qp->qp_num();
  const uint64_t ring_offset = entry_of(old_qpn).recv_ring_offset;
  const uint64_t cq_offset = AsShm(**old_cq).offset();
  const uint32_t old_cq_id = AsShm(**old_cq).id();
  shm::RecvRing* ring = device.segment().At<shm::RecvRing>(ring_offset);
  shm::CqRing* cq_ring = device.segment().At<shm::CqRing>(cq_offset);
  const uint64_t old_head = ring->head.load();
  const uint64_t old_tail = cq_ring->tail.load();
  old_qp.reset();
  old_cq->reset();
  auto new_cq = node->device->CreateCq(16);
  ASSERT_TRUE(new_cq.ok());
  auto new_qp = make(new_cq->get());
  post(*new_qp);
  ASSERT_EQ(entry_of(new_qp->qp_num()).recv_ring_offset, ring_offset) << "not reused";
  ASSERT_EQ(AsShm(**new_cq).offset(), cq_offset) << "not reused";
  ASSERT_NE(new_qp->qp_num(), old_qpn);
  // The stale sender's claim on the head it read fails, whatever it retries with.
  uint64_t stale = old_head;
  EXPECT_FALSE(ring->head.compare_exchange_strong(stale, old_head + 1));
  EXPECT_FALSE(cq_ring->tail.load() == old_tail) << "tickets start over where old ones were";
  shm::RecvEntry taken;
  EXPECT_EQ(shm::PopReceive(ring, 8, old_qpn, &taken), shm::Pop::kGone);
  Completion c;
  EXPECT_FALSE(shm::PushCompletion(cq_ring, 16, old_cq_id, c, 0));
  // Its own QP and CQ work as before.
  EXPECT_EQ(shm::PopReceive(ring, 8, new_qp->qp_num(), &taken), shm::Pop::kTaken);
  EXPECT_TRUE(shm::PushCompletion(cq_ring, 16, AsShm(**new_cq).id(), c, 0));
  Completion got[2];
  EXPECT_EQ((*new_cq)->Poll(absl::MakeSpan(got)), 1u);
}

}  // namespace
// ---------------------------------------------------------------- connections
// A connected QP accepts only the QP it is connected to (as a NIC checks a packet against its
// connection): a third QP that connects itself to it, knowing its number and an rkey, reaches
// nothing. RC: the sender's WR fails (no such connection, as a NIC's retries run out); UC: the
// message is lost.
TEST(ShmConnections, AQpAcceptsOnlyThePeerItIsConnectedTo) {
  for (const QpType type : {QpType::kRc, QpType::kUc}) {
    SCOPED_TRACE(ToString(type));
    auto a = MakeNode("shm");
    auto b = MakeNode("shm");
    auto c = MakeNode("shm");
    ASSERT_TRUE(a && b && c);
    auto qa = MakeQp(*a, type);
    auto qb = MakeQp(*b, type);
    ConnectPair(*qa, *qb);
    auto intruder = MakeQp(*c, type);
    ConnectConfig to_b;
    to_b.remote = qb->endpoint();
    ASSERT_TRUE(intruder->Connect(to_b).ok());  // one-sided: qb is not connected to it
    auto write = [&](Node& from, QueuePair& qp, const char* bytes) {
      std::memcpy(from.bytes(), bytes, 8);
      Sge sge = from.sge(0, 8);
      SendWr wr;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = Opcode::kWrite;
      wr.flags = kSignaled;
      wr.remote_addr = b->addr(64);
      wr.rkey = b->mr->rkey();
      EXPECT_TRUE(Post(qp, wr).ok());
      std::vector<Completion> done = PollN(*from.send_cq, 1);
      EXPECT_EQ(done.size(), 1u);
      return done.empty() ? CompletionStatus::kOtherError : done[0].status;
    };
    ASSERT_EQ(write(*a, *qa, "from a.."), CompletionStatus::kSuccess);
    EXPECT_EQ(std::memcmp(b->bytes() + 64, "from a..", 8), 0);
    const CompletionStatus s = write(*c, *intruder, "intruder");
    if (type == QpType::kRc) {
      EXPECT_EQ(s, CompletionStatus::kRetryExceeded) << ToString(s);
    }
    EXPECT_EQ(std::memcmp(b->bytes() + 64, "from a..", 8), 0) << "the intruder's WRITE landed";
  }
}

// Every QP and address handle of a device that talks to one peer device shares one mapping of
// the peer's segment: each used to map it (and each of its regions it reached) on its own,
// several times per herd session on both sides, and unmapping them was most of a departure.
TEST(ShmPeers, EveryQpAndAddressHandleToOnePeerSharesOneMapping) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer builds map a peer per QP and AH (ShmDevice::PeerAt)";
#endif
  auto a = MakeNode("shm");
  auto b = MakeNode("shm");
  ASSERT_TRUE(a && b);
  const int b_segment = dynamic_cast<shm::ShmDevice&>(*b->device).segment().header()->fd;
  ASSERT_EQ(MappingsOf(b_segment), 1) << "b's own mapping";
  std::vector<std::unique_ptr<QueuePair>> qps;
  for (int i = 0; i < 4; ++i) {
    qps.push_back(MakeQp(*a, QpType::kUc));
    qps.push_back(MakeQp(*b, QpType::kUc));
    ConnectPair(*qps[qps.size() - 2], *qps.back());
  }
  std::vector<std::unique_ptr<AddressHandle>> ahs;
  for (int i = 0; i < 2; ++i) {
    auto ah = a->pd->CreateAddressHandle(AddressInfo{0, b->device->port().gid});
    ASSERT_TRUE(ah.ok()) << ah.status();
    ahs.push_back(*std::move(ah));
  }
  EXPECT_EQ(MappingsOf(b_segment), 2) << "b's own mapping and a's one for all its QPs and AHs";
  qps.clear();
  ahs.clear();
  EXPECT_EQ(MappingsOf(b_segment), 1) << "a's mapping goes with the last QP or AH using it";
}

// A peer is known by its segment file, not by the pid and descriptor number in its address: a
// device opened after another closed gets the same address in this process (its memfd takes the
// freed descriptor number) while a QP to the old one still holds the old mapping. An address
// handle to the new device must reach it, not the old one's segment.
TEST(ShmPeers, ANewDeviceAtADepartedOnesAddressIsANewPeer) {
  auto a = MakeNode("shm");
  ASSERT_NE(a, nullptr);
  auto b = MakeNode("shm");
  ASSERT_NE(b, nullptr);
  const Gid b_address = b->device->port().gid;
  auto to_b = MakeQp(*a, QpType::kUc);
  {
    auto from_a = MakeQp(*b, QpType::kUc);
    ConnectPair(*to_b, *from_a);
  }
  b.reset();  // to_b still maps b's segment
  auto c = MakeNode("shm");
  ASSERT_NE(c, nullptr);
  if (c->device->port().gid != b_address) {
    GTEST_SKIP() << "the new device did not get the departed one's descriptor number";
  }
  auto sender = MakeQp(*a, QpType::kUd);
  auto receiver = MakeQp(*c, QpType::kUd);
  for (QueuePair* qp : {sender.get(), receiver.get()}) ASSERT_TRUE(qp->Connect({}).ok());
  ASSERT_TRUE(PostRecv(*receiver, *c, 7, 0, 256).ok());
  auto ah = a->pd->CreateAddressHandle(AddressInfo{0, c->device->port().gid});
  ASSERT_TRUE(ah.ok()) << ah.status();
  std::memcpy(a->bytes(), "to the new device", 17);
  ASSERT_EQ(SendUd(*sender, *a->send_cq, a->sge(0, 17), ah->get(), receiver->qp_num()),
            CompletionStatus::kSuccess);
  const std::vector<Completion> got = PollN(*c->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u) << "the SEND went to the departed device's segment";
  EXPECT_EQ(got[0].status, CompletionStatus::kSuccess);
}

// A UD sender on node a, a UD receiver on node b, and the sender's address handle to b: for the
// tests of how a sender maps the regions of b it delivers into.
class ShmPeerRegions : public ::testing::Test {
 protected:
  void SetUp() override {
    a = MakeNode("shm");
    b = MakeNode("shm");
    ASSERT_TRUE(a && b);
    sender = MakeQp(*a, QpType::kUd);
    receiver = MakeQp(*b, QpType::kUd);
    for (QueuePair* qp : {sender.get(), receiver.get()}) ASSERT_TRUE(qp->Connect({}).ok());
    auto to_b = a->pd->CreateAddressHandle(AddressInfo{0, b->device->port().gid});
    ASSERT_TRUE(to_b.ok()) << to_b.status();
    ah = *std::move(to_b);
  }
  // Sends the first `bytes` of a's memory to the receiver; its send completion's status.
  CompletionStatus Send(uint32_t bytes) {
    return SendUd(*sender, *a->send_cq, a->sge(0, bytes), ah.get(), receiver->qp_num());
  }
  // b's region's entry in b's own segment: what a hostile b may rewrite.
  shm::MrEntry& BsEntry() {
    return dynamic_cast<shm::ShmDevice&>(*b->device)
        .segment()
        .header()
        ->mrs[b->mr->lkey() >> shm::kMrIndexShift];
  }
  // Makes b's region name, as its backing file, a memfd of the region's size that is not sealed
  // against shrinking (what a hostile b may write in its own entry), mapped here as `unsealed`;
  // the fd is unsealed_fd.
  void BackBsRegionWithAnUnsealedFile() {
    unsealed_fd = memfd_create("unsealed", MFD_CLOEXEC);
    ASSERT_GE(unsealed_fd, 0);
    ASSERT_EQ(ftruncate(unsealed_fd, static_cast<off_t>(b->memory->size())), 0);
    void* mapped =
        mmap(nullptr, b->memory->size(), PROT_READ | PROT_WRITE, MAP_SHARED, unsealed_fd, 0);
    ASSERT_NE(mapped, MAP_FAILED);
    unsealed = static_cast<uint8_t*>(mapped);
    shm::MrEntry& entry = BsEntry();
    ASSERT_EQ(entry.extent_count, 1u);
    std::atomic_ref<int32_t>(entry.extents[0].fd).store(unsealed_fd, std::memory_order_relaxed);
  }
  void TearDown() override {
    if (unsealed != nullptr) munmap(unsealed, b->memory->size());
    if (unsealed_fd >= 0) close(unsealed_fd);
  }
  std::unique_ptr<Node> a, b;
  std::unique_ptr<QueuePair> sender, receiver;
  std::unique_ptr<AddressHandle> ah;
  int unsealed_fd = -1;
  uint8_t* unsealed = nullptr;
};

// A region key's generation is 8 bits: register and deregister at one index often enough and a
// new region gets an old one's key. A sender that mapped the old region must not take its
// mapping for the new one (the bytes would land in memory no longer registered, and the new
// region would never get them): a mapping is of one registration, not of a key.
TEST_F(ShmPeerRegions, ARegionWhoseKeyComesRoundAgainIsNotTakenForTheOldOne) {
  constexpr uint32_t kBytes = 4096;
  auto receive_into = [&](const SharedMemory& memory, uint32_t lkey) {
    Sge sge{reinterpret_cast<uint64_t>(memory.data()), kBytes, lkey};
    RecvWr wr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    RecvWr* bad = nullptr;
    return receiver->PostRecv(&wr, &bad);
  };
  auto send = [&](const char* text) {
    std::memcpy(a->bytes(), text, std::strlen(text));
    EXPECT_EQ(Send(std::strlen(text)), CompletionStatus::kSuccess);
    return PollN(*b->recv_cq, 1);
  };
  // The old region: the sender maps it with its first message there.
  SharedMemory old_memory = *SharedMemory::Allocate(kBytes);
  auto old_mr = b->pd->RegisterMemory(old_memory.data(), kBytes, kAllAccess);
  ASSERT_TRUE(old_mr.ok()) << old_mr.status();
  const uint32_t key = (*old_mr)->lkey();
  ASSERT_TRUE(receive_into(old_memory, key).ok());
  ASSERT_EQ(send("to the old region").size(), 1u);
  ASSERT_EQ(std::memcmp(old_memory.data() + kGrhBytes, "to the old region", 17), 0);
  old_mr->reset();
  // A new region at the same index, registered again until it gets the old key.
  SharedMemory new_memory = *SharedMemory::Allocate(kBytes);
  std::unique_ptr<MemoryRegion> new_mr;
  for (int i = 0; i < 4096 && (new_mr == nullptr || new_mr->lkey() != key); ++i) {
    new_mr.reset();
    auto mr = b->pd->RegisterMemory(new_memory.data(), kBytes, kAllAccess);
    ASSERT_TRUE(mr.ok()) << mr.status();
    new_mr = *std::move(mr);
  }
  ASSERT_EQ(new_mr->lkey(), key) << "the key never came round";
  ASSERT_TRUE(receive_into(new_memory, key).ok());
  const std::vector<Completion> got = send("to the new region");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, CompletionStatus::kSuccess);
  EXPECT_EQ(std::memcmp(new_memory.data() + kGrhBytes, "to the new region", 17), 0)
      << "the bytes went elsewhere";
  EXPECT_EQ(std::memcmp(old_memory.data() + kGrhBytes, "to the old region", 17), 0)
      << "the deregistered region was written";
}

// A peer that rewrites its region's entry again and again (here its registration number, as a
// re-registration at the same index would) makes each access map the region anew, and every
// mapping is kept while the peer lives (a replaced one may still be in another thread's hands).
// Past Peer::kMaxReplacedMappings no more replacements are made for that peer: its receive fails
// (the receiver goes to ERR), and this process holds no more mappings of its file.
TEST_F(ShmPeerRegions, APeerThatReplacesItsRegionsWithoutEndIsRefusedMoreMappings) {
  shm::MrEntry& entry = BsEntry();
  const int before = MappingsOf(b->memory->fd());
  constexpr uint64_t kPast = 10;
  uint64_t delivered = 0;
  CompletionStatus last = CompletionStatus::kSuccess;
  for (uint64_t i = 0; i <= shm::Peer::kMaxReplacedMappings + kPast; ++i) {
    if (i > 0) entry.registration.fetch_add(1);  // what the hostile peer writes
    ASSERT_TRUE(PostRecv(*receiver, *b, i, 0, 256).ok());
    ASSERT_EQ(Send(8), CompletionStatus::kSuccess);
    const std::vector<Completion> got = PollN(*b->recv_cq, 1);
    ASSERT_EQ(got.size(), 1u);
    last = got[0].status;
    if (last != CompletionStatus::kSuccess) break;
    ++delivered;
  }
  // The first mapping and kMaxReplacedMappings in place of it; then none.
  EXPECT_EQ(delivered, shm::Peer::kMaxReplacedMappings + 1);
  EXPECT_EQ(last, CompletionStatus::kLocalProtectionError);
  EXPECT_EQ(MappingsOf(b->memory->fd()) - before,
            static_cast<int>(shm::Peer::kMaxReplacedMappings + 1));
}

// A region's backing file is the peer's to choose. One its owner can shrink (any file but a memfd
// sealed against shrinking) it can truncate under the sender's mapping, and the sender's next
// touch past the new end is a SIGBUS: a hostile client's ftruncate would kill the server that
// answers it. Such a region is never mapped: the receive naming it fails as a bad key's would,
// and the sender holds no mapping of the file.
TEST_F(ShmPeerRegions, ARegionInAFileItsOwnerCouldShrinkIsNeverMapped) {
  BackBsRegionWithAnUnsealedFile();
  ASSERT_TRUE(PostRecv(*receiver, *b, 1, 0, 256).ok());
  std::memcpy(a->bytes(), "unsealed", 8);
  ASSERT_EQ(Send(8), CompletionStatus::kSuccess);
  const std::vector<Completion> got = PollN(*b->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, CompletionStatus::kLocalProtectionError)
      << "the sender mapped a file its owner can truncate under it";
  EXPECT_EQ(MappingsOf(unsealed_fd), 1) << "the test's own mapping, and another";
  EXPECT_NE(std::memcmp(unsealed + kGrhBytes, "unsealed", 8), 0);
}

// A device opened with DeviceOptions::shm_map_unsealed_regions maps such a file: a client that
// reaches its server's pool on disk (rmem, hopscotch) trusts that server not to truncate it.
TEST_F(ShmPeerRegions, ADeviceThatTrustsItsPeersMapsTheirUnsealedFiles) {
  BackBsRegionWithAnUnsealedFile();
  DeviceOptions options;
  options.fabric = "test";
  options.shm_map_unsealed_regions = true;
  std::unique_ptr<Node> trusting = MakeNodeOn(options);
  ASSERT_TRUE(trusting);
  std::unique_ptr<QueuePair> qp = MakeQp(*trusting, QpType::kUd);
  ASSERT_TRUE(qp->Connect({}).ok());
  auto to_b = trusting->pd->CreateAddressHandle(AddressInfo{0, b->device->port().gid});
  ASSERT_TRUE(to_b.ok()) << to_b.status();
  ASSERT_TRUE(PostRecv(*receiver, *b, 1, 0, 256).ok());
  std::memcpy(trusting->bytes(), "trusting", 8);
  ASSERT_EQ(SendUd(*qp, *trusting->send_cq, trusting->sge(0, 8), to_b->get(), receiver->qp_num()),
            CompletionStatus::kSuccess);
  const std::vector<Completion> got = PollN(*b->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, CompletionStatus::kSuccess);
  EXPECT_EQ(std::memcmp(unsealed + kGrhBytes, "trusting", 8), 0);
}

// The same for a region's backing file: one that is no memfd is refused unopened (the receive
// naming it fails as a bad key's would).
TEST_F(ShmPeerRegions, ARegionInAFileThatIsNoMemfdIsRefusedUnopened) {
  DiskFile file(b->memory->size());
  ASSERT_TRUE(file.ok());
  shm::MrEntry& entry = BsEntry();
  std::atomic_ref<int32_t>(entry.extents[0].fd).store(file.fd(), std::memory_order_relaxed);
  ASSERT_TRUE(PostRecv(*receiver, *b, 1, 0, 256).ok());
  ASSERT_EQ(Send(8), CompletionStatus::kSuccess);
  const std::vector<Completion> got = PollN(*b->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, CompletionStatus::kLocalProtectionError);
  EXPECT_EQ(file.opens(), 0u) << "the sender opened a file a peer named before knowing what it is";
}

// A region that cannot be mapped is tried again at each access: an O_PATH open, a statx, an open
// and a look at its seals, under the peer's mapping lock. A peer whose regions keep failing
// (here a file that is no sealed memfd, WRITTEN to over UC, which drops what fails and stays
// usable) stops being tried after Peer::kMaxFailedMappings: its file is opened that many times,
// then never again.
TEST_F(ShmPeerRegions, APeerWhoseRegionsKeepFailingIsNoLongerTried) {
  BackBsRegionWithAnUnsealedFile();
  const OpenWatch watch("/proc/self/fd/" + std::to_string(unsealed_fd));
  ASSERT_TRUE(watch.ok());
  std::unique_ptr<QueuePair> writer = MakeQp(*a, QpType::kUc);
  std::unique_ptr<QueuePair> target = MakeQp(*b, QpType::kUc);
  ConnectPair(*writer, *target);
  constexpr uint64_t kPast = 10;
  uint64_t opens = 0;
  for (uint64_t i = 0; i < shm::Peer::kMaxFailedMappings + kPast; ++i) {
    // UC: what fails is dropped; the WRITE completes.
    ASSERT_EQ(WriteAndWait(*writer, *a->send_cq, a->sge(0, 8), b->addr(), b->mr->rkey()),
              CompletionStatus::kSuccess);
    opens += watch.opens();  // read each time: inotify merges an event with an unread twin
  }
  EXPECT_EQ(opens, shm::Peer::kMaxFailedMappings);
  EXPECT_EQ(writer->counters().dropped.Get(), shm::Peer::kMaxFailedMappings + kPast);
}

// A region's file is found by a descriptor of it this process holds (/proc/self/fd), which may be
// one another thread opened for a moment (a same-process peer mapping the file opens it) and
// closes right after. The registration holds a descriptor of its own: the region stays mappable
// whatever becomes of the one it was found by.
TEST_F(ShmPeerRegions, ARegionStaysMappableAfterTheDescriptorItWasFoundByCloses) {
  constexpr uint32_t kBytes = 4096;
  // A second descriptor of the memory's file, at a lower number than its own: found first.
  const int transient = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(transient, 0);
  SharedMemory memory = *SharedMemory::Allocate(kBytes);
  ASSERT_LT(transient, memory.fd());
  ASSERT_EQ(dup3(memory.fd(), transient, O_CLOEXEC), transient);
  auto mr = b->pd->RegisterMemory(memory.data(), kBytes, kAllAccess);
  ASSERT_TRUE(mr.ok()) << mr.status();
  close(transient);
  // The sender maps the region with its first message there.
  Sge sge{reinterpret_cast<uint64_t>(memory.data()), kBytes, (*mr)->lkey()};
  RecvWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  RecvWr* bad = nullptr;
  ASSERT_TRUE(receiver->PostRecv(&wr, &bad).ok());
  std::memcpy(a->bytes(), "held", 4);
  ASSERT_EQ(Send(4), CompletionStatus::kSuccess);
  const std::vector<Completion> got = PollN(*b->recv_cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, CompletionStatus::kSuccess)
      << "the region named a descriptor that was closed";
  EXPECT_EQ(std::memcmp(memory.data() + kGrhBytes, "held", 4), 0);
}

}  // namespace transport::testing
