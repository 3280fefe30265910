// transport/types.h: ResetSendWr gives back exactly a fresh SendWr, whatever the WR held (a WR
// array reused post after post must not carry a field of the last post into the next).
#include "transport/types.h"

#include <cstring>

#include "gtest/gtest.h"

namespace transport {
namespace {

TEST(SendWrTest, ResetGivesBackAFreshWrWhateverItHeld) {
  const SendWr fresh{};
  SendWr wr;
  std::memset(static_cast<void*>(&wr), 0xa5, sizeof(wr));  // every field set to garbage
  ResetSendWr(wr);
  EXPECT_EQ(wr.wr_id, fresh.wr_id);
  EXPECT_EQ(wr.next, fresh.next);
  EXPECT_EQ(wr.sg_list, fresh.sg_list);
  EXPECT_EQ(wr.num_sge, fresh.num_sge);
  EXPECT_EQ(wr.opcode, fresh.opcode);
  EXPECT_EQ(wr.flags, fresh.flags);
  EXPECT_EQ(wr.imm_data, fresh.imm_data);
  EXPECT_EQ(wr.remote_addr, fresh.remote_addr);
  EXPECT_EQ(wr.rkey, fresh.rkey);
  EXPECT_EQ(wr.compare_add, fresh.compare_add);
  EXPECT_EQ(wr.swap, fresh.swap);
  EXPECT_EQ(wr.ah, fresh.ah);
  EXPECT_EQ(wr.remote_qpn, fresh.remote_qpn);
  EXPECT_EQ(wr.remote_qkey, fresh.remote_qkey);
}

}  // namespace
}  // namespace transport
