#include "herd/replication/replica_reader.h"

#include "herd/replication/log.h"

namespace herd {

ReplicaReader::ReplicaReader(const mica::Partition* partition, const uint8_t* redo_area,
                             const std::atomic<bool>* stale, const util::Lease* lease)
    : partition_(partition),
      redo_area_(redo_area),
      stale_(stale),
      lease_(lease),
      scratch_((partition->layout().max_item_bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t)) {}

mica::Response ReplicaReader::Get(const mica::Request& request) {
  counters_.reads.Add();
  if ((stale_ != nullptr && stale_->load(std::memory_order_relaxed)) ||
      (lease_ != nullptr && !lease_->Valid())) [[unlikely]] {
    counters_.busy.Add();
    return mica::Response{mica::Result::kCorrupt, 0, 0};
  }
  const LandingWords landing(redo_area_);
  const ReleasedWords released(redo_area_);
  uint32_t unreleased = 0;
  for (uint32_t attempt = 0; attempt < kMaxAttempts; ++attempt) {
    bool quiet = false;
    const uint64_t begun = landing.Quiet(&quiet);
    const mica::Response r =
        partition_->ReadReplica(request.key, request.keyhash, request.value_out,
                                request.value_out_bytes, absl::MakeSpan(scratch_));
    switch (r.result) {
      case mica::Result::kCorrupt:
        counters_.torn.Add();
        continue;
      case mica::Result::kNotFound:
      case mica::Result::kBufferTooSmall:
        if (!quiet || !landing.StillQuiet(begun)) {
          counters_.unconfirmed.Add();
          continue;
        }
        if (r.result == mica::Result::kNotFound ? released.MissReleased()
                                                : released.Released(r.version)) {
          return r;
        }
        break;
      case mica::Result::kOk:
        if (released.Released(r.version)) return r;
        break;
      default:
        return r;  // a bad key
    }
    // What this copy holds is newer than the primary called safe: a failover to a backup that
    // lacks it would take it back. The watermark moves within a link round trip; past a few
    // looks, the client is told to ask again (or the primary, which holds such a read).
    counters_.unreleased.Add();
    if (++unreleased == kMaxUnreleasedAttempts) {
      counters_.held_back.Add();
      break;
    }
  }
  counters_.busy.Add();
  return mica::Response{mica::Result::kCorrupt, 0, 0};
}

}  // namespace herd
