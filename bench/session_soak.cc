// session_soak: many short sessions against running herd servers (join, one GET, leave), and
// what each server process holds as they go: descriptors, mappings, RSS, shared memory, threads,
// departed sessions not yet reclaimed, and the join rate. A server that leaks per session shows
// it here long before a deployment meets vm.max_map_count or a full shm segment (issue 36).
//
// Prints one JSON line per sample (every --sample_every sessions), then a summary: each level's
// growth from the reference sample (the first at or past a tenth of the sessions, once warm) to
// the last, the join rate's ratio over the same span, and "flat": every growth within
// --max_growth (RSS and shared memory: or within --slack_kib). Exits 1 when not flat, 2 on a usage
// error or when a session fails.
//
//   session_soak --server=127.0.0.1:31850 --pids=PID[,PID...] --sessions=20000 --keys=one
//     [--concurrency=2]
#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/client.h"
#include "herd/join.h"
#include "transport/flags.h"

DEFINE_string(server, "127.0.0.1:31850", "host:port of the server the sessions join");
DEFINE_string(pids, "",
              "Comma-separated pids of the server processes to sample (the primary's "
              "first, then its backups)");
DEFINE_string(stats_servers, "",
              "Comma-separated host:port of the same servers, in --pids order, whose stats "
              "(sessions_unreclaimed) are sampled too; default --server for the first");
DEFINE_uint64(sessions, 20000, "Sessions to run (each: join, one GET, leave)");
DEFINE_uint64(sample_every, 0, "Sample every this many sessions (0: a twentieth of --sessions)");
DEFINE_string(keys, "one",
              "one: every session reads one key (one worker serves them all, the others idle); "
              "all: the sessions read 256 keys in turn (every worker)");
DEFINE_double(max_growth, 0.05, "The most any level may grow from the reference sample");
DEFINE_uint64(slack_kib, 512,
              "RSS and shared memory growth up to this many KiB is not growth: the shm arena's "
              "high water follows the join rate (a departed session's rings wait out a 1 s "
              "quarantine before reuse), so a burst of joins touches a few more pages once; a "
              "leak of 100 bytes a session passes it within about 5,300 sessions of the span "
              "measured (CI's 20,000-session run measures 18,000)");
DEFINE_uint32(concurrency, 1,
              "Sessions run at once, each thread joining, reading and leaving in turn (more "
              "than one keeps the server's control thread and the clients busy at once)");

namespace {

struct Levels {
  double fds = 0, maps = 0, rss_kb = 0, shmem_kb = 0, threads = 0, unreclaimed = 0;
};

// One process's levels from /proc; false if it is gone.
bool ReadProc(int pid, Levels* levels) {
  const std::string dir = absl::StrCat("/proc/", pid);
  DIR* fds = opendir((dir + "/fd").c_str());
  if (fds == nullptr) return false;
  levels->fds = 0;
  while (dirent* e = readdir(fds)) levels->fds += e->d_name[0] != '.';
  closedir(fds);
  std::ifstream maps(dir + "/maps");
  levels->maps = 0;
  for (std::string line; std::getline(maps, line);) ++levels->maps;
  std::ifstream status(dir + "/status");
  for (std::string line; std::getline(status, line);) {
    const std::vector<std::string> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t:"), absl::SkipEmpty());
    if (f.size() < 2) continue;
    double v = 0;
    if (!absl::SimpleAtod(f[1], &v)) continue;
    if (f[0] == "VmRSS") levels->rss_kb = v;
    if (f[0] == "RssShmem") levels->shmem_kb = v;
    if (f[0] == "Threads") levels->threads = v;
  }
  return true;
}

// The server's "sessions_unreclaimed" from its stats (-1 if it does not answer).
double Unreclaimed(const std::string& host_port) {
  absl::StatusOr<std::string> json = herd::FetchServerStats(host_port, absl::Seconds(5));
  if (!json.ok()) return -1;
  const std::string key = "\"sessions_unreclaimed\":";
  const size_t at = json->find(key);
  if (at == std::string::npos) return -1;
  return std::atof(json->c_str() + at + key.size());
}

// --keys=all: the sessions read these many keys in turn (every worker's, for any worker count).
constexpr uint64_t kAllKeys = 256;

std::string KeyOf(uint64_t session) {
  return FLAGS_keys == "one" ? "soak" : absl::StrCat("soak-", session % kAllKeys);
}

double Growth(double reference, double last) {
  return reference <= 0 ? (last <= 0 ? 0 : 1e9) : (last - reference) / reference;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("session_soak --server=HOST:PORT --pids=PID[,PID...] [--sessions=N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  std::vector<int> pids;
  for (absl::string_view p : absl::StrSplit(FLAGS_pids, ',', absl::SkipEmpty())) {
    int pid = 0;
    if (!absl::SimpleAtoi(p, &pid) || pid <= 0) {
      fprintf(stderr, "session_soak: --pids: \"%s\" is not a pid\n", std::string(p).c_str());
      return 2;
    }
    pids.push_back(pid);
  }
  std::vector<std::string> stats_servers =
      absl::StrSplit(FLAGS_stats_servers, ',', absl::SkipEmpty());
  if (stats_servers.empty()) stats_servers.push_back(FLAGS_server);
  if (pids.empty() || stats_servers.size() > pids.size() || FLAGS_sessions == 0 ||
      (FLAGS_keys != "one" && FLAGS_keys != "all")) {
    fprintf(stderr,
            "session_soak: needs --pids (the servers to sample), --sessions > 0, --keys=one|all "
            "and at most one --stats_servers entry per pid\n");
    return 2;
  }
  absl::StatusOr<transport::DeviceOptions> device = transport::DeviceOptionsFromFlags();
  if (!device.ok()) {
    fprintf(stderr, "session_soak: %s\n", device.status().ToString().c_str());
    return 2;
  }
  const uint64_t every =
      FLAGS_sample_every > 0 ? FLAGS_sample_every : std::max<uint64_t>(1, FLAGS_sessions / 20);
  herd::ClientOptions options;
  options.server = FLAGS_server;
  options.device = *device;
  // The keys first, in a session of their own: every later session only reads, so the store's
  // log does not grow with the sessions (that would be data, not a leak).
  {
    absl::StatusOr<std::unique_ptr<herd::Client>> client = herd::Client::Connect(options);
    if (!client.ok()) {
      fprintf(stderr, "session_soak: join: %s\n", client.status().ToString().c_str());
      return 2;
    }
    for (uint64_t k = 0; k < (FLAGS_keys == "one" ? 1 : kAllKeys); ++k) {
      if (absl::StatusOr<uint64_t> put = (*client)->Put(KeyOf(k), "v"); !put.ok()) {
        fprintf(stderr, "session_soak: PUT: %s\n", put.status().ToString().c_str());
        return 2;
      }
    }
  }
  // The sessions, run by --concurrency threads that claim them in order; this thread samples
  // the servers each time another `every` sessions have left.
  absl::Mutex mu;
  uint64_t next = 1, done = 0;
  std::string failure;  // the first session that failed
  auto run_sessions = [&] {
    for (;;) {
      uint64_t s = 0;
      {
        absl::MutexLock lock(&mu);
        if (!failure.empty() || next > FLAGS_sessions) return;
        s = next++;
      }
      std::string error;
      {
        absl::StatusOr<std::unique_ptr<herd::Client>> client = herd::Client::Connect(options);
        if (!client.ok()) {
          error = absl::StrFormat("session %d: join: %s", s, client.status().ToString());
        } else if (absl::StatusOr<herd::Value> got = (*client)->Get(KeyOf(s)); !got.ok()) {
          error = absl::StrFormat("session %d: GET: %s", s, got.status().ToString());
        }
      }  // leaves
      absl::MutexLock lock(&mu);
      if (!error.empty() && failure.empty()) failure = error;
      ++done;
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < std::max<uint32_t>(1, FLAGS_concurrency); ++t) {
    threads.emplace_back(run_sessions);
  }
  auto join_all = [&] {
    for (std::thread& t : threads) t.join();
  };
  std::vector<Levels> reference, last;
  double reference_rate = 0, last_rate = 0;
  absl::Time interval_start = absl::Now();
  uint64_t interval_first = 0;
  for (uint64_t target = every; target <= FLAGS_sessions; target += every) {
    uint64_t s = 0;
    {
      absl::MutexLock lock(&mu);
      auto reached = [&] { return done >= target || !failure.empty(); };
      mu.Await(absl::Condition(&reached));
      if (!failure.empty()) break;
      s = done;
    }
    const double rate = (s - interval_first) / absl::ToDoubleSeconds(absl::Now() - interval_start);
    std::vector<Levels> now(pids.size());
    std::vector<std::string> servers;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (!ReadProc(pids[i], &now[i])) {
        absl::MutexLock lock(&mu);
        failure = absl::StrFormat("server pid %d is gone", pids[i]);
        break;
      }
      now[i].unreclaimed = i < stats_servers.size() ? Unreclaimed(stats_servers[i]) : -1;
      servers.push_back(absl::StrFormat(
          "{\"pid\":%d,\"fds\":%.0f,\"maps\":%.0f,\"rss_kb\":%.0f,\"shmem_kb\":%.0f,"
          "\"threads\":%.0f,\"sessions_unreclaimed\":%.0f}",
          pids[i], now[i].fds, now[i].maps, now[i].rss_kb, now[i].shmem_kb, now[i].threads,
          now[i].unreclaimed));
    }
    if (servers.size() < pids.size()) break;
    printf("{\"sessions\":%lu,\"joins_per_s\":%.1f,\"servers\":[%s]}\n", s, rate,
           absl::StrJoin(servers, ",").c_str());
    fflush(stdout);
    if (reference.empty() && s >= FLAGS_sessions / 10) {
      reference = now;
      reference_rate = rate;
    }
    last = now;
    last_rate = rate;
    // Sampling is not counted in the rate (the sessions that ran meanwhile are).
    interval_start = absl::Now();
    absl::MutexLock lock(&mu);
    interval_first = done;
  }
  join_all();
  if (!failure.empty()) {
    fprintf(stderr, "session_soak: %s\n", failure.c_str());
    return 2;
  }
  if (reference.empty()) {
    fprintf(stderr, "session_soak: no sample (--sample_every > --sessions?)\n");
    return 2;
  }
  bool flat = true;
  std::vector<std::string> growths;
  for (size_t i = 0; i < pids.size(); ++i) {
    const Levels& r = reference[i];
    const Levels& l = last[i];
    const double g[] = {Growth(r.fds, l.fds), Growth(r.maps, l.maps), Growth(r.rss_kb, l.rss_kb),
                        Growth(r.shmem_kb, l.shmem_kb), Growth(r.threads, l.threads)};
    const double slack = static_cast<double>(FLAGS_slack_kib);
    flat = flat && g[0] <= FLAGS_max_growth && g[1] <= FLAGS_max_growth &&
           (g[2] <= FLAGS_max_growth || l.rss_kb - r.rss_kb <= slack) &&
           (g[3] <= FLAGS_max_growth || l.shmem_kb - r.shmem_kb <= slack) &&
           g[4] <= FLAGS_max_growth;
    // Departed sessions still waiting must not pile up: at most what a sample interval leaves.
    flat = flat && l.unreclaimed <= static_cast<double>(every) / 10;
    growths.push_back(absl::StrFormat(
        "{\"pid\":%d,\"fds\":%.4f,\"maps\":%.4f,\"rss\":%.4f,\"shmem\":%.4f,\"threads\":%.4f,"
        "\"rss_kib\":%.0f,\"shmem_kib\":%.0f,\"sessions_unreclaimed\":%.0f}",
        pids[i], g[0], g[1], g[2], g[3], g[4], l.rss_kb - r.rss_kb, l.shmem_kb - r.shmem_kb,
        l.unreclaimed));
  }
  printf(
      "{\"case\":\"session_soak\",\"sessions\":%lu,\"keys\":\"%s\",\"growth\":[%s],"
      "\"joins_per_s\":[%.1f,%.1f],\"flat\":%s}\n",
      FLAGS_sessions, FLAGS_keys.c_str(), absl::StrJoin(growths, ",").c_str(), reference_rate,
      last_rate, flat ? "true" : "false");
  return flat ? 0 : 1;
}
