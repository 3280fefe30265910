// The coordination service behind a replicated cluster (issue 35): ZooKeeper, through its C
// client (libzookeeper_mt). It keeps what no server may keep in its head alone:
// - the cluster's Configuration (configuration.h) at /herd/<cluster>/configuration, changed only
//   by a conditional write over the version read (exactly one of two racing writers wins);
// - each server's registration at /herd/<cluster>/members/<name>, an EPHEMERAL node: it lives
//   exactly as long as that server's session, so "the primary is gone" is a fact the service
//   states (the session expired), not a guess from a timeout on one link.
// Reads leave a watch: when what was read changes (or the session's state does), changes()
// moves, and the caller reads again (which watches again). All calls are control-plane calls
// that may wait up to a session timeout for the service; none belongs on a data path.
#ifndef HERD_REPLICATION_COORDINATOR_H_
#define HERD_REPLICATION_COORDINATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "herd/replication/configuration.h"

typedef struct _zhandle zhandle_t;  // NOLINT: the C client's own name

namespace herd {

struct CoordinatorOptions {
  std::string hosts;  // "127.0.0.1:2181" or a list, as the ZooKeeper client takes it
  std::string cluster = "herd";
  // How long the service keeps a silent session (and so a member's registration). The service
  // bounds it to its own [2, 20] ticks.
  absl::Duration session_timeout = absl::Seconds(2);
  absl::Duration connect_timeout = absl::Seconds(10);
};

struct VersionedConfiguration {
  Configuration configuration;
  int32_t version = 0;  // the stored node's version: what a conditional write names
};

class Coordinator {
 public:
  // Opens a session and makes the cluster's folders; fails if no server answers in time.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Connect(const CoordinatorOptions& options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The configuration in force (NOT_FOUND: none yet), watched.
  absl::StatusOr<VersionedConfiguration> ReadConfiguration();
  // The cluster's first configuration (ALREADY_EXISTS: one exists).
  absl::Status CreateConfiguration(const Configuration& first);
  // Replaces `current` by `next` if the stored one is still `current` (its version); ABORTED
  // when another change came first: read again. `next.epoch` must be `current`'s plus one.
  absl::Status ReplaceConfiguration(const VersionedConfiguration& current,
                                    const Configuration& next);

  // Registers this session as member `name` (ALREADY_EXISTS: another live session holds it).
  absl::Status Register(std::string_view name, const MemberInfo& info);
  // Member `name`'s registration (NOT_FOUND: it is not registered), watched; its `session` is
  // the session that registered it.
  absl::StatusOr<MemberInfo> Member(std::string_view name);
  // The registered members' names, watched.
  absl::StatusOr<std::vector<std::string>> Members();

  // Moves on every watched change and every session state change.
  uint64_t changes() const { return changes_.load(std::memory_order_acquire); }
  // The session expired (the service dropped it and this member's registration): nothing done
  // through this object counts any more; make a new one.
  bool expired() const { return expired_.load(std::memory_order_acquire); }
  // One round trip to the service. On success: when it was sent. The service cannot have ended
  // this session before then + session_timeout(), so a primary that confirmed at t may act as
  // primary until t + session_timeout() minus its margin (its lease).
  absl::StatusOr<absl::Time> Confirm();
  absl::Duration session_timeout() const;  // as the service granted it
  // This object's session, as the service numbers it (never 0 once connected): what a
  // registration made through it carries (MemberInfo::session), and a configuration that makes
  // this member primary records (Configuration::primary_session).
  uint64_t session_id() const;

 private:
  explicit Coordinator(const CoordinatorOptions& options);
  static void OnEvent(zhandle_t* zh, int type, int state, const char* path, void* context);
  absl::Status EnsureFolders();
  std::string ConfigurationPath() const;
  std::string MembersPath() const;
  absl::Status Error(int rc, std::string_view what) const;

  const CoordinatorOptions options_;
  zhandle_t* zh_ = nullptr;
  std::atomic<uint64_t> changes_{0};
  std::atomic<bool> expired_{false};
  std::atomic<bool> connected_{false};
};

// Where a client reaches a coordinated cluster: the client addresses of its configuration's
// primary first, then of its in-sync backups, then of any other registered member (herd_kv
// --coordinator takes them as its --members: it follows a failover to the next primary).
absl::StatusOr<std::vector<std::string>> ClusterAddresses(const CoordinatorOptions& options);

}  // namespace herd

#endif  // HERD_REPLICATION_COORDINATOR_H_
