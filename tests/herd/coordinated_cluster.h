// A coordinated replicated cluster for tests (issue 35): a private ZooKeeper, servers in forked
// processes by member name, and the test's own view of the configuration through a Coordinator.
// Waits are bounded and poll the service's state (watch-driven), never a fixed sleep.
#ifndef HERD_TESTS_HERD_COORDINATED_CLUSTER_H_
#define HERD_TESTS_HERD_COORDINATED_CLUSTER_H_

#include <signal.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "herd/client.h"
#include "herd/replication/coordinator.h"
#include "herd/server.h"
#include "tests/herd/server_fixture.h"
#include "tests/herd/zookeeper.h"

namespace herd::testing {

// Session timeout of the members' coordination sessions: a dead primary is replaced about this
// long after it died.
inline constexpr absl::Duration kTestSessionTimeout = absl::Seconds(2);
inline constexpr absl::Duration kTestReadLease = absl::Milliseconds(500);
// What any awaited state change may take on a loaded 2-core machine (state transfers of every
// partition included).
inline constexpr absl::Duration kClusterDeadline = absl::Seconds(60);

class CoordinatedCluster {
 public:
  explicit CoordinatedCluster(std::string fabric) : fabric_(std::move(fabric)) {}
  ~CoordinatedCluster() {
    // A paused server would never take the SIGTERM its ServerProcess sends.
    for (auto& [name, server] : servers_) {
      if (server->pid() > 0) kill(server->pid(), SIGCONT);
    }
  }
  bool ok() const { return zk_.ok(); }
  const absl::Status& zk_status() const { return zk_.status(); }
  PrivateZooKeeper& zookeeper() { return zk_; }

  ServerOptions Options(const std::string& member, ReplicationRole role, bool auto_failover) const {
    ServerOptions options = SmallServer(fabric_);
    options.store.mode = mica::StoreMode::kStore;
    options.replication.role = role;
    options.replication.member = member;
    options.replication.coordinator.hosts = zk_.hosts();
    options.replication.coordinator.cluster = "test";
    options.replication.coordinator.session_timeout = kTestSessionTimeout;
    options.replication.auto_failover = auto_failover;
    options.replication.read_lease = kTestReadLease;
    options.replication.listen_address = "127.0.0.1";
    // A dead link, not a slow chain, drops a backup (a loaded machine must not fail tests).
    options.replication.gate.stall_timeout = absl::Seconds(10);
    return options;
  }
  // Starts (or restarts, after Kill) member `name`.
  bool Start(const std::string& name, ReplicationRole role, bool auto_failover = true) {
    servers_[name] = std::make_unique<ServerProcess>(Options(name, role, auto_failover));
    return servers_[name]->ok();
  }
  void Kill(const std::string& name) { servers_.at(name)->Kill(); }
  void Pause(const std::string& name) { kill(servers_.at(name)->pid(), SIGSTOP); }
  void Resume(const std::string& name) { kill(servers_.at(name)->pid(), SIGCONT); }
  std::string Address(const std::string& name) const { return servers_.at(name)->address(); }

  // The test's view of the service, a session per look: the servers are forked from this
  // process, and a fork while the ZooKeeper client's threads run could copy a lock one of them
  // holds into the child.
  absl::StatusOr<Configuration> Read() {
    absl::StatusOr<std::unique_ptr<Coordinator>> view = View();
    if (!view.ok()) return view.status();
    absl::StatusOr<VersionedConfiguration> v = (*view)->ReadConfiguration();
    if (!v.ok()) return v.status();
    return v->configuration;
  }
  bool Registered(const std::string& name) {
    absl::StatusOr<std::unique_ptr<Coordinator>> view = View();
    return view.ok() && (*view)->Member(name).ok();
  }
  // Waits until `done` holds for the stored configuration; false (with the last one logged)
  // after kClusterDeadline.
  bool AwaitConfiguration(const std::function<bool(const Configuration&)>& done,
                          absl::Duration limit = kClusterDeadline) {
    const absl::Time give_up = absl::Now() + limit;
    absl::StatusOr<Configuration> c = Read();
    while (!(c.ok() && done(*c))) {
      if (absl::Now() >= give_up) {
        ADD_FAILURE() << "configuration never got there; last: "
                      << (c.ok() ? c->ToString() : c.status().ToString());
        return false;
      }
      absl::SleepFor(kPollInterval);
      c = Read();
    }
    return true;
  }
  bool AwaitUnregistered(const std::string& name) {
    const absl::Time give_up = absl::Now() + kClusterDeadline;
    while (Registered(name)) {
      if (absl::Now() >= give_up) return false;
      absl::SleepFor(kPollInterval);
    }
    return true;
  }

  std::unique_ptr<Client> Connect(const std::string& name) {
    ClientOptions options;
    options.server = Address(name);
    options.device.fabric = fabric_;
    options.retry_timeout = absl::Milliseconds(5);
    options.connect_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << name << ": " << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

 private:
  static constexpr absl::Duration kPollInterval = absl::Milliseconds(20);
  absl::StatusOr<std::unique_ptr<Coordinator>> View() const {
    CoordinatorOptions options;
    options.hosts = zk_.hosts();
    options.cluster = "test";
    return Coordinator::Connect(options);
  }
  std::string fabric_;
  PrivateZooKeeper zk_;
  std::map<std::string, std::unique_ptr<ServerProcess>> servers_;
};

}  // namespace herd::testing

#endif  // HERD_TESTS_HERD_COORDINATED_CLUSTER_H_
