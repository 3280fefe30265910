#include "bench/hop_replay.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "bench/histogram.h"
#include "hopscotch/ycsb_trace.h"

namespace bench {
namespace {

using Clock = std::chrono::steady_clock;
using hopscotch::LookupResult;

struct Expectations {
  absl::flat_hash_map<std::string, hopscotch::Value> values;  // from INSERT lines
  std::vector<std::string> lookups;                           // READ lines' keys, in order
};

absl::StatusOr<Expectations> ReadTraces(const std::vector<std::string>& paths) {
  Expectations e;
  for (const std::string& path : paths) {
    absl::StatusOr<hopscotch::TraceFile> file = hopscotch::TraceFile::Open(path);
    if (!file.ok()) return file.status();
    hopscotch::TraceRecord record;
    for (;;) {
      absl::StatusOr<bool> more = file->Next(&record);
      if (!more.ok()) return more.status();
      if (!*more) break;
      if (record.op == hopscotch::TraceOp::kInsert) {
        e.values[record.key] = hopscotch::ValueFor(record);
      } else if (record.op == hopscotch::TraceOp::kRead) {
        e.lookups.push_back(record.key);
      }
    }
  }
  if (e.lookups.empty()) {
    return absl::InvalidArgumentError("no READ line in the trace(s): nothing to look up");
  }
  return e;
}

// One thread's tally.
struct Tally {
  ReplayResult counts;
  Histogram latency_ns;
};

// What a lookup in flight is: its key (an index into the lookups) and when it was submitted.
struct Ticket {
  uint64_t key = 0;
  Clock::time_point start;
};

absl::Status RunThread(const ReplayOptions& o, const Expectations& e, uint32_t thread,
                       Clock::time_point stop_at, Tally* tally, transport::CounterSnapshot* fabric,
                       hopscotch::ClientStats* stats) {
  absl::StatusOr<std::unique_ptr<hopscotch::Client>> client = hopscotch::Client::Connect(o.client);
  if (!client.ok()) return client.status();
  if (o.on_joined) o.on_joined();
  const uint32_t window = o.client.window;
  std::vector<Ticket> tickets(window);
  std::vector<uint32_t> free_tickets;
  for (uint32_t t = 0; t < window; ++t) free_tickets.push_back(t);
  std::vector<hopscotch::LookupDone> done(window);
  const bool timed = o.duration_s > 0;
  uint64_t next = thread;  // this thread's share: every threads-th lookup
  uint32_t pass = 0;
  ReplayResult& c = tally->counts;
  auto more = [&] {
    if (next >= e.lookups.size()) {
      ++pass;
      next = thread;
      if (thread >= e.lookups.size()) return false;  // more threads than lookups
    }
    return timed ? Clock::now() < stop_at : pass < o.passes;
  };
  bool submitting = more();
  while (submitting || (*client)->in_flight() > 0) {
    while (submitting && !free_tickets.empty()) {
      const uint32_t t = free_tickets.back();
      tickets[t] = Ticket{next, Clock::now()};
      if (absl::Status s = (*client)->Submit(e.lookups[next], t); !s.ok()) {
        // Its server failed (an earlier READ said so): a failed lookup, then drain and report.
        if (!absl::IsUnavailable(s)) return s;
        ++c.lookups;
        ++c.failed;
        submitting = false;
        break;
      }
      free_tickets.pop_back();
      next += o.threads;
      submitting = more();
    }
    const size_t n = (*client)->Poll(absl::MakeSpan(done));
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < n; ++i) {
      const hopscotch::LookupDone& d = done[i];
      const Ticket& ticket = tickets[d.tag];
      tally->latency_ns.Record(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - ticket.start).count()));
      ++c.lookups;
      const std::string& key = e.lookups[ticket.key];
      const auto expected = e.values.find(key);
      if (!d.status.ok()) {
        ++c.failed;
      } else if (d.result.kind == LookupResult::Kind::kTorn) {
        ++c.torn;
      } else if (d.result.kind == LookupResult::Kind::kFound) {
        ++c.found;
        if (expected == e.values.end()) {
          ++c.unexpected_hits;
        } else if (d.result.value != expected->second) {
          ++c.wrong_values;
        }
      } else {
        ++c.misses;
        if (expected == e.values.end()) {
          ++c.expected_misses;
        } else {
          ++c.false_misses;
        }
      }
      free_tickets.push_back(static_cast<uint32_t>(d.tag));
    }
    if (c.failed > 0) submitting = false;  // a server is gone: drain and report
  }
  *fabric = (*client)->counters();
  *stats = (*client)->stats();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ReplayResult> ReplayLookups(const ReplayOptions& o) {
  if (o.threads == 0) return absl::InvalidArgumentError("threads must be >= 1");
  absl::StatusOr<Expectations> expectations = ReadTraces(o.traces);
  if (!expectations.ok()) return expectations.status();
  std::vector<Tally> tallies(o.threads);
  std::vector<transport::CounterSnapshot> fabrics(o.threads);
  std::vector<hopscotch::ClientStats> stats(o.threads);
  std::vector<absl::Status> statuses(o.threads);
  const Clock::time_point start = Clock::now();
  const Clock::time_point stop_at = start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(o.duration_s));
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < o.threads; ++t) {
    threads.emplace_back([&, t] {
      statuses[t] = RunThread(o, *expectations, t, stop_at, &tallies[t], &fabrics[t], &stats[t]);
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  ReplayResult r;
  Histogram latency;
  for (uint32_t t = 0; t < o.threads; ++t) {
    const ReplayResult& c = tallies[t].counts;
    r.lookups += c.lookups;
    r.found += c.found;
    r.misses += c.misses;
    r.expected_misses += c.expected_misses;
    r.wrong_values += c.wrong_values;
    r.false_misses += c.false_misses;
    r.unexpected_hits += c.unexpected_hits;
    r.torn += c.torn;
    r.failed += c.failed;
    r.reads += stats[t].reads;
    r.rereads += stats[t].rereads;
    r.confirm_reads += stats[t].confirm_reads;
    r.fabric.Add(fabrics[t]);
    latency.Merge(tallies[t].latency_ns);
  }
  r.threads = o.threads;
  r.servers = static_cast<uint32_t>(o.client.servers.size());
  r.window = o.client.window;
  r.seconds = seconds;
  r.mops = seconds > 0 ? static_cast<double>(r.lookups) / seconds / 1e6 : 0;
  r.p50_us = static_cast<double>(latency.Quantile(0.5)) / 1e3;
  r.p99_us = static_cast<double>(latency.Quantile(0.99)) / 1e3;
  return r;
}

std::string ReplayResult::ToJson() const {
  const double per = lookups > 0 ? 1.0 / static_cast<double>(lookups) : 0;
  return absl::StrFormat(
      "{\"system\":\"hopscotch\",\"threads\":%u,\"servers\":%u,\"window\":%u,\"lookups\":%u,"
      "\"seconds\":%.3f,\"mops\":%.4f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"found\":%u,"
      "\"misses\":%u,\"expected_misses\":%u,\"wrong_values\":%u,\"false_misses\":%u,"
      "\"unexpected_hits\":%u,\"torn\":%u,\"failed\":%u,\"reads\":%u,\"rereads\":%u,"
      "\"confirm_reads\":%u,\"reads_per_lookup\":%.4f,\"bytes_per_lookup\":%.1f,"
      "\"doorbells_per_lookup\":%.4f,\"fabric\":%s,"
      "\"passed\":%s}",
      threads, servers, window, lookups, seconds, mops, p50_us, p99_us, found, misses,
      expected_misses, wrong_values, false_misses, unexpected_hits, torn, failed, reads, rereads,
      confirm_reads, static_cast<double>(reads) * per, static_cast<double>(fabric.bytes) * per,
      static_cast<double>(fabric.doorbells) * per, fabric.ToJson(), passed() ? "true" : "false");
}

}  // namespace bench
