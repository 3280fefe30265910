// Helpers for the transport conformance suite: one "node" = device + PD + CQs + registered
// shared memory, and QP pairs wired between nodes.
#ifndef HERD_TESTS_TRANSPORT_FABRIC_FIXTURE_H_
#define HERD_TESTS_TRANSPORT_FABRIC_FIXTURE_H_

#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

namespace transport::testing {

inline constexpr size_t kNodeMemoryBytes = 1 << 16;
inline constexpr uint32_t kAllAccess = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;

struct Node {
  std::unique_ptr<Device> device;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> send_cq;
  std::unique_ptr<CompletionQueue> recv_cq;
  std::unique_ptr<SharedMemory> memory;
  std::unique_ptr<MemoryRegion> mr;

  uint8_t* bytes() const { return memory->data(); }
  uint64_t addr(size_t offset = 0) const { return reinterpret_cast<uint64_t>(bytes() + offset); }
  Sge sge(size_t offset, uint32_t length) const { return Sge{addr(offset), length, mr->lkey()}; }
};

// The backends the suite runs on: "shm" (synchronous: WRs execute inside PostSend),
// "shm_async" (the same fabric with a progress thread: WRs execute after PostSend returns, as on
// a NIC) and "verbs".
inline bool IsShmBackend(const std::string& backend) {
  return backend == "shm" || backend == "shm_async";
}

// The device a backend name stands for: "shm" for both shm modes; "verbs" the device named by
// the HERD_VERBS_DEVICE environment variable, else the first verbs device here ("" when none).
inline std::string DeviceFor(const std::string& backend) {
  if (IsShmBackend(backend)) return "shm";
  if (const char* named = std::getenv("HERD_VERBS_DEVICE"); named != nullptr) return named;
  for (const std::string& name : ListDevices()) {
    if (name != "shm") return name;
  }
  return "";
}

// Opens a node on the device `options` name: its PD, two CQs and kNodeMemoryBytes of registered
// memory; nullptr (a failed expectation) when the device does not open.
inline std::unique_ptr<Node> MakeNodeOn(const DeviceOptions& options,
                                        uint32_t access = kAllAccess) {
  auto device = OpenDevice(options);
  EXPECT_TRUE(device.ok()) << device.status();
  if (!device.ok()) return nullptr;
  auto node = std::make_unique<Node>();
  node->device = *std::move(device);
  node->pd = *node->device->AllocatePd();
  node->send_cq = *node->device->CreateCq(256);
  node->recv_cq = *node->device->CreateCq(256);
  node->memory = std::make_unique<SharedMemory>(*SharedMemory::Allocate(kNodeMemoryBytes));
  auto mr = node->pd->RegisterMemory(node->memory->data(), node->memory->size(), access);
  EXPECT_TRUE(mr.ok()) << mr.status();
  node->mr = *std::move(mr);
  return node;
}

// Opens a node on `backend` (see IsShmBackend); nullptr when the backend has no device here (the
// caller skips). A verbs device that exists but fails to open fails the test.
inline std::unique_ptr<Node> MakeNode(const std::string& backend, uint32_t access = kAllAccess,
                                      uint32_t mtu = 4096, const std::string& fabric = "test",
                                      const FaultOptions& faults = {}) {
  DeviceOptions options;
  options.faults = faults;
  options.name = DeviceFor(backend);
  if (options.name.empty()) return nullptr;
  options.fabric = fabric;
  options.mtu = mtu;
  options.shm_async = backend == "shm_async";
  return MakeNodeOn(options, access);
}

inline std::unique_ptr<QueuePair> MakeQp(Node& node, QpType type, uint32_t max_send_wr = 64) {
  QpConfig config;
  config.type = type;
  config.send_cq = node.send_cq.get();
  config.recv_cq = node.recv_cq.get();
  config.max_send_wr = max_send_wr;
  config.max_send_sge = 2;
  auto qp = node.pd->CreateQp(config);
  EXPECT_TRUE(qp.ok()) << qp.status();
  return *std::move(qp);
}

inline void ConnectPair(QueuePair& a, QueuePair& b, uint8_t rnr_retry = 7) {
  ConnectConfig to_b;
  to_b.remote = b.endpoint();
  to_b.rnr_retry = rnr_retry;
  to_b.min_rnr_timer_us = 100;
  ConnectConfig to_a = to_b;
  to_a.remote = a.endpoint();
  ASSERT_TRUE(a.Connect(to_b).ok());
  ASSERT_TRUE(b.Connect(to_a).ok());
}

// How long a test waits for a completion that must come. Generous: ASan, a loaded 2-core CI
// machine or Soft-RoCE under qemu TCG can be thousands of times slower than a NIC.
inline constexpr absl::Duration kCompletionDeadline = absl::Seconds(20);
// How long a polling loop that waits for something that MUST come gives up one round of
// PollN (it loops until its own deadline). Never used to prove that nothing comes: that is
// shown by something provably later arriving first (PollThrough).
inline constexpr absl::Duration kQuietPeriod = absl::Milliseconds(50);

// Polls until n completions arrived or `deadline` passed; returns what arrived.
inline std::vector<Completion> PollN(CompletionQueue& cq, size_t n,
                                     absl::Duration deadline = kCompletionDeadline) {
  std::vector<Completion> got;
  Completion buffer[16];
  const absl::Time give_up = absl::Now() + deadline;
  while (got.size() < n) {
    const size_t k = cq.Poll(absl::MakeSpan(buffer, 16));
    got.insert(got.end(), buffer, buffer + k);
    if (k == 0 && absl::Now() > give_up) break;
  }
  return got;
}

// Polls until the completion of WR `wr_id` arrived (or the deadline passed); returns every
// completion polled, that one last. How a test shows that something did NOT complete: post a
// later WR whose completion must come after it, and see that nothing came before.
inline std::vector<Completion> PollThrough(CompletionQueue& cq, uint64_t wr_id) {
  std::vector<Completion> got;
  Completion one[1];
  const absl::Time give_up = absl::Now() + kCompletionDeadline;
  while (got.empty() || got.back().wr_id != wr_id) {
    if (cq.Poll(absl::MakeSpan(one, 1)) == 1) {
      got.push_back(one[0]);
    } else if (absl::Now() > give_up) {
      break;
    }
  }
  return got;
}

inline absl::Status Post(QueuePair& qp, SendWr& wr) {
  SendWr* bad = nullptr;
  return qp.PostSend(&wr, &bad);
}

// Sends `sge` by UD to QP `qpn` through `ah` (the default qkey), signalled, and waits for its
// completion: its status, or kFlushed when the post failed or nothing completed in time.
inline CompletionStatus SendUd(QueuePair& qp, CompletionQueue& send_cq, Sge sge, AddressHandle* ah,
                               uint32_t qpn) {
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.ah = ah;
  wr.remote_qpn = qpn;
  wr.remote_qkey = ConnectConfig{}.qkey;
  wr.flags = kSignaled;
  if (!Post(qp, wr).ok()) return CompletionStatus::kFlushed;
  const std::vector<Completion> sent = PollN(send_cq, 1);
  return sent.size() == 1 ? sent[0].status : CompletionStatus::kFlushed;
}

// WRITEs `sge` to [remote_addr, ...) under `rkey`, signalled, and waits for its completion: its
// status, or kFlushed when the post failed or nothing completed in time.
inline CompletionStatus WriteAndWait(QueuePair& qp, CompletionQueue& send_cq, Sge sge,
                                     uint64_t remote_addr, uint32_t rkey) {
  SendWr wr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = Opcode::kWrite;
  wr.flags = kSignaled;
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  if (!Post(qp, wr).ok()) return CompletionStatus::kFlushed;
  const std::vector<Completion> done = PollN(send_cq, 1);
  return done.size() == 1 ? done[0].status : CompletionStatus::kFlushed;
}

inline absl::Status PostRecv(QueuePair& qp, Node& node, uint64_t wr_id, size_t offset,
                             uint32_t length) {
  Sge sge = node.sge(offset, length);
  RecvWr wr;
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  RecvWr* bad = nullptr;
  return qp.PostRecv(&wr, &bad);
}

// How many mappings of `fd`'s file this process holds (/proc/self/maps lines with its inode).
inline int MappingsOf(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -1;
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, device;
    uint64_t inode = 0;
    fields >> range >> perms >> offset >> device >> inode;
    if (inode == st.st_ino) ++count;
  }
  return count;
}

}  // namespace transport::testing

#endif  // HERD_TESTS_TRANSPORT_FABRIC_FIXTURE_H_
