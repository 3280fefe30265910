#include "herd/replica_reader.h"

#include "herd/replication_log.h"

namespace herd {

ReplicaReader::ReplicaReader(const mica::Partition* partition, const uint8_t* redo_area,
                             const std::atomic<bool>* stale)
    : partition_(partition),
      redo_area_(redo_area),
      stale_(stale),
      scratch_((partition->layout().max_item_bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t)) {}

mica::Response ReplicaReader::Get(const mica::Request& request) {
  counters_.reads.Add();
  if (stale_ != nullptr && stale_->load(std::memory_order_relaxed)) [[unlikely]] {
    counters_.busy.Add();
    return mica::Response{mica::Result::kCorrupt, 0, 0};
  }
  const LandingWords landing(redo_area_);
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
        if (quiet && landing.StillQuiet(begun)) return r;
        counters_.unconfirmed.Add();
        continue;
      default:
        return r;  // a verified value, a large item's place, or a bad key
    }
  }
  counters_.busy.Add();
  return mica::Response{mica::Result::kCorrupt, 0, 0};
}

}  // namespace herd
