// SendQueue's accounting on its own: room, signalling, wr_id layout, and which completions it
// applies (its generation only, WRs it posted only), including across the 40-bit wr_id wrap.
#include "herd/send_queue.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace herd {
namespace {

constexpr uint32_t kDepth = 8;
constexpr uint32_t kUnsigBatch = 4;
constexpr uint16_t kTableSlot = 513;
constexpr uint8_t kGeneration = 7;
constexpr uint64_t kWrap = uint64_t{1} << kWrIndexBits;

SendQueue MakeQueue(uint64_t start = 0) {
  SendQueue q;
  q.depth = kDepth;
  q.unsig_batch = kUnsigBatch;
  q.table_slot = kTableSlot;
  q.generation = kGeneration;
  q.posted = start;
  q.retired = start;
  return q;
}

// Posts n WRs (as the worker does: assign, then post).
void Post(SendQueue& q, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    ASSERT_TRUE(q.HasRoom());
    ++q.unposted;
  }
  q.posted += q.unposted;
  q.unposted = 0;
}

TEST(SendQueueTest, HasRoomCountsPostedAndAssigned) {
  SendQueue q = MakeQueue();
  EXPECT_TRUE(q.HasRoom());
  q.unposted = kDepth - 1;
  EXPECT_TRUE(q.HasRoom());
  q.unposted = kDepth;
  EXPECT_FALSE(q.HasRoom());
  q.unposted = 0;
  q.posted = kDepth;
  EXPECT_FALSE(q.HasRoom());
  q.retired = 1;
  EXPECT_TRUE(q.HasRoom());
}

TEST(SendQueueTest, SignalsOneInUnsigBatch) {
  SendQueue q = MakeQueue();
  for (uint64_t i = 0; i < 3 * kUnsigBatch; ++i) {
    EXPECT_EQ(q.Signal(i), i % kUnsigBatch == kUnsigBatch - 1) << i;
  }
  q.unsig_batch = 1;
  EXPECT_TRUE(q.Signal(0));
  EXPECT_TRUE(q.Signal(1));
}

TEST(SendQueueTest, WrIdCarriesSlotGenerationAndLowIndexBits) {
  SendQueue q = MakeQueue();
  const uint64_t index = kWrap + 12345;
  const uint64_t id = q.WrId(index);
  EXPECT_EQ(TableSlotOf(id), kTableSlot);
  EXPECT_EQ(static_cast<uint8_t>(id >> kWrIndexBits), kGeneration);
  EXPECT_EQ(id & kWrIndexMask, 12345u);
}

TEST(SendQueueTest, SignalledCompletionRetiresEverythingBeforeIt) {
  SendQueue q = MakeQueue();
  Post(q, kUnsigBatch * 2);
  EXPECT_FALSE(q.HasRoom());
  q.Complete(q.WrId(kUnsigBatch - 1), true);
  EXPECT_EQ(q.retired, kUnsigBatch);
  EXPECT_TRUE(q.HasRoom());
  // An older completion (out of order) does not move retired back.
  q.Complete(q.WrId(0), true);
  EXPECT_EQ(q.retired, kUnsigBatch);
  q.Complete(q.WrId(2 * kUnsigBatch - 1), true);
  EXPECT_EQ(q.retired, 2 * kUnsigBatch);
  EXPECT_FALSE(q.broken);
}

TEST(SendQueueTest, CompletionOfAnotherGenerationIsIgnored) {
  SendQueue q = MakeQueue();
  Post(q, kUnsigBatch);
  SendQueue old = q;
  old.generation = kGeneration - 1;
  q.Complete(old.WrId(kUnsigBatch - 1), true);
  EXPECT_EQ(q.retired, 0u);
  q.Complete(old.WrId(kUnsigBatch - 1), false);
  EXPECT_FALSE(q.broken) << "an older QP's error says nothing about this one";
}

TEST(SendQueueTest, ErrorCompletionBreaksTheQueue) {
  SendQueue q = MakeQueue();
  Post(q, 2);
  q.Complete(q.WrId(1), false);
  EXPECT_TRUE(q.broken);
}

TEST(SendQueueTest, WrIdOfAWrNeverPostedIsIgnored) {
  SendQueue q = MakeQueue();
  q.Complete(q.WrId(0), true);  // nothing posted yet
  EXPECT_EQ(q.retired, 0u);
  Post(q, 3);
  q.Complete(q.WrId(5), true);  // beyond posted
  EXPECT_EQ(q.retired, 0u);
  q.Complete(q.WrId(kWrIndexMask), true);
  EXPECT_EQ(q.retired, 0u);
  q.Complete(q.WrId(2), true);
  EXPECT_EQ(q.retired, 3u);
}

// Posted and retired start just below 2^40 and run past it: the wr_id's 40 bits wrap, the
// counters do not.
TEST(SendQueueTest, AccountingAcrossTheWrIdWrap) {
  const uint64_t start = kWrap - 5;
  SendQueue q = MakeQueue(start);
  uint64_t next = start;
  for (int round = 0; round < 6; ++round) {
    Post(q, kUnsigBatch);
    next += kUnsigBatch;
    const uint64_t last = next - 1;
    q.Complete(q.WrId(last), true);
    ASSERT_EQ(q.retired, next) << "round " << round << " last index " << last;
    ASSERT_TRUE(q.HasRoom());
  }
  EXPECT_GT(q.posted, kWrap);
  // The queue fills and drains across the wrap, one signalled WR at a time.
  SendQueue full = MakeQueue(kWrap - 3);
  Post(full, kDepth);
  EXPECT_FALSE(full.HasRoom());
  full.Complete(full.WrId(kWrap - 3 + 1), true);  // before the wrap
  EXPECT_EQ(full.retired, kWrap - 1);
  full.Complete(full.WrId(kWrap + 2), true);  // after it: low bits 2
  EXPECT_EQ(full.retired, kWrap + 3);
  full.Complete(full.WrId(kWrap - 2), true);  // late, older: no effect
  EXPECT_EQ(full.retired, kWrap + 3);
  full.Complete(full.WrId(kWrap + 10), true);  // never posted (posted = 2^40 + 5)
  EXPECT_EQ(full.retired, kWrap + 3);
  full.Complete(full.WrId(kWrap + 4), true);
  EXPECT_EQ(full.retired, kWrap + 5);
  EXPECT_FALSE(full.broken);
}

}  // namespace
}  // namespace herd
