// SlotScanner's rules: which slots it visits, in what order, and when it clears a marker.
#include "herd/slot_scanner.h"

#include <cstring>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace herd {
namespace {

constexpr uint32_t kClients = 8;
constexpr uint32_t kWindow = 4;
constexpr uint32_t kSlotBytes = 64;
// [client][worker][window] with two workers: this poller's run is every other block.
constexpr uint64_t kClientStride = 2 * uint64_t{kWindow} * kSlotBytes;

class SlotScannerTest : public ::testing::Test {
 protected:
  SlotScannerTest()
      : region_(kClients * kClientStride),
        scanner_(SlotLayout{region_.data(), kClients, kWindow, kSlotBytes, kClientStride}) {}

  void Mark(uint32_t client, uint32_t slot, uint64_t marker) {
    std::memcpy(SlotEnd(client, slot) - sizeof(marker), &marker, sizeof(marker));
  }
  uint64_t Marker(uint32_t client, uint32_t slot) {
    uint64_t marker;
    std::memcpy(&marker, SlotEnd(client, slot) - sizeof(marker), sizeof(marker));
    return marker;
  }
  uint8_t* SlotEnd(uint32_t client, uint32_t slot) {
    return region_.data() + client * kClientStride + (slot + 1) * kSlotBytes;
  }
  // One full pass: the (client, slot) pairs visited, consuming each.
  std::vector<std::pair<uint32_t, uint32_t>> Pass(SlotAction action = SlotAction::kConsume) {
    std::vector<std::pair<uint32_t, uint32_t>> seen;
    scanner_.Scan(
        [&](uint32_t client, uint32_t slot, const uint8_t* start, uint64_t marker) {
          EXPECT_EQ(start + kSlotBytes, SlotEnd(client, slot));
          EXPECT_EQ(marker, Marker(client, slot));
          seen.emplace_back(client, slot);
          return action;
        },
        [] { return false; });
    return seen;
  }

  std::vector<uint8_t> region_;
  SlotScanner scanner_;
};

TEST_F(SlotScannerTest, VisitsEveryMarkedSlotOfEveryClientByDefaultAndConsumesIt) {
  Mark(0, 1, 5);
  Mark(7, 3, 9);
  Mark(3, 0, 1);
  const auto seen = Pass();
  EXPECT_EQ(seen, (std::vector<std::pair<uint32_t, uint32_t>>{{0, 1}, {3, 0}, {7, 3}}));
  EXPECT_EQ(Marker(0, 1), 0u);
  EXPECT_EQ(Marker(7, 3), 0u);
  EXPECT_TRUE(Pass().empty());
}

TEST_F(SlotScannerTest, LeftSlotsKeepTheirMarkerAndComeBackNextPass) {
  Mark(2, 2, 7);
  EXPECT_EQ(Pass(SlotAction::kLeave).size(), 1u);
  EXPECT_EQ(Marker(2, 2), 7u);
  EXPECT_EQ(Pass().size(), 1u);
  EXPECT_EQ(Marker(2, 2), 0u);
}

TEST_F(SlotScannerTest, ScansOnlyTheActiveClients) {
  const std::vector<uint32_t> active = {1, 6};
  scanner_.SetClients(active);
  EXPECT_EQ(scanner_.active_clients(), 2u);
  for (uint32_t c = 0; c < kClients; ++c) Mark(c, 0, 100 + c);
  const auto seen = Pass();
  EXPECT_EQ(seen, (std::vector<std::pair<uint32_t, uint32_t>>{{1, 0}, {6, 0}}));
  // The others' markers are untouched, and found once their clients are active again.
  EXPECT_EQ(Marker(0, 0), 100u);
  scanner_.SetClients(std::vector<uint32_t>{0, 5});
  EXPECT_EQ(Pass(), (std::vector<std::pair<uint32_t, uint32_t>>{{0, 0}, {5, 0}}));
}

TEST_F(SlotScannerTest, NoActiveClientsVisitsNothing) {
  scanner_.SetClients({});
  Mark(0, 0, 1);
  uint32_t visited = 0;
  EXPECT_EQ(scanner_.Scan(
                [&](uint32_t, uint32_t, const uint8_t*, uint64_t) {
                  ++visited;
                  return SlotAction::kConsume;
                },
                [] { return false; }),
            0u);
  EXPECT_EQ(visited, 0u);
}

TEST_F(SlotScannerTest, ResumesWhereItStoppedAndIsFairAcrossClients) {
  for (uint32_t c = 0; c < kClients; ++c) Mark(c, 0, 1);
  // Take one request per scan: the cursor moves on, so every client is served in turn.
  std::vector<uint32_t> order;
  for (uint32_t i = 0; i < kClients; ++i) {
    bool took = false;
    scanner_.Scan(
        [&](uint32_t client, uint32_t, const uint8_t*, uint64_t) {
          order.push_back(client);
          took = true;
          return SlotAction::kConsume;
        },
        [&] { return took; });
    Mark(order.back(), 0, 1);  // that client at once sends again
  }
  EXPECT_EQ(order, (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST_F(SlotScannerTest, ShrinkingTheClientListPastTheCursorRestartsIt) {
  Mark(7, 1, 1);
  bool took = false;
  scanner_.Scan(
      [&](uint32_t, uint32_t, const uint8_t*, uint64_t) {
        took = true;
        return SlotAction::kConsume;
      },
      [&] { return took; });  // the cursor now sits at client 7, slot 2
  scanner_.SetClients(std::vector<uint32_t>{3});
  Mark(3, 0, 1);
  EXPECT_EQ(Pass(), (std::vector<std::pair<uint32_t, uint32_t>>{{3, 0}}));
}

}  // namespace
}  // namespace herd
