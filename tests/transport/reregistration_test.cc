// A region re-registered while a peer maps it, on the shm fabric: the owner's thread registers
// one buffer over and over (two registrations standing at a time, so each table index is
// rewritten every other round under a new registration number), while another thread WRITEs to
// it over UC with whichever key is current, mapping each registration as it reaches it. The
// entry is a sequence lock (the owner stores the registration number, a release fence, the
// fields, then the key; a mapper keeps what it read only if number and key are unchanged after
// an acquire fence): each registration must be mapped exactly once, and each from its own fields.
// (ThreadSanitizer cannot check the lock itself here: a peer maps the owner's segment at another
// address than the owner's own mapping, so the two sides' accesses never meet in its shadow
// memory, as they never would between two processes.)
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tests/transport/fabric_fixture.h"
#include "transport/shm/shm_internal.h"

namespace transport::testing {
namespace {

constexpr uint32_t kBytes = 4096;
// Registrations the owner makes, each mapped anew by the writer when it reaches it. Below
// Peer::kMaxReplacedMappings, past which the writer would be refused further mappings.
constexpr uint32_t kRegistrations = 400;
static_assert(kRegistrations < shm::Peer::kMaxReplacedMappings);
constexpr uint32_t kRegionAccess = kLocalWrite | kRemoteWrite;

TEST(ShmReregistration, AWriterMapsEachRegistrationOnceWhileItsOwnerRegistersAgain) {
  std::unique_ptr<Node> a = MakeNode("shm");
  std::unique_ptr<Node> b = MakeNode("shm");
  ASSERT_TRUE(a && b);
  std::unique_ptr<QueuePair> writer = MakeQp(*a, QpType::kUc);
  std::unique_ptr<QueuePair> owner_qp = MakeQp(*b, QpType::kUc);
  ConnectPair(*writer, *owner_qp);
  SharedMemory target = *SharedMemory::Allocate(kBytes);

  // The owner's rkey of the moment (0: none yet), the key the writer last posted a WRITE with
  // (the owner waits for the writer to reach each registration before it makes the next), and
  // whether either side stopped.
  std::atomic<uint32_t> current_rkey{0};
  std::atomic<uint32_t> tried{0};
  std::atomic<bool> owner_done{false};
  std::atomic<bool> writer_stopped{false};
  // Two registrations stand at a time, each new one at the index the one before last held: the
  // writer maps one index while the owner rewrites the other, and every index it mapped is
  // rewritten two rounds on. The last stays registered until the writer has stopped (it may
  // still be writing with its key when the owner finishes).
  std::unique_ptr<MemoryRegion> standing;
  std::thread owner([&] {
    for (uint32_t i = 0; i < kRegistrations && !writer_stopped.load(); ++i) {
      auto mr = b->pd->RegisterMemory(target.data(), kBytes, kRegionAccess);
      if (!mr.ok()) {
        ADD_FAILURE() << mr.status();
        break;
      }
      const uint32_t rkey = (*mr)->rkey();
      current_rkey.store(rkey, std::memory_order_release);
      while (tried.load(std::memory_order_relaxed) != rkey && !writer_stopped.load()) {
      }
      standing = *std::move(mr);
    }
    owner_done.store(true, std::memory_order_release);
  });

  // WRITEs of a counter, each with the key current when it is posted, each completed before the
  // next.
  auto write = [&](uint64_t word, uint32_t rkey, uint64_t offset) {
    std::memcpy(a->bytes(), &word, sizeof(word));
    return WriteAndWait(*writer, *a->send_cq, a->sge(0, sizeof(word)),
                        reinterpret_cast<uint64_t>(target.data()) + offset,
                        rkey) == CompletionStatus::kSuccess;
  };
  const int mappings_before = MappingsOf(target.fd());
  uint64_t word = 0;
  while (!owner_done.load(std::memory_order_acquire)) {
    const uint32_t rkey = current_rkey.load(std::memory_order_acquire);
    if (rkey == 0) continue;
    // The key is live while it is written with (the owner drops a registration only once the
    // writer has reached the next): every WRITE lands, where it was aimed.
    uint64_t landed = 0;
    if (write(++word, rkey, 0)) std::memcpy(&landed, target.data(), sizeof(landed));
    if (landed != word) {
      ADD_FAILURE() << "WRITE " << word << " with key " << rkey << " did not land";
      writer_stopped.store(true);
      break;
    }
    tried.store(rkey, std::memory_order_relaxed);
  }
  owner.join();
  ASSERT_FALSE(writer_stopped.load());
  // Each registration was mapped once, when the writer first reached it: a mapping is of one
  // registration, and one is never mapped twice.
  EXPECT_EQ(MappingsOf(target.fd()) - mappings_before, static_cast<int>(kRegistrations));

  // A registration made afterwards is mapped from its own fields, not a mix with an earlier
  // one's: a WRITE with its key lands in the buffer, at the address written.
  auto last = b->pd->RegisterMemory(target.data(), kBytes, kRegionAccess);
  ASSERT_TRUE(last.ok()) << last.status();
  constexpr uint64_t kMarker = 0x5eed'f00d'cafe'0001;
  constexpr uint64_t kAt = kBytes - sizeof(kMarker);
  ASSERT_TRUE(write(kMarker, (*last)->rkey(), kAt));
  uint64_t landed = 0;
  std::memcpy(&landed, target.data() + kAt, sizeof(landed));
  EXPECT_EQ(landed, kMarker);
}

}  // namespace
}  // namespace transport::testing
