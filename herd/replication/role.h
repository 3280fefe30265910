// What a server is in its replication group, and what it has become since it started: the one
// object every "is this server the primary?" asks (the Server owns it; its ReplicationMember,
// member.h, runs the roles' machinery and moves it).
//
//   configured kNone     ->  alone for good (no transition)
//   configured kPrimary  ->  Fence()    ->  fenced: it serves nothing, for good
//   configured kBackup   ->  Promote()  ->  the primary (promoted)  ->  Fence()  ->  fenced
//                        ->  Fence()    ->  fenced (a takeover that failed half way)
//
// A fenced server is restarted to serve again (as a backup: it rejoins by state transfer).
// Each transition happens at most once; a refused one changes nothing. Thread-safe: any thread
// reads it, and the transitions (the control thread's; a Fence also the lease keeper's) are each
// one atomic step over both facts, so a Fence and a Promote racing never leave a fenced server
// promoted.
#ifndef HERD_HERD_REPLICATION_ROLE_H_
#define HERD_HERD_REPLICATION_ROLE_H_

#include <atomic>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace herd {

// Issue 16: a server alone (the default), a primary that mirrors every partition to its
// backups before it acknowledges a write, or a backup that takes a primary's WRITEs and answers
// GETs from them (mutations: NOT_PRIMARY).
enum class ReplicationRole : uint8_t { kNone = 0, kPrimary = 1, kBackup = 2 };
std::string_view ReplicationRoleName(ReplicationRole role);
absl::StatusOr<ReplicationRole> ParseReplicationRole(std::string_view name);

class ServerRole {
 public:
  explicit ServerRole(ReplicationRole configured) : configured_(configured) {}
  ServerRole(const ServerRole&) = delete;
  ServerRole& operator=(const ServerRole&) = delete;

  // The role the server was started in (--role).
  ReplicationRole configured() const { return configured_; }
  // What it is now: kPrimary once a backup was promoted; a fenced primary is still kPrimary.
  ReplicationRole current() const { return promoted() ? ReplicationRole::kPrimary : configured_; }
  bool replicated() const { return configured_ != ReplicationRole::kNone; }
  // Acts as its group's primary: started as one, or a promoted backup (fenced or not).
  bool primary() const { return current() == ReplicationRole::kPrimary; }
  // A primary that still serves: it takes writes, renews its lease and watches its backups.
  bool serving_primary() const { return primary() && !fenced(); }
  // Takes writes and clients' mutations: a server alone, or a serving primary.
  bool takes_writes() const { return configured_ == ReplicationRole::kNone || serving_primary(); }
  bool promoted() const { return (state_.load(std::memory_order_acquire) & kPromoted) != 0; }
  bool fenced() const { return (state_.load(std::memory_order_acquire) & kFenced) != 0; }

  // A backup becomes its group's primary. False (nothing changes) unless it started as a backup
  // and was neither promoted nor fenced.
  bool Promote();
  // A replicated server stops serving for good (a primary that lost its place, a backup whose
  // takeover failed half way). False (nothing changes) for a server alone or one fenced before.
  bool Fence();

 private:
  static constexpr uint8_t kPromoted = 1;
  static constexpr uint8_t kFenced = 2;
  // Sets `bit` unless a bit of `refused_by` (or `bit` itself) is set already: one atomic step.
  bool SetUnless(uint8_t bit, uint8_t refused_by);

  const ReplicationRole configured_;
  std::atomic<uint8_t> state_{0};  // kPromoted | kFenced
};

}  // namespace herd

#endif  // HERD_HERD_REPLICATION_ROLE_H_
