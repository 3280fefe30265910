// The server's counters: collected from the workers, partitions and fabric, and as JSON.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "herd/server.h"
#include "mica/partition.h"

namespace herd {
namespace {

void AddStoreLevels(const mica::PartitionStats& p, ServerStats* stats) {
  const mica::StoreGauges& g = p.store;
  stats->store_mode = true;
  const uint64_t page = g.page_bytes.Get();
  stats->pool_bytes += g.pool_pages.Get() * page;
  stats->pool_free_bytes += g.free_pages.Get() * page;
  stats->large_bytes += g.large_pages.Get() * page;
  stats->extra_buckets_in_use.push_back(g.extra_buckets_in_use.Get());
  stats->extra_buckets_capacity = g.extra_buckets_capacity.Get();
  stats->no_memory_pool += p.no_memory_pool.Get();
  stats->no_memory_index += p.no_memory_index.Get();
  stats->moves += p.moves.Get();
  stats->store_classes.resize(mica::kSlabClassCount);
  for (int c = 0; c < mica::kSlabClassCount; ++c) {
    ServerStats::StoreClass& sc = stats->store_classes[c];
    sc.block_bytes = g.class_block_bytes[c].Get();
    sc.used_blocks += g.class_used_blocks[c].Get();
    sc.capacity_blocks += g.class_spans[c].Get() * g.class_span_blocks[c].Get();
  }
}

// Store mode's object: levels now (pool, per class, extra buckets) and counters since the start
// (as the other refusal counters are).
std::string StoreJson(const ServerStats& s) {
  std::vector<std::string> classes;
  uint64_t used_bytes = s.large_bytes;
  for (const ServerStats::StoreClass& c : s.store_classes) {
    used_bytes += c.used_blocks * c.block_bytes;
    if (c.capacity_blocks == 0) continue;
    // Two gauges read one after the other may straddle a new span: never print a wrapped count.
    const uint64_t free_blocks =
        c.capacity_blocks > c.used_blocks ? c.capacity_blocks - c.used_blocks : 0;
    classes.push_back(absl::StrFormat(
        "{\"block\":%d,\"used\":%d,\"free\":%d,\"used_bytes\":%d,\"free_bytes\":%d}", c.block_bytes,
        c.used_blocks, free_blocks, c.used_blocks * c.block_bytes, free_blocks * c.block_bytes));
  }
  return absl::StrFormat(
      "{\"pool_bytes\":%d,\"used_bytes\":%d,\"free_page_bytes\":%d,\"large_bytes\":%d,"
      "\"extra_buckets\":[%s],\"extra_bucket_capacity\":%d,\"no_memory_pool\":%d,"
      "\"no_memory_index\":%d,\"moves\":%d,\"classes\":[%s]}",
      s.pool_bytes, used_bytes, s.pool_free_bytes, s.large_bytes,
      absl::StrJoin(s.extra_buckets_in_use, ","), s.extra_buckets_capacity, s.no_memory_pool,
      s.no_memory_index, s.moves, absl::StrJoin(classes, ","));
}

// The role's object (counters since `since`): a primary's gates, or a backup's reads.
std::string RoleJson(const ServerStats& s, const ServerStats& since) {
  if (s.promoted && s.epoch == 0) {
    return absl::StrFormat(
        "{\"role\":\"primary\",\"promoted\":true,\"backups\":0,\"resumed_outcomes\":%d,"
        "\"unrecorded_outcomes\":%d}",
        s.resumed_outcomes, s.unrecorded_outcomes);
  }
  if (s.role == ReplicationRole::kPrimary) {
    const ReplicationCounters& n = s.replication;
    const ReplicationCounters& b = since.replication;
    const uint64_t batches = n.batches_posted - b.batches_posted;
    return absl::StrFormat(
        "{\"role\":\"primary\",\"backups\":%d,\"live_backups\":%d,\"degraded\":%s,"
        "\"batches\":%d,\"writes\":%d,\"bytes\":%d,\"writes_per_batch\":%.2f,"
        "\"deferred\":%d,\"overflowed\":%d,\"dropped\":%d,\"stalls\":%d,\"released\":%d,"
        "\"reads_held\":%d,\"reads_unanswered\":%d,\"watermarks\":%d,\"joined\":%d,"
        "\"transfer_bytes\":%d}",
        s.backups, s.live_backups, s.live_backups < s.backups ? "true" : "false", batches,
        n.writes_posted - b.writes_posted, n.bytes_posted - b.bytes_posted,
        batches == 0
            ? 0.0
            : static_cast<double>(n.writes_posted - b.writes_posted) / static_cast<double>(batches),
        n.deferred - b.deferred, n.overflowed - b.overflowed, n.links_dropped, n.stalls,
        n.released - b.released, n.reads_held - b.reads_held,
        s.reads_unanswered - since.reads_unanswered, n.watermarks_posted - b.watermarks_posted,
        n.joined, n.transfer_bytes);
  }
  return absl::StrFormat(
      "{\"role\":\"backup\",\"primary_attached\":%s,\"syncing\":%s,\"reads\":%d,"
      "\"torn\":%d,\"unconfirmed\":%d,\"unreleased\":%d,\"held_back\":%d,\"busy\":%d}",
      s.primary_attached ? "true" : "false", s.syncing ? "true" : "false",
      s.replica_reads - since.replica_reads, s.replica_torn - since.replica_torn,
      s.replica_unconfirmed - since.replica_unconfirmed,
      s.replica_unreleased - since.replica_unreleased,
      s.replica_held_back - since.replica_held_back, s.replica_busy - since.replica_busy);
}

// The replication object: the role's, and a coordinated server's epoch, fence and lease.
std::string ReplicationJson(const ServerStats& s, const ServerStats& since) {
  std::string json = RoleJson(s, since);
  if (s.epoch == 0) return json;
  json.pop_back();  // its closing brace
  return absl::StrFormat("%s,\"epoch\":%d,\"fenced\":%s,\"lease_left_s\":%.3f}", json, s.epoch,
                         s.fenced ? "true" : "false", s.lease_left_s);
}

}  // namespace

ServerStats Server::Stats() const {
  ServerStats stats;
  for (const WorkerResources& r : workers_) {
    const WorkerCounters& k = r.worker->counters();
    stats.requests.push_back(k.requests.Get());
    stats.batches.push_back(k.batches.Get());
    stats.bad_requests += k.bad_requests.Get();
    stats.replays += k.replays.Get();
    stats.duplicates += k.duplicates.Get();
    stats.rejected += k.rejected.Get();
    stats.dropped += k.dropped.Get();
    stats.response_queue_full += k.response_queue_full.Get();
    stats.fences += k.fences.Get();
    stats.internal_errors += k.internal_errors.Get();
    stats.resumed_outcomes += k.resumed_outcomes.Get();
    stats.unrecorded_outcomes += k.unrecorded_outcomes.Get();
    stats.reads_unanswered += k.reads_unanswered.Get();
    stats.out_of_line.push_back(k.out_of_line.Get());
    stats.copied_values.push_back(k.copied_values.Get());
    const mica::PartitionStats& p = r.worker->partition().stats();
    stats.get_hits.push_back(p.get_hits.Get());
    stats.get_misses.push_back(p.get_misses.Get());
    stats.evictions.push_back(p.evictions.Get());
    stats.log_wraps.push_back(p.log_wraps.Get());
    stats.no_memory += p.no_memory.Get();
    if (r.worker->partition().layout().mode == mica::StoreMode::kStore) AddStoreLevels(p, &stats);
  }
  stats.role = role_.current();  // alone; a member says what it is
  if (replication_ != nullptr) {
    const MemberStats m = replication_->Stats();
    stats.role = m.role;
    stats.promoted = m.promoted;
    stats.fenced = m.fenced;
    stats.succession = m.succession;
    stats.epoch = m.epoch;
    stats.lease_left_s = m.lease_left_s;
    stats.backups = m.backups;
    stats.live_backups = m.live_backups;
    stats.replication = m.replication;
    stats.syncing = m.syncing;
    stats.replica_reads = m.replica_reads;
    stats.replica_torn = m.replica_torn;
    stats.replica_unconfirmed = m.replica_unconfirmed;
    stats.replica_busy = m.replica_busy;
    stats.replica_unreleased = m.replica_unreleased;
    stats.replica_held_back = m.replica_held_back;
    stats.primary_attached = m.primary_attached;
  }
  // Every QP and CQ the server ever had: workers' UD QPs and CQs, sessions' connected QPs
  // (WRITE responses are posted on them), departed sessions' included.
  stats.fabric = device_->counters();
  stats.sessions = session_count_.load();
  stats.clients = client_count_.load();
  stats.sessions_unreclaimed = graveyard_size_.load(std::memory_order_relaxed);
  return stats;
}

std::string StatsJson(const ServerStats& s, const ServerStats& since, double seconds) {
  // An empty `since` counts from zero.
  const auto before = [](const std::vector<uint64_t>& v, size_t w) {
    return w < v.size() ? v[w] : 0;
  };
  std::vector<std::string> mops, hit_ratio, misses, evictions, wraps, out_of_line, copied;
  uint64_t requests = 0, batches = 0;
  for (size_t w = 0; w < s.requests.size(); ++w) {
    const uint64_t r = s.requests[w] - before(since.requests, w);
    requests += r;
    batches += s.batches[w] - before(since.batches, w);
    mops.push_back(absl::StrFormat("%.3f", r / seconds / 1e6));
    const uint64_t hits = s.get_hits[w] - before(since.get_hits, w);
    const uint64_t missed = s.get_misses[w] - before(since.get_misses, w);
    hit_ratio.push_back(hits + missed == 0
                            ? "null"
                            : absl::StrFormat("%.4f", static_cast<double>(hits) /
                                                          static_cast<double>(hits + missed)));
    misses.push_back(absl::StrCat(missed));
    evictions.push_back(absl::StrCat(s.evictions[w] - before(since.evictions, w)));
    wraps.push_back(absl::StrCat(s.log_wraps[w] - before(since.log_wraps, w)));
    out_of_line.push_back(absl::StrCat(s.out_of_line[w] - before(since.out_of_line, w)));
    copied.push_back(absl::StrCat(s.copied_values[w] - before(since.copied_values, w)));
  }
  return absl::StrFormat(
      "{\"mops\":%.3f,\"worker_mops\":[%s],\"batch\":%.2f,\"clients\":%d,\"sessions\":%d,"
      "\"sessions_unreclaimed\":%d,\"fences\":%d,\"bad\":%d,"
      "\"replays\":%d,\"duplicates\":%d,\"rejected\":%d,\"dropped\":%d,"
      "\"response_queue_full\":%d,\"no_memory\":%d,"
      "\"internal\":%d,"
      "\"get_hit_ratio\":[%s],\"get_misses\":[%s],\"evictions\":[%s],\"log_wraps\":[%s],"
      "\"out_of_line\":[%s],\"copied_values\":[%s],\"mode\":\"%s\",%s%s\"fabric\":%s}",
      requests / seconds / 1e6, absl::StrJoin(mops, ","),
      batches == 0 ? 0.0 : static_cast<double>(requests) / batches, s.clients, s.sessions,
      s.sessions_unreclaimed, s.fences, s.bad_requests, s.replays, s.duplicates, s.rejected,
      s.dropped, s.response_queue_full, s.no_memory, s.internal_errors,
      absl::StrJoin(hit_ratio, ","), absl::StrJoin(misses, ","), absl::StrJoin(evictions, ","),
      absl::StrJoin(wraps, ","), absl::StrJoin(out_of_line, ","), absl::StrJoin(copied, ","),
      s.store_mode ? "store" : "cache",
      s.store_mode ? absl::StrCat("\"store\":", StoreJson(s), ",") : "",
      s.role == ReplicationRole::kNone
          ? ""
          : absl::StrCat("\"replication\":", ReplicationJson(s, since), ","),
      s.fabric.ToJson());
}

}  // namespace herd
