// The server's counters: collected from the workers, partitions and fabric, and as JSON.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "herd/server.h"
#include "mica/partition.h"

namespace herd {

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
    stats.internal_errors += k.internal_errors.Get();
    stats.out_of_line.push_back(k.out_of_line.Get());
    stats.copied_values.push_back(k.copied_values.Get());
    const mica::PartitionStats& p = r.worker->partition().stats();
    stats.get_hits.push_back(p.get_hits.Get());
    stats.get_misses.push_back(p.get_misses.Get());
    stats.evictions.push_back(p.evictions.Get());
    stats.log_wraps.push_back(p.log_wraps.Get());
    stats.no_memory += p.no_memory.Get();
  }
  // Every QP and CQ the server ever had: workers' UD QPs and CQs, sessions' connected QPs
  // (WRITE responses are posted on them), departed sessions' included.
  stats.fabric = device_->counters();
  stats.sessions = session_count_.load();
  stats.clients = client_count_.load();
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
      "{\"mops\":%.3f,\"worker_mops\":[%s],\"batch\":%.2f,\"clients\":%d,\"bad\":%d,"
      "\"replays\":%d,\"duplicates\":%d,\"rejected\":%d,\"dropped\":%d,\"no_memory\":%d,"
      "\"internal\":%d,"
      "\"get_hit_ratio\":[%s],\"get_misses\":[%s],\"evictions\":[%s],\"log_wraps\":[%s],"
      "\"out_of_line\":[%s],\"copied_values\":[%s],\"fabric\":%s}",
      requests / seconds / 1e6, absl::StrJoin(mops, ","),
      batches == 0 ? 0.0 : static_cast<double>(requests) / batches, s.clients, s.bad_requests,
      s.replays, s.duplicates, s.rejected, s.dropped, s.no_memory, s.internal_errors,
      absl::StrJoin(hit_ratio, ","), absl::StrJoin(misses, ","), absl::StrJoin(evictions, ","),
      absl::StrJoin(wraps, ","), absl::StrJoin(out_of_line, ","), absl::StrJoin(copied, ","),
      s.fabric.ToJson());
}

}  // namespace herd
