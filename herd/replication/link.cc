#include "herd/replication/link.h"

#include "absl/strings/str_format.h"
#include "mica/index_hash.h"
#include "transport/control/wire.h"

namespace herd {
namespace {

using transport::control::WireReader;
using transport::control::WireWriter;

void Put(WireWriter& w, const ReplicaLayout& l) {
  w.U32(l.mode)
      .U64(l.bucket_count)
      .U64(l.extra_bucket_count)
      .U64(l.buckets_offset)
      .U64(l.index_bytes)
      .U64(l.owner_area_offset)
      .U64(l.owner_area_bytes)
      .U64(l.log_bytes)
      .U64(l.pool_bytes)
      .U64(l.max_item_bytes)
      .U32(l.max_value_bytes)
      .U32(l.checksum_from_value_bytes)
      .U64(l.head_bytes)
      .U64(l.ring_bytes)
      .U64(l.mapped_bytes)
      .U32(l.index_scheme);
}

bool Get(WireReader& r, ReplicaLayout* l) {
  return r.U32(&l->mode) && r.U64(&l->bucket_count) && r.U64(&l->extra_bucket_count) &&
         r.U64(&l->buckets_offset) && r.U64(&l->index_bytes) && r.U64(&l->owner_area_offset) &&
         r.U64(&l->owner_area_bytes) && r.U64(&l->log_bytes) && r.U64(&l->pool_bytes) &&
         r.U64(&l->max_item_bytes) && r.U32(&l->max_value_bytes) &&
         r.U32(&l->checksum_from_value_bytes) && r.U64(&l->head_bytes) && r.U64(&l->ring_bytes) &&
         r.U64(&l->mapped_bytes) && r.U32(&l->index_scheme);
}

}  // namespace

ReplicaLayout LayoutOf(const mica::Partition& partition) {
  const mica::PartitionLayout& p = partition.layout();
  ReplicaLayout l;
  l.mode = static_cast<uint32_t>(p.mode);
  l.bucket_count = p.bucket_count;
  l.extra_bucket_count = p.extra_bucket_count;
  l.buckets_offset = p.buckets_offset;
  l.index_bytes = p.index_bytes;
  l.owner_area_offset = p.owner_area_offset;
  l.owner_area_bytes = p.owner_area_bytes;
  l.log_bytes = p.log_bytes;
  l.pool_bytes = p.pool_bytes;
  l.max_item_bytes = p.max_item_bytes;
  l.max_value_bytes = p.max_value_bytes;
  l.checksum_from_value_bytes = p.checksum_from_value_bytes;
  l.head_bytes = partition.region().head_bytes();
  l.ring_bytes = partition.region().ring_bytes();
  l.mapped_bytes = partition.region().mapped_bytes();
  l.index_scheme = mica::kIndexScheme;
  return l;
}

absl::Status CheckSameLayout(const ReplicaLayout& theirs, const ReplicaLayout& mine) {
  const struct {
    const char* name;
    uint64_t theirs, mine;
  } fields[] = {
      {"index placement scheme (mica/index_hash.h)", theirs.index_scheme, mine.index_scheme},
      {"store mode", theirs.mode, mine.mode},
      {"buckets", theirs.bucket_count, mine.bucket_count},
      {"extra buckets", theirs.extra_bucket_count, mine.extra_bucket_count},
      {"buckets offset", theirs.buckets_offset, mine.buckets_offset},
      {"index bytes", theirs.index_bytes, mine.index_bytes},
      {"mutation outcome table offset", theirs.owner_area_offset, mine.owner_area_offset},
      {"mutation outcome table bytes (max_clients, window)", theirs.owner_area_bytes,
       mine.owner_area_bytes},
      {"log bytes", theirs.log_bytes, mine.log_bytes},
      {"pool bytes", theirs.pool_bytes, mine.pool_bytes},
      {"max item bytes", theirs.max_item_bytes, mine.max_item_bytes},
      {"max value bytes", theirs.max_value_bytes, mine.max_value_bytes},
      {"checksum threshold", theirs.checksum_from_value_bytes, mine.checksum_from_value_bytes},
      // Page rounding (hugepages on one side only) moves the ring and the mirror.
      {"region head bytes (page rounding)", theirs.head_bytes, mine.head_bytes},
      {"region ring bytes (page rounding)", theirs.ring_bytes, mine.ring_bytes},
      {"region mapped bytes", theirs.mapped_bytes, mine.mapped_bytes},
  };
  for (const auto& f : fields) {
    if (f.theirs != f.mine) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the primary's partitions differ from this backup's in %s: %d there, %d here (start "
          "both with the same --store_mode, --mica_* and --max_value_bytes flags, and the same "
          "hugepage setting)",
          f.name, f.theirs, f.mine));
    }
  }
  return absl::OkStatus();
}

std::vector<uint8_t> Encode(const ReplicaHello& hello) {
  WireWriter w;
  w.U32(hello.workers).U64(hello.staging_bytes).U8(hello.transfer ? 1 : 0);
  w.U32(hello.max_clients).U32(hello.window);
  Put(w, hello.layout);
  w.U32(static_cast<uint32_t>(hello.link_qps.size()));
  for (const transport::QpEndpoint& e : hello.link_qps) w.Endpoint(e);
  w.U64(hello.epoch).Bytes(hello.member);
  return w.Take();
}

std::vector<uint8_t> Encode(const ReplicaWelcome& welcome) {
  WireWriter w;
  w.U32(static_cast<uint32_t>(welcome.partitions.size()));
  for (const ReplicaPartition& p : welcome.partitions) {
    w.Endpoint(p.qp).U64(p.region_addr).U32(p.region_rkey).U64(p.redo_addr).U32(p.redo_rkey);
  }
  return w.Take();
}

// A member name (configuration.h allows 64 bytes); more is no name.
constexpr uint32_t kMaxHelloMemberBytes = 64;

absl::StatusOr<ReplicaHello> DecodeReplicaHello(const std::vector<uint8_t>& bytes,
                                                uint32_t max_workers) {
  WireReader r(bytes, "replica hello");
  ReplicaHello hello;
  uint32_t n = 0;
  uint8_t transfer = 0;
  if (r.U32(&hello.workers) && r.U64(&hello.staging_bytes) && r.U8(&transfer) &&
      r.U32(&hello.max_clients) && r.U32(&hello.window) && Get(r, &hello.layout) && r.U32(&n)) {
    if (n != hello.workers || n > max_workers) {
      return absl::InvalidArgumentError(
          absl::StrFormat("replica hello: %d link QPs for %d workers (this backup has %d)", n,
                          hello.workers, max_workers));
    }
    hello.link_qps.resize(n);
    bool endpoints = true;
    for (transport::QpEndpoint& e : hello.link_qps) {
      if (!(endpoints = r.Endpoint(&e))) break;
    }
    if (endpoints && r.U64(&hello.epoch)) r.Bytes(&hello.member, kMaxHelloMemberBytes);
  }
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (transfer > 1) return absl::InvalidArgumentError("replica hello: transfer is neither 0 nor 1");
  hello.transfer = transfer == 1;
  return hello;
}

absl::StatusOr<ReplicaWelcome> DecodeReplicaWelcome(const std::vector<uint8_t>& bytes,
                                                    uint32_t workers) {
  WireReader r(bytes, "replica welcome");
  ReplicaWelcome welcome;
  uint32_t n = 0;
  if (r.U32(&n)) {
    if (n != workers) {
      return absl::InvalidArgumentError(
          absl::StrFormat("replica welcome: %d partitions for %d workers", n, workers));
    }
    welcome.partitions.resize(n);
    for (ReplicaPartition& p : welcome.partitions) {
      if (!(r.Endpoint(&p.qp) && r.U64(&p.region_addr) && r.U32(&p.region_rkey) &&
            r.U64(&p.redo_addr) && r.U32(&p.redo_rkey))) {
        break;
      }
    }
  }
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return welcome;
}

}  // namespace herd
