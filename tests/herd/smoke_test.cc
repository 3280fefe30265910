#include "absl/status/status.h"
#include "tests/herd/server_fixture.h"

namespace herd::testing {
namespace {

TEST(Smoke, PutGetDeleteCas) {
  ServerProcess server(SmallServer("smoke"));
  ASSERT_TRUE(server.ok());
  auto client = Join(server, "smoke");
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(absl::IsNotFound(client->Get("hello").status()));
  auto v1 = client->Put("hello", "world");
  ASSERT_TRUE(v1.ok()) << v1.status();
  auto got = client->Get("hello");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value, "world");
  EXPECT_EQ(got->version, *v1);
  // CAS: a stale version fails and names the current one; the current one succeeds.
  auto stale = client->Cas("hello", *v1 + 1, "nope");
  EXPECT_TRUE(absl::IsFailedPrecondition(stale.status())) << stale.status();
  auto v2 = client->Cas("hello", *v1, "there");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_GT(*v2, *v1);
  got = client->Get("hello");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->value, "there");
  EXPECT_EQ(got->version, *v2);
  // DELETE: gone afterwards, a second DELETE finds nothing, and CAS on it is NOT_FOUND.
  auto v3 = client->Delete("hello");
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_GT(*v3, *v2);
  EXPECT_TRUE(absl::IsNotFound(client->Get("hello").status()));
  EXPECT_TRUE(absl::IsNotFound(client->Delete("hello").status()));
  EXPECT_TRUE(absl::IsNotFound(client->Cas("hello", *v3, "x").status()));
  // Re-inserted: versions keep rising across the delete (no ABA for CAS).
  auto v4 = client->Put("hello", "again");
  ASSERT_TRUE(v4.ok());
  EXPECT_GT(*v4, *v3);
}

}  // namespace
}  // namespace herd::testing
