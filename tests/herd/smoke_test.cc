#include "tests/herd/server_fixture.h"

namespace herd::testing {
namespace {

TEST(Smoke, PutGetDeleteCas) {
  ServerProcess server(SmallServer("smoke"));
  ASSERT_TRUE(server.ok());
  auto client = Join(server, "smoke");
  ASSERT_NE(client, nullptr);
  auto v1 = client->Put("hello", "world");
  ASSERT_TRUE(v1.ok()) << v1.status();
  auto got = client->Get("hello");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value, "world");
  EXPECT_EQ(got->version, *v1);
}

}  // namespace
}  // namespace herd::testing
