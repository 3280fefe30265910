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

bool ServerRole::SetUnless(uint8_t bit, uint8_t refused_by) {
  uint8_t state = state_.load(std::memory_order_acquire);
  do {
    if ((state & (bit | refused_by)) != 0) return false;
  } while (!state_.compare_exchange_weak(state, state | bit, std::memory_order_acq_rel,
                                         std::memory_order_acquire));
  return true;
}

bool ServerRole::Promote() {
  if (configured_ != ReplicationRole::kBackup) return false;
  return SetUnless(kPromoted, kFenced);
}

bool ServerRole::Fence() {
  if (!replicated()) return false;
  return SetUnless(kFenced, 0);
}

}  // namespace herd
