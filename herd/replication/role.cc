#include "herd/replication/role.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace herd {

std::string_view ReplicationRoleName(ReplicationRole role) {
  switch (role) {
    case ReplicationRole::kNone:
      return "none";
    case ReplicationRole::kPrimary:
      return "primary";
    case ReplicationRole::kBackup:
      return "backup";
  }
  return "unknown";
}

absl::StatusOr<ReplicationRole> ParseReplicationRole(std::string_view name) {
  for (ReplicationRole role :
       {ReplicationRole::kNone, ReplicationRole::kPrimary, ReplicationRole::kBackup}) {
    if (name == ReplicationRoleName(role)) return role;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--role=%s: expected none, primary or backup", name));
}

bool ServerRole::Promote() {
  if (configured_ != ReplicationRole::kBackup || fenced()) return false;
  return !promoted_.exchange(true, std::memory_order_acq_rel);
}

bool ServerRole::Fence() {
  if (!replicated()) return false;
  return !fenced_.exchange(true, std::memory_order_acq_rel);
}

}  // namespace herd
