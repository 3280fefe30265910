// prefetch_bench: what a software prefetch costs the thread that issues it, when its line is
// not cached and its page's translation is, or is not, in the TLB. MICA's batch (mica/batch.cc)
// prefetches a bucket and an item per request before executing any; whether those prefetches
// run in the background or hold up the core decides how to order them.
//
//   bazel build --config=opt //bench:prefetch_bench && bazel-bin/bench/prefetch_bench --core=1
//
// Each round flushes --lines lines, each in a page of its own, then times --lines iterations of
// "prefetch a line, then --work dependent multiply-adds" (the work stands for what a batch does
// between two prefetches). Cases: "none" (the same loop without the prefetches), "tlb_warm"
// (the pages were just touched on another line: translations cached, data not), "tlb_cold"
// (random pages of a --region_mib region, the TLB then flooded by touching kTlbFloodPages pages of
// another region), "tlb_cold_grouped" (the same, but all the work first and then the
// prefetches back to back, as mica/batch.cc orders them). One JSON line per (case, work): ns per
// round, and ns per prefetch over "none". A prefetch the core does not wait for costs about nothing
// over "none"; one that waits for its page walk costs the walk, for every prefetch the reorder
// buffer cannot look past.
#include <sys/mman.h>
#include <x86intrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/pinning.h"
#include "util/prefetch.h"

DEFINE_uint64(region_mib, 1024,
              "MiB the cold pages are drawn from (and the size of the flood's region).");
DEFINE_uint32(lines, 16, "Prefetches per round (a worker's batch).");
DEFINE_string(work, "5,20,60", "Dependent multiply-adds after each prefetch, one case each.");
DEFINE_uint32(rounds, 3000, "Rounds timed per case.");
DEFINE_bool(hugepages, false,
            "Ask for transparent 2 MiB pages (MADV_HUGEPAGE) instead of refusing them.");
DEFINE_int32(core, -1, "Pin to this core (-1: no pinning).");

namespace {

constexpr uint64_t kPageBytes = 4096;
constexpr uint64_t kLineBytes = 64;
constexpr uint64_t kMiB = uint64_t{1} << 20;
// Pages touched to push the cold pages' translations out of the TLB: more than the 3,072
// entries of the largest second-level data TLB of current x86 cores.
constexpr int kTlbFloodPages = 6000;
// How long the timestamp counter is compared against the steady clock to convert ticks to ns.
constexpr auto kCalibration = std::chrono::milliseconds(200);
// Pages the tlb_warm case draws from: few enough to stay in the first-level TLB.
constexpr uint64_t kWarmPages = 32;

enum class Case { kNone, kTlbWarm, kTlbCold, kTlbColdGrouped };
const char* CaseName(Case c) {
  switch (c) {
    case Case::kNone:
      return "none";
    case Case::kTlbWarm:
      return "tlb_warm";
    case Case::kTlbCold:
      return "tlb_cold";
    case Case::kTlbColdGrouped:
      return "tlb_cold_grouped";
  }
  return "?";
}

// A dependency chain of `n` multiply-adds the compiler cannot fold.
inline uint64_t Work(uint64_t x, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    x = x * 0x9E3779B97F4A7C15ULL + 1;
    asm volatile("" : "+r"(x));
  }
  return x;
}

char* MapRegion(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  PCHECK(p != MAP_FAILED) << "mmap of " << bytes << " bytes";
  PCHECK(madvise(p, bytes, FLAGS_hugepages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) == 0);
  std::memset(p, 1, bytes);  // every page present: no faults while timed
  return static_cast<char*>(p);
}

double TicksPerNs() {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t c0 = __rdtsc();
  std::this_thread::sleep_for(kCalibration);
  const uint64_t c1 = __rdtsc();
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  return static_cast<double>(c1 - c0) / static_cast<double>(ns);
}

// Mean ticks per round.
double Measure(Case c, uint32_t work, char* region, char* flood, uint64_t pages,
               std::mt19937_64& rng, uint64_t* sink) {
  std::vector<const char*> lines(FLAGS_lines);
  uint64_t x = *sink;
  uint64_t ticks = 0;
  for (uint32_t round = 0; round < FLAGS_rounds; ++round) {
    for (const char*& line : lines) {
      const bool cold = c == Case::kTlbCold || c == Case::kTlbColdGrouped;
      const uint64_t page = cold ? rng() % pages : rng() % kWarmPages;
      // Line 1 and up: line 0 of each page is what tlb_warm touches to load its translation.
      line = region + page * kPageBytes + (1 + rng() % (kPageBytes / kLineBytes - 1)) * kLineBytes;
      if (c == Case::kTlbWarm)
        x += *reinterpret_cast<volatile const char*>(region + page * kPageBytes);
    }
    _mm_mfence();
    for (const char* line : lines) _mm_clflush(line);
    _mm_mfence();
    if (c == Case::kTlbCold || c == Case::kTlbColdGrouped) {
      for (int i = 0; i < kTlbFloodPages; ++i) {
        x += *reinterpret_cast<volatile const char*>(flood + (rng() % pages) * kPageBytes);
      }
      _mm_mfence();
    }
    const uint64_t start = __rdtsc();
    if (c == Case::kTlbColdGrouped) {
      for (size_t i = 0; i < lines.size(); ++i) x = Work(x, work);
      for (const char* line : lines) util::PrefetchForRead(line);
    } else {
      for (const char* line : lines) {
        if (c != Case::kNone) util::PrefetchForRead(line);
        x = Work(x, work);
      }
    }
    ticks += __rdtsc() - start;
  }
  *sink = x;
  return static_cast<double>(ticks) / FLAGS_rounds;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("What a software prefetch costs its thread, TLB warm and cold.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_lines == 0 || FLAGS_rounds == 0 || FLAGS_region_mib == 0) {
    fprintf(stderr, "prefetch_bench: --lines, --rounds and --region_mib must be positive\n");
    return 2;
  }
  std::vector<uint32_t> works;
  for (absl::string_view w : absl::StrSplit(FLAGS_work, ',')) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(w, &n)) {
      fprintf(stderr, "prefetch_bench: --work=%s: want comma-separated counts\n",
              FLAGS_work.c_str());
      return 2;
    }
    works.push_back(n);
  }
  if (FLAGS_core >= 0) {
    if (absl::Status s = herd::PinCallingThreadTo(FLAGS_core); !s.ok()) {
      fprintf(stderr, "prefetch_bench: --core=%d: %s\n", FLAGS_core, s.ToString().c_str());
      return 2;
    }
  }
  const uint64_t bytes = FLAGS_region_mib * kMiB;
  const uint64_t pages = bytes / kPageBytes;
  if (pages < kWarmPages) {
    fprintf(stderr, "prefetch_bench: --region_mib must hold at least %lu pages\n",
            static_cast<unsigned long>(kWarmPages));
    return 2;
  }
  char* region = MapRegion(bytes);
  char* flood = MapRegion(bytes);
  const double ticks_per_ns = TicksPerNs();
  std::mt19937_64 rng(1);
  uint64_t sink = 1;
  for (uint32_t work : works) {
    const double none = Measure(Case::kNone, work, region, flood, pages, rng, &sink);
    for (Case c : {Case::kNone, Case::kTlbWarm, Case::kTlbCold, Case::kTlbColdGrouped}) {
      const double ticks =
          c == Case::kNone ? none : Measure(c, work, region, flood, pages, rng, &sink);
      printf(
          "{\"bench\":\"prefetch\",\"case\":\"%s\",\"work\":%u,\"lines\":%u,\"hugepages\":%s,"
          "\"round_ns\":%.1f,\"extra_ns_per_prefetch\":%.2f}\n",
          CaseName(c), work, FLAGS_lines, FLAGS_hugepages ? "true" : "false", ticks / ticks_per_ns,
          (ticks - none) / ticks_per_ns / FLAGS_lines);
    }
  }
  if (sink == 0) fprintf(stderr, "\n");  // keeps the timed loads and work from being dropped
  return 0;
}
