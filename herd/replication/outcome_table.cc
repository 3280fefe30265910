#include "herd/replication/outcome_table.h"

#include <cstring>

#include "glog/logging.h"

namespace herd {
namespace {

// The statuses an executed mutation can end with (the store's results and INTERNAL): a replay
// answers only these.
bool IsExecutedOutcome(uint8_t status) {
  return status <= static_cast<uint8_t>(Status::kNoMemory) ||
         status == static_cast<uint8_t>(Status::kInternal);
}

}  // namespace

OutcomeTable::OutcomeTable(mica::Partition* partition, const Config& config)
    : partition_(partition),
      entries_(reinterpret_cast<MutationOutcome*>(partition->owner_area().data())),
      window_(config.window) {
  CHECK_GE(partition->owner_area().size(), OutcomeTableBytes(config))
      << "the partition's owner area cannot hold the outcome table";
  CHECK_EQ(reinterpret_cast<uintptr_t>(entries_) % alignof(MutationOutcome), 0u);
}

void OutcomeTable::Record(uint32_t client, uint32_t slot, const MutationOutcome& outcome) {
  MutationOutcome* entry = At(client, slot);
  *entry = outcome;
  partition_->OwnerAreaChanged(
      static_cast<uint64_t>(reinterpret_cast<uint8_t*>(entry) - partition_->owner_area().data()),
      sizeof(MutationOutcome));
}

bool OutcomeTable::Find(uint32_t client, uint32_t slot, uint64_t session,
                        MutationOutcome* outcome) const {
  // One copy first: a promoted backup's entries are stable, but read them once all the same.
  std::memcpy(outcome, At(client, slot), sizeof(MutationOutcome));
  return session != 0 && outcome->session == session && outcome->seq != 0 &&
         outcome->seq % window_ == slot && IsExecutedOutcome(outcome->status);
}

std::vector<uint32_t> OutcomeTable::ClientsWithOutcomes(uint32_t max_clients) const {
  std::vector<uint32_t> clients;
  for (uint32_t client = 0; client < max_clients; ++client) {
    for (uint32_t slot = 0; slot < window_; ++slot) {
      if (At(client, slot)->session != 0) {
        clients.push_back(client);
        break;
      }
    }
  }
  return clients;
}

}  // namespace herd
