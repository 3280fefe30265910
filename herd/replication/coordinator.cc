#include "herd/replication/coordinator.h"

#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace herd {
namespace {

// What a stored node of ours may hold (a configuration or a registration: a few lines).
constexpr int kMaxNodeBytes = 4096;
// How often Connect looks whether the session is up.
constexpr absl::Duration kConnectPollInterval = absl::Milliseconds(5);

void QuietClientLog() {
  // The C client logs every connection step to stderr at INFO; errors are enough (ours say more).
  static std::once_flag once;
  std::call_once(once, [] { zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR); });
}

}  // namespace

Coordinator::Coordinator(const CoordinatorOptions& options) : options_(options) {}

Coordinator::~Coordinator() {
  if (zh_ != nullptr) zookeeper_close(zh_);  // ends the session: its ephemeral nodes go at once
}

void Coordinator::OnEvent(zhandle_t* zh, int type, int state, const char* path, void* context) {
  (void)zh, (void)path;
  auto* self = static_cast<Coordinator*>(context);
  if (type == ZOO_SESSION_EVENT) {
    if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
      self->expired_.store(true, std::memory_order_release);
    }
    self->connected_.store(state == ZOO_CONNECTED_STATE, std::memory_order_release);
  }
  self->changes_.fetch_add(1, std::memory_order_acq_rel);
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Connect(
    const CoordinatorOptions& options) {
  if (options.hosts.empty()) return absl::InvalidArgumentError("no coordinator hosts given");
  if (absl::Status s = CheckMemberName(options.cluster); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cluster name: ", s.message()));
  }
  QuietClientLog();
  std::unique_ptr<Coordinator> c(new Coordinator(options));
  c->zh_ = zookeeper_init(options.hosts.c_str(), &Coordinator::OnEvent,
                          static_cast<int>(absl::ToInt64Milliseconds(options.session_timeout)),
                          nullptr, c.get(), 0);
  if (c->zh_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "coordinator %s: the ZooKeeper client refused the host list", options.hosts));
  }
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  while (!c->connected_.load(std::memory_order_acquire)) {
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrFormat("coordinator %s: no ZooKeeper server answered within %s (is it running? "
                          "scripts/zk.sh start)",
                          options.hosts, absl::FormatDuration(options.connect_timeout)));
    }
    absl::SleepFor(kConnectPollInterval);
  }
  if (absl::Status s = c->EnsureFolders(); !s.ok()) return s;
  return c;
}

absl::Status Coordinator::Error(int rc, std::string_view what) const {
  const std::string message =
      absl::StrFormat("coordinator %s: %s: %s", options_.hosts, what, zerror(rc));
  switch (rc) {
    case ZNONODE:
      return absl::NotFoundError(message);
    case ZNODEEXISTS:
      return absl::AlreadyExistsError(message);
    case ZBADVERSION:
      return absl::AbortedError(message);
    case ZSESSIONEXPIRED:
    case ZCONNECTIONLOSS:
    case ZOPERATIONTIMEOUT:
    case ZCLOSING:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string Coordinator::ConfigurationPath() const {
  return absl::StrCat("/herd/", options_.cluster, "/configuration");
}
std::string Coordinator::MembersPath() const {
  return absl::StrCat("/herd/", options_.cluster, "/members");
}

absl::Status Coordinator::EnsureFolders() {
  for (const std::string& path :
       {std::string("/herd"), absl::StrCat("/herd/", options_.cluster), MembersPath()}) {
    const int rc = zoo_create(zh_, path.c_str(), nullptr, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT,
                              nullptr, 0);
    if (rc != ZOK && rc != ZNODEEXISTS) return Error(rc, absl::StrCat("create ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<VersionedConfiguration> Coordinator::ReadConfiguration() {
  char buffer[kMaxNodeBytes];
  int length = sizeof(buffer);
  struct Stat stat {};
  const std::string path = ConfigurationPath();
  int rc = zoo_get(zh_, path.c_str(), /*watch=*/1, buffer, &length, &stat);
  if (rc == ZNONODE) {
    // Watch for its creation too.
    rc = zoo_exists(zh_, path.c_str(), /*watch=*/1, &stat);
    if (rc == ZOK) return ReadConfiguration();  // created in between
  }
  if (rc != ZOK) return Error(rc, "read the configuration");
  if (length < 0 || stat.dataLength > length) {
    return absl::DataLossError(
        absl::StrFormat("coordinator: the stored configuration is %d bytes (at most %d)",
                        stat.dataLength, kMaxNodeBytes));
  }
  absl::StatusOr<Configuration> decoded =
      Configuration::Decode(std::string_view(buffer, static_cast<size_t>(length)));
  if (!decoded.ok()) return decoded.status();
  return VersionedConfiguration{*std::move(decoded), stat.version};
}

absl::Status Coordinator::CreateConfiguration(const Configuration& first) {
  const std::string data = first.Encode();
  const int rc =
      zoo_create(zh_, ConfigurationPath().c_str(), data.data(), static_cast<int>(data.size()),
                 &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT, nullptr, 0);
  if (rc != ZOK) return Error(rc, "create the configuration");
  return absl::OkStatus();
}

absl::Status Coordinator::ReplaceConfiguration(const VersionedConfiguration& current,
                                               const Configuration& next) {
  if (next.epoch != current.configuration.epoch + 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a configuration change goes from epoch %d to %d, not %d",
                        current.configuration.epoch, current.configuration.epoch + 1, next.epoch));
  }
  const std::string data = next.Encode();
  const int rc = zoo_set(zh_, ConfigurationPath().c_str(), data.data(),
                         static_cast<int>(data.size()), current.version);
  if (rc != ZOK) {
    return Error(
        rc, absl::StrFormat("change %s to %s", current.configuration.ToString(), next.ToString()));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Register(std::string_view name, const MemberInfo& info) {
  if (absl::Status s = CheckMemberName(name); !s.ok()) return s;
  const std::string path = absl::StrCat(MembersPath(), "/", std::string(name));
  const std::string data = info.Encode();
  const int rc = zoo_create(zh_, path.c_str(), data.data(), static_cast<int>(data.size()),
                            &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL, nullptr, 0);
  if (rc != ZOK) return Error(rc, absl::StrCat("register member ", std::string(name)));
  return absl::OkStatus();
}

absl::StatusOr<MemberInfo> Coordinator::Member(std::string_view name) {
  if (absl::Status s = CheckMemberName(name); !s.ok()) return s;
  const std::string path = absl::StrCat(MembersPath(), "/", std::string(name));
  char buffer[kMaxNodeBytes];
  int length = sizeof(buffer);
  struct Stat stat {};
  int rc = zoo_get(zh_, path.c_str(), /*watch=*/1, buffer, &length, &stat);
  if (rc == ZNONODE) {
    rc = zoo_exists(zh_, path.c_str(), /*watch=*/1, &stat);  // watch for its return
    if (rc == ZOK) return Member(name);
    if (rc == ZNONODE) return Error(rc, absl::StrCat("member ", std::string(name)));
  }
  if (rc != ZOK) return Error(rc, absl::StrCat("read member ", std::string(name)));
  if (length < 0 || stat.dataLength > length) {
    return absl::DataLossError(
        absl::StrCat("coordinator: member ", std::string(name), ": oversize"));
  }
  absl::StatusOr<MemberInfo> info =
      MemberInfo::Decode(std::string_view(buffer, static_cast<size_t>(length)));
  if (info.ok()) info->session = static_cast<uint64_t>(stat.ephemeralOwner);
  return info;
}

absl::StatusOr<std::vector<std::string>> Coordinator::Members() {
  struct String_vector children {};
  const int rc = zoo_get_children(zh_, MembersPath().c_str(), /*watch=*/1, &children);
  if (rc != ZOK) return Error(rc, "list the members");
  std::vector<std::string> names;
  for (int i = 0; i < children.count; ++i) names.emplace_back(children.data[i]);
  deallocate_String_vector(&children);
  return names;
}

absl::StatusOr<absl::Time> Coordinator::Confirm() {
  const absl::Time sent = absl::Now();
  struct Stat stat {};
  const int rc = zoo_exists(zh_, MembersPath().c_str(), /*watch=*/0, &stat);
  if (rc != ZOK) return Error(rc, "confirm the session");
  if (expired()) return absl::UnavailableError("coordinator: the session expired");
  return sent;
}

uint64_t Coordinator::session_id() const {
  const clientid_t* id = zoo_client_id(zh_);
  return id == nullptr ? 0 : static_cast<uint64_t>(id->client_id);
}

absl::Duration Coordinator::session_timeout() const {
  return absl::Milliseconds(zoo_recv_timeout(zh_));
}

absl::StatusOr<std::vector<std::string>> ClusterAddresses(const CoordinatorOptions& options) {
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Connect(options);
  if (!c.ok()) return c.status();
  absl::StatusOr<VersionedConfiguration> stored = (*c)->ReadConfiguration();
  if (!stored.ok()) return stored.status();
  absl::StatusOr<std::vector<std::string>> registered = (*c)->Members();
  if (!registered.ok()) return registered.status();
  std::vector<std::string> order = {stored->configuration.primary};
  order.insert(order.end(), stored->configuration.backups.begin(),
               stored->configuration.backups.end());
  for (const std::string& m : *registered) {
    if (std::find(order.begin(), order.end(), m) == order.end()) order.push_back(m);
  }
  std::vector<std::string> addresses;
  for (const std::string& m : order) {
    absl::StatusOr<MemberInfo> info = (*c)->Member(m);
    if (info.ok()) addresses.push_back(info->client_address);
  }
  if (addresses.empty()) {
    return absl::UnavailableError(absl::StrFormat("cluster \"%s\": no member is registered (%s)",
                                                  options.cluster,
                                                  stored->configuration.ToString()));
  }
  return addresses;
}

}  // namespace herd
