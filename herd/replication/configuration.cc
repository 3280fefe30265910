#include "herd/replication/configuration.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace herd {
namespace {

// A stored configuration is a few lines; anything much longer is not one.
constexpr size_t kMaxEncodedBytes = 4096;

bool NameCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.';
}

// Splits "key value" lines into exactly `keys`, in that order.
absl::StatusOr<std::vector<std::string>> Fields(std::string_view text,
                                                const std::vector<std::string_view>& keys) {
  if (text.size() > kMaxEncodedBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("%d bytes: too long", text.size()));
  }
  if (text.empty() || text.back() != '\n') {
    return absl::InvalidArgumentError("not newline-terminated");
  }
  // absl::string_view: Debian's Abseil keeps its own (not std's).
  const absl::string_view body(text.data(), text.size() - 1);
  std::vector<absl::string_view> split = absl::StrSplit(body, '\n');
  std::vector<std::string_view> lines;
  for (absl::string_view line : split) lines.emplace_back(line.data(), line.size());
  if (lines.size() != keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d lines where %d were expected", lines.size(), keys.size()));
  }
  std::vector<std::string> values;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string_view line = lines[i];
    const size_t space = line.find(' ');
    const std::string_view key = space == std::string_view::npos ? line : line.substr(0, space);
    if (key != keys[i]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("line %d is \"%s\" where \"%s\" was expected", i + 1, key, keys[i]));
    }
    values.emplace_back(space == std::string_view::npos ? "" : line.substr(space + 1));
  }
  return values;
}

}  // namespace

absl::Status CheckMemberName(std::string_view name) {
  if (name.empty() || name.size() > kMaxMemberNameBytes ||
      !std::all_of(name.begin(), name.end(), NameCharacter) || name == "." || name == "..") {
    return absl::InvalidArgumentError(
        absl::StrFormat("member name \"%s\": expected 1 to %d letters, digits, '-', '_' or '.'",
                        name, kMaxMemberNameBytes));
  }
  return absl::OkStatus();
}

bool Configuration::HasBackup(std::string_view name) const {
  return std::find(backups.begin(), backups.end(), name) != backups.end();
}

std::string Configuration::Encode() const {
  std::string text = absl::StrFormat("epoch %d\nprimary %s\nbackups %s\n", epoch, primary,
                                     absl::StrJoin(backups, ","));
  if (primary_session != 0) absl::StrAppendFormat(&text, "session %d\n", primary_session);
  return text;
}

std::string Configuration::ToString() const {
  return absl::StrFormat("epoch %d: primary %s (session %#x), backups [%s]", epoch, primary,
                         primary_session, absl::StrJoin(backups, ","));
}

absl::StatusOr<Configuration> Configuration::Decode(std::string_view text) {
  // The form stored before incarnations were recorded has no session line.
  const bool has_session = std::count(text.begin(), text.end(), '\n') == 4;
  absl::StatusOr<std::vector<std::string>> fields =
      has_session ? Fields(text, {"epoch", "primary", "backups", "session"})
                  : Fields(text, {"epoch", "primary", "backups"});
  if (!fields.ok()) {
    return absl::DataLossError(
        absl::StrCat("stored configuration unreadable: ", fields.status().message()));
  }
  Configuration c;
  if (!absl::SimpleAtoi((*fields)[0], &c.epoch) || c.epoch == 0) {
    return absl::DataLossError(absl::StrFormat("stored configuration: epoch \"%s\"", (*fields)[0]));
  }
  if (has_session &&
      (!absl::SimpleAtoi((*fields)[3], &c.primary_session) || c.primary_session == 0)) {
    return absl::DataLossError(
        absl::StrFormat("stored configuration: session \"%s\"", (*fields)[3]));
  }
  c.primary = (*fields)[1];
  if (absl::Status s = CheckMemberName(c.primary); !s.ok()) {
    return absl::DataLossError(absl::StrCat("stored configuration: primary: ", s.message()));
  }
  if (!(*fields)[2].empty()) {
    for (absl::string_view b : absl::StrSplit((*fields)[2], ',')) c.backups.emplace_back(b);
  }
  if (c.backups.size() > kMaxBackups) {
    return absl::DataLossError(absl::StrFormat("stored configuration: %d backups (at most %d)",
                                               c.backups.size(), kMaxBackups));
  }
  for (const std::string& b : c.backups) {
    if (absl::Status s = CheckMemberName(b); !s.ok()) {
      return absl::DataLossError(absl::StrCat("stored configuration: backup: ", s.message()));
    }
    if (b == c.primary || std::count(c.backups.begin(), c.backups.end(), b) != 1) {
      return absl::DataLossError(absl::StrFormat("stored configuration: %s listed twice", b));
    }
  }
  return c;
}

absl::StatusOr<PrimaryPresence> PresenceOf(const Configuration& current,
                                           const absl::StatusOr<MemberInfo>& registration) {
  if (registration.status().code() == absl::StatusCode::kNotFound) return PrimaryPresence::kGone;
  if (!registration.ok()) {
    return absl::UnavailableError(absl::StrCat("the primary's registration could not be read: ",
                                               registration.status().message()));
  }
  if (current.primary_session != 0 && registration->session != current.primary_session) {
    // The name registered again by a later life (a restart): the primary itself is gone.
    return PrimaryPresence::kGone;
  }
  return PrimaryPresence::kLive;
}

absl::StatusOr<Configuration> PromoteIn(const Configuration& current, std::string_view candidate,
                                        uint64_t candidate_session, PrimaryPresence presence) {
  if (current.primary == candidate) {
    return absl::AlreadyExistsError(
        absl::StrFormat("%s is already the primary (%s)", candidate, current.ToString()));
  }
  if (!current.HasBackup(candidate)) {
    // Not in sync in this epoch: it misses writes the primary acknowledged (a backup of an older
    // epoch, one dropped, one still syncing): promoting it would lose them.
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not an in-sync backup of %s: promoting it would lose acknowledged writes", candidate,
        current.ToString()));
  }
  if (presence == PrimaryPresence::kLive) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the primary %s of epoch %d is still registered (its coordination session is live): a "
        "promotion now would make a second primary",
        current.primary, current.epoch));
  }
  Configuration next;
  next.epoch = current.epoch + 1;
  next.primary = std::string(candidate);
  next.primary_session = candidate_session;
  return next;  // no backups: each rejoins by state transfer
}

absl::StatusOr<Configuration> RenewIncarnationIn(const Configuration& current,
                                                 std::string_view primary, uint64_t session) {
  if (current.primary != primary) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s is not the primary of %s: it has no incarnation to renew", primary,
                        current.ToString()));
  }
  if (session == 0 || session == current.primary_session) {
    return absl::InvalidArgumentError(
        absl::StrFormat("session %#x: not a new session for %s", session, current.ToString()));
  }
  Configuration next = current;
  next.epoch = current.epoch + 1;
  next.primary_session = session;
  return next;
}

absl::StatusOr<Configuration> DropBackupIn(const Configuration& current, std::string_view primary,
                                           std::string_view backup) {
  if (current.primary != primary) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not the primary of %s: it cannot drop backups", primary, current.ToString()));
  }
  if (!current.HasBackup(backup)) {
    return absl::NotFoundError(
        absl::StrFormat("%s is not a backup of %s", backup, current.ToString()));
  }
  Configuration next = current;
  next.epoch = current.epoch + 1;
  next.backups.erase(std::find(next.backups.begin(), next.backups.end(), backup));
  return next;
}

absl::StatusOr<Configuration> AddBackupIn(const Configuration& current, std::string_view primary,
                                          std::string_view backup) {
  if (current.primary != primary) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not the primary of %s: it cannot add backups", primary, current.ToString()));
  }
  if (backup == primary || current.HasBackup(backup)) {
    return absl::AlreadyExistsError(
        absl::StrFormat("%s is already in %s", backup, current.ToString()));
  }
  if (current.backups.size() >= kMaxBackups) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s has %d backups already", current.ToString(), kMaxBackups));
  }
  if (absl::Status s = CheckMemberName(backup); !s.ok()) return s;
  Configuration next = current;
  next.epoch = current.epoch + 1;
  next.backups.emplace_back(backup);
  return next;
}

std::string MemberInfo::Encode() const {
  return absl::StrFormat("client %s\nreplication %s\n", client_address, replication_address);
}

absl::StatusOr<MemberInfo> MemberInfo::Decode(std::string_view text) {
  absl::StatusOr<std::vector<std::string>> fields = Fields(text, {"client", "replication"});
  if (!fields.ok()) {
    return absl::DataLossError(absl::StrCat("member registration: ", fields.status().message()));
  }
  MemberInfo info;
  info.client_address = (*fields)[0];
  info.replication_address = (*fields)[1];
  return info;
}

std::string_view SuccessionName(Succession succession) {
  switch (succession) {
    case Succession::kUnknown:
      return "unknown";
    case Succession::kNone:
      return "none";
    case Succession::kTakenOver:
      return "taken_over";
  }
  return "?";
}

Succession SuccessionOf(const Configuration& stored, std::string_view member, uint64_t held_epoch,
                        const absl::StatusOr<MemberInfo>& primary_registration) {
  if (stored.epoch < held_epoch) return Succession::kUnknown;
  if (stored.primary == member) return Succession::kNone;
  if (stored.epoch == held_epoch) return Succession::kUnknown;  // one epoch, one primary
  const absl::StatusOr<PrimaryPresence> presence = PresenceOf(stored, primary_registration);
  return presence.ok() && *presence == PrimaryPresence::kLive ? Succession::kTakenOver
                                                              : Succession::kUnknown;
}

}  // namespace herd
