#include "absl/status/status.h"
#include "gtest/gtest.h"
TEST(Smoke, Works) { EXPECT_TRUE(absl::OkStatus().ok()); }
