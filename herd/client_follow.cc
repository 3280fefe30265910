// Client::Follow: after a failover, join the promoted member and hand it every outstanding
// request.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "herd/client.h"

namespace herd {

absl::StatusOr<std::unique_ptr<Client>> Client::Follow(absl::Duration timeout) {
  if (options_.members.empty()) {
    return absl::FailedPreconditionError("no members to follow (ClientOptions::members is empty)");
  }
  if (health_.ok()) {
    // Its session could still execute a request the follower resends: never applied twice only
    // if the old session is gone.
    return absl::FailedPreconditionError(
        "the server is still there (health() is OK): Follow() is for a lost server");
  }
  if (followed_) {
    return absl::FailedPreconditionError(
        "this client followed (or tried to) already: use the follower; its requests went there");
  }
  const absl::Time give_up = absl::Now() + timeout;
  std::vector<std::string> refusals;
  while (true) {
    refusals.clear();
    for (const std::string& member : options_.members) {
      ClientOptions options = options_;
      options.server = member;
      // A dead member refuses or never answers: it must not take the whole timeout (rounds
      // over the members repeat until then).
      options.connect_timeout = std::min(options_.connect_timeout, kFollowConnectTimeout);
      std::unique_ptr<Client> follower(new Client(options));
      follower->resume_ = Resumption{first_client_id_, welcome_.secret};
      absl::Status s = follower->Handshake();
      if (s.ok() && !follower->welcome_.takes_writes) {
        s = absl::FailedPreconditionError("a backup, not (yet) promoted");
      }
      if (s.ok() && welcome_.epoch != 0 && follower->welcome_.epoch <= welcome_.epoch) {
        // Coordinated replication: only a primary of a newer configuration took over from the
        // one this client followed (one of the same epoch is that primary, or a fenced one).
        s = absl::FailedPreconditionError(
            absl::StrFormat("its epoch %d is not newer than the lost primary's %d",
                            follower->welcome_.epoch, welcome_.epoch));
      }
      if (s.ok() && !follower->welcome_.resumed) {
        // Only a promoted backup holds the lost session's outcomes (an unreplicated server, a
        // primary that still runs the old session, a restarted one: re-applied, or acknowledged
        // before its backups hold it).
        s = absl::FailedPreconditionError("not a promoted backup of the lost primary");
      }
      if (s.ok() && Encode(follower->config_) != Encode(config_)) {
        // Every request fits the follower exactly as it fit here (slots, landing buffers).
        s = absl::FailedPreconditionError("its configuration differs from the lost server's");
      }
      if (s.ok()) {
        // A follower that took some of the requests and failed is not retried, elsewhere or
        // here: its session may execute them, and the outcomes it took over now carry its
        // secret. What is left ends as TIMED_OUT (outcome unknown).
        followed_ = true;
        if (absl::Status handed = HandOver(*follower); !handed.ok()) return handed;
        LOG(INFO) << "followed the primary to " << member << " with " << follower->outstanding_
                  << " requests outstanding";
        return follower;
      }
      refusals.push_back(absl::StrCat(member, ": ", s.message()));
    }
    if (absl::Now() >= give_up) break;
    // Waiting for a promotion (an operator's, or an automatic one) to happen.
    absl::SleepFor(kFollowRetryInterval);
  }
  return absl::UnavailableError(absl::StrCat("no member took writes within ",
                                             absl::FormatDuration(timeout), ": ",
                                             absl::StrJoin(refusals, "; ")));
}

absl::Status Client::HandOver(Client& follower) {
  follower.next_seq_ = next_seq_;  // new requests continue the sequence numbers
  const RequestLimits limits{config_.max_key_bytes, config_.value_limit(),
                             config_.large_values() ? config_.landing_buffers : 0};
  // Resent in sequence order per slot (one per slot is outstanding), each as a new attempt: the
  // new primary replays the outcome of one the old primary executed (attempt > 0 is never
  // taken for a duplicate landing of a send it has not seen).
  auto parsed = std::make_unique<ParsedRequest>();  // large (a key copy): off the stack, once
  for (Outstanding& o : slots_) {
    if (!o.active) continue;
    Status status = Status::kOk;
    if (ParseRequest(StagedBytes(o), o.length, limits, welcome_.secret, parsed.get(), &status) !=
            Parse::kRequest ||
        status != Status::kOk) {
      return absl::InternalError("a staged request does not parse: the client's own bug");
    }
    const RequestHeader& h = parsed->header;
    // One sent at kMaxAttempt goes with that number again: the follower's session has seen no
    // attempt of it, so it is still a new one there (and its next retransmission ends it).
    const uint32_t attempt = std::min(o.attempt + 1, kMaxAttempt);
    if (absl::Status s =
            follower.Stage(Staged{o.client, o.op, parsed->key(), o.keyhash, parsed->value,
                                  h.expected_version, o.tag, o.seq, attempt, o.submitted});
        !s.ok()) {
      return s;
    }
  }
  // Handed over: this client forgets them (nothing of its session may answer them now).
  for (Outstanding& o : slots_) {
    if (o.active) Forget(o);
  }
  // A post that fails leaves them to the follower's retransmission, as any failed post.
  if (absl::Status s = follower.Flush(); !s.ok()) LOG(WARNING) << "follow: " << s;
  return absl::OkStatus();
}

}  // namespace herd
