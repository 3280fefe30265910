// A replicated cluster's numbered configuration (issue 35): who is the primary and which backups
// hold every write it acknowledged, under an epoch that grows by one with every change. The
// configuration lives in the coordination service (coordinator.h), never in a server's head:
// each change is a conditional write of epoch e+1 over epoch e, so of two servers that race to
// change epoch e exactly one wins, and the loser learns it is out of date.
//
// The rules, each a pure function of the configuration in force (configuration_test.cc):
// - Promote: only a backup IN SYNC in the current epoch may become primary (any other misses
//   acknowledged writes), and only once the current primary is gone (its coordination session
//   ended) unless the operator forces it past a live but cut-off one. The new epoch has NO
//   backups: the others may hold a chain the new primary lacks (or lack one it holds); each
//   rejoins it by a state transfer and is added back (AddBackup) once synced.
// - DropBackup: the primary of the current epoch removes a backup it will go on without; the
//   caller must first wait out that backup's read lease (gate.h, "Leases").
// - AddBackup: the primary of the current epoch adds a backup its state transfer brought up to
//   date.
// A server acts only in the epoch it holds: a backup takes chains only from its epoch's primary,
// a primary acknowledges only while its epoch is current (see docs/architecture.md).
#ifndef HERD_REPLICATION_CONFIGURATION_H_
#define HERD_REPLICATION_CONFIGURATION_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace herd {

// Member names are the servers' own (--member): letters, digits, '-', '_' and '.', at most
// kMaxMemberNameBytes, so that they can be coordination-service node names.
inline constexpr size_t kMaxMemberNameBytes = 64;
inline constexpr size_t kMaxBackups = 8;
absl::Status CheckMemberName(std::string_view name);

struct Configuration {
  uint64_t epoch = 0;
  std::string primary;
  std::vector<std::string> backups;  // in sync: each holds every acknowledged write
  // The primary's incarnation: the coordination session it held (and registered under) when
  // this configuration's line of epochs made it primary. A primary never changes sessions (one
  // that loses its session is fenced), so a registration of its name under another session is a
  // later life of the same server, not the primary. 0: not recorded (a configuration stored
  // before incarnations were; its primary is known by name alone).
  uint64_t primary_session = 0;

  bool HasBackup(std::string_view name) const;
  // "epoch 7\nprimary p1\nbackups b1,b2\nsession 72057...\n" (the stored form; without the
  // session line when none is recorded; Decode refuses anything else).
  std::string Encode() const;
  static absl::StatusOr<Configuration> Decode(std::string_view text);
  std::string ToString() const;  // one line, for logs and errors
  bool operator==(const Configuration& other) const {
    return epoch == other.epoch && primary == other.primary && backups == other.backups &&
           primary_session == other.primary_session;
  }
};

// A member's registration (its ephemeral node's data): where clients and primaries reach it.
struct MemberInfo {
  std::string client_address;       // host:port of its join port
  std::string replication_address;  // host:port where primaries attach ("" for none)
  // The session that registered it (the node's owner, as Coordinator::Member read it; not part
  // of the encoded data).
  uint64_t session = 0;
  std::string Encode() const;
  static absl::StatusOr<MemberInfo> Decode(std::string_view text);
};

// Whether the current primary is still there (its coordination session holds its member node),
// and whether the operator forces a promotion past a live one (it is cut off from its backups:
// the operator vouches that it is fenced).
enum class PrimaryPresence : uint8_t { kGone, kLive, kLiveButForced };

// The primary's presence from its registration as read (`registration`: the member node of
// current.primary, NOT_FOUND when there is none): live only when registered by the session
// `current` names (by any session when it names none). Another error: UNAVAILABLE, nothing
// known.
absl::StatusOr<PrimaryPresence> PresenceOf(const Configuration& current,
                                           const absl::StatusOr<MemberInfo>& registration);

// `candidate_session`: the candidate's own coordination session (the new primary's
// incarnation).
absl::StatusOr<Configuration> PromoteIn(const Configuration& current, std::string_view candidate,
                                        uint64_t candidate_session, PrimaryPresence presence);
// The primary of `current` records its new session (`session`): one that lost the session it
// was promoted in before it served (a takeover a pause outlasted; it reconnected) records the
// session it registered under again, before it serves, so that it is live to its backups.
absl::StatusOr<Configuration> RenewIncarnationIn(const Configuration& current,
                                                 std::string_view primary, uint64_t session);
absl::StatusOr<Configuration> DropBackupIn(const Configuration& current, std::string_view primary,
                                           std::string_view backup);
absl::StatusOr<Configuration> AddBackupIn(const Configuration& current, std::string_view primary,
                                          std::string_view backup);

// What a fenced primary knows of what came after it: whether its copy may be dropped.
enum class Succession : uint8_t {
  // Not read yet (or only a stale read: a configuration older than its own).
  kUnknown,
  // The stored configuration still names it primary: nobody took over, and its copy may hold
  // acknowledged writes no other copy can serve (a listed backup may never have been told it is
  // in sync, or may have been dropped with its removal not yet committed). Kept.
  kNone,
  // A configuration newer than its own names another primary, live in the incarnation that
  // configuration names: promoted from an in-sync backup (PromoteIn takes no other), it holds
  // every acknowledged write, and it can attach this member as a backup. Its copy may be
  // dropped (a rejoin as a backup).
  kTakenOver,
};
std::string_view SuccessionName(Succession succession);

// The succession a fenced `member`, primary of epoch `held_epoch`, reads in `stored`, given the
// registration of stored.primary (`primary_registration`, as Coordinator::Member read it; only
// consulted when stored names another primary). Only a newer configuration counts: an older one
// naming another primary is a read from a lagging server (kUnknown). A newer primary that is not
// live (its registration gone, or held by another session: it died or stopped after its
// promotion was committed, maybe before its takeover ended) is kUnknown too: the copy is kept
// until a primary that can take this member back is there.
Succession SuccessionOf(const Configuration& stored, std::string_view member, uint64_t held_epoch,
                        const absl::StatusOr<MemberInfo>& primary_registration);

}  // namespace herd

#endif  // HERD_REPLICATION_CONFIGURATION_H_
