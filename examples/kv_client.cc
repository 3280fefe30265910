// The first herd program to build: connect to a server, PUT, GET, CAS and DELETE one key.
//   bazel build //examples:kv_client
//   bazel-bin/examples/kv_client --server=127.0.0.1:31850   (--fabric=verbs --device=mlx5_0)
#include <cstdio>
#include <memory>

#include "gflags/gflags.h"
#include "herd/client.h"
#include "transport/flags.h"

DEFINE_string(server, "127.0.0.1:31850", "host:port of the herd server's control plane");

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "kv_client: %s\n", status.ToString().c_str());
  return 1;
}

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  herd::ClientOptions options;
  options.server = FLAGS_server;
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  if (!device.ok()) return Fail(device.status());
  options.device = *device;
  absl::StatusOr<std::unique_ptr<herd::Client>> client = herd::Client::Connect(options);
  if (!client.ok()) return Fail(client.status());
  herd::Client& kv = **client;

  absl::StatusOr<uint64_t> put = kv.Put("greeting", "hello, herd");
  if (!put.ok()) return Fail(put.status());
  absl::StatusOr<herd::Value> got = kv.Get("greeting");
  if (!got.ok()) return Fail(got.status());
  std::printf("GET greeting = \"%s\" (version %lu)\n", got->value.c_str(), got->version);

  // CAS succeeds only against the version we read; a stale one fails with CAS_FAILED.
  absl::StatusOr<uint64_t> cas = kv.Cas("greeting", got->version, "hello again");
  if (!cas.ok()) return Fail(cas.status());
  absl::StatusOr<uint64_t> stale = kv.Cas("greeting", got->version, "lost update");
  std::printf("CAS with the old version: %s\n", stale.status().ToString().c_str());
  if (stale.ok()) return Fail(absl::InternalError("a CAS with a stale version succeeded"));

  if (absl::StatusOr<uint64_t> del = kv.Delete("greeting"); !del.ok()) return Fail(del.status());
  std::printf("after DELETE: %s\n", kv.Get("greeting").status().ToString().c_str());
  return 0;
}
