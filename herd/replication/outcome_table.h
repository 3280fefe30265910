// The replicated half of a worker's dedupe table (issue 16): on a replicated server each
// executed mutation's outcome (its session, sequence number, status and version) is kept in the
// worker's partition region (mica's owner area), one entry per client id and window slot. The
// primary writes the entry in the batch that executes the mutation, so the gate mirrors it to
// the backups in the same chain as the mutation's bytes: a backup that holds the mutation holds
// its outcome, and one that does not holds neither (a replayed redo record covers both).
//
// After a failover the client joins the new primary naming the client ids and session it had
// (Join::resume_*). The worker then loads the old entries whose session matches into the new
// ids' dedupe state, and a retransmission of a mutation the old primary executed is answered
// from them instead of being applied again. The session is the old session's 64-bit secret: a
// client can resume only its own ids. The worker also copies the loaded entries to the new ids
// under the new session, so a second failover finds them too.
#ifndef HERD_HERD_REPLICATION_OUTCOME_TABLE_H_
#define HERD_HERD_REPLICATION_OUTCOME_TABLE_H_

#include <cstdint>
#include <vector>

#include "herd/config.h"
#include "herd/protocol.h"
#include "mica/partition.h"

namespace herd {

// One entry; part of the replicated region's format (primary and backup must agree).
struct MutationOutcome {
  uint64_t session = 0;  // the secret of the session that sent it; 0: no entry
  uint64_t seq = 0;
  uint64_t version = 0;
  uint8_t status = 0;  // a Status
  uint8_t reserved[7] = {};
};
static_assert(sizeof(MutationOutcome) == 32, "MutationOutcome is part of the replicated region");

// The owner area a replicated partition needs: max_clients x window entries.
inline uint64_t OutcomeTableBytes(const Config& config) {
  return uint64_t{config.max_clients} * config.window * sizeof(MutationOutcome);
}

// A view of a partition's outcome entries; owner thread only (the worker).
class OutcomeTable {
 public:
  // `partition`'s owner area must hold OutcomeTableBytes(config).
  OutcomeTable(mica::Partition* partition, const Config& config);

  // Writes the entry of (client, slot) and records the change (a gate replicates it).
  void Record(uint32_t client, uint32_t slot, const MutationOutcome& outcome);
  // The entry of (client, slot) if it belongs to `session` and holds a status the wire knows
  // (the bytes came from another machine: anything else is ignored); else false.
  bool Find(uint32_t client, uint32_t slot, uint64_t session, MutationOutcome* outcome) const;
  // The client ids below `max_clients` with at least one entry (a promotion's inventory).
  std::vector<uint32_t> ClientsWithOutcomes(uint32_t max_clients) const;

 private:
  MutationOutcome* At(uint32_t client, uint32_t slot) const {
    return entries_ + uint64_t{client} * window_ + slot;
  }

  mica::Partition* const partition_;
  MutationOutcome* const entries_;
  const uint32_t window_;
};

}  // namespace herd

#endif  // HERD_HERD_REPLICATION_OUTCOME_TABLE_H_
