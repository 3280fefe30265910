// mica_bench: single-core batched GET and PUT on one MICA partition in each mode (cache: lossy
// index + circular log; store: lossless index + slab pool), against
// absl::flat_hash_map<std::string, std::string> doing the same work in the same run.
//
//   bazel run -c opt //bench:mica_bench [-- --items=1048576,16777216 --dists=uniform,zipf]
//
// Prints one JSON line per (store, items, dist, op), store being "mica" (cache mode),
// "mica_store" (store mode) or "flat_hash_map", and a final comparison line for the largest
// uniform GET case: {"case":"16M_uniform_get","mica_mops":..,"flat_hash_map_mops":..,"ratio":..,
// "mica_store_mops":..,"store_ratio":..} (ratios: against flat_hash_map).
// Key ranks are generated before timing; key hashing is timed (a server hashes every key).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/keys.h"
#include "bench/zipf.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "mica/keyhash.h"
#include "mica/partition.h"

DEFINE_string(items, "1048576,16777216", "Comma-separated item counts, one store each.");
DEFINE_string(dists, "uniform,zipf", "Key distributions: uniform, zipf.");
DEFINE_uint64(ops, 8000000, "Operations timed per case.");
DEFINE_uint32(batch, 16, "Requests per ExecuteBatch call (a worker's postlist).");
DEFINE_uint32(key_bytes, 16, "Key size.");
DEFINE_uint32(value_bytes, 32, "Value size.");
DEFINE_double(zipf_theta, bench::kYcsbZipfTheta, "Zipf skew (YCSB's default 0.99).");
DEFINE_uint64(seed, 1, "Seed of the key-rank generator.");
DEFINE_bool(hugepages, true, "Try 2 MiB pages for the MICA partition.");
DEFINE_string(modes, "cache,store",
              "MICA modes to run, one partition at a time: cache (lossy index + circular log), "
              "store (lossless index + slab pool).");

namespace {

// Log room per preloaded byte: overwrites during the PUT phase must not push live keys out
// before the GET phases ran (GETs run first; this keeps the PUT phase itself mostly hits).
constexpr double kLogSlack = 1.25;
// Store mode's pool room per preloaded block: the PUT phases overwrite in place (same size), so
// the slack only covers the allocator's page descriptors (0.8%) and span tails (under 1%).
constexpr double kPoolSlack = 1.05;
// Distinct value patterns PUTs cycle through (built before timing).
constexpr int kValuePatterns = 64;

using Clock = std::chrono::steady_clock;

struct Keys {
  uint32_t key_bytes;
  std::vector<char> bytes;
  std::string_view operator[](uint64_t i) const {
    return std::string_view(bytes.data() + i * key_bytes, key_bytes);
  }
};

struct Outcome {
  double mops;
  uint64_t hits;
  uint64_t checksum;  // keeps the compiler from dropping the copied values
};

std::vector<uint64_t> MakeRanks(const std::string& dist, uint64_t items, uint64_t ops) {
  std::mt19937_64 rng(FLAGS_seed);
  std::vector<uint64_t> ranks(ops);
  if (dist == "zipf") {
    bench::ZipfGenerator zipf(items, FLAGS_zipf_theta, /*scrambled=*/true);
    for (uint64_t& r : ranks) r = zipf.Next(rng);
  } else {
    CHECK_EQ(dist, "uniform") << "unknown --dists entry";
    std::uniform_int_distribution<uint64_t> uniform(0, items - 1);
    for (uint64_t& r : ranks) r = uniform(rng);
  }
  return ranks;
}

double MopsSince(Clock::time_point start, uint64_t ops) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(ops) / seconds / 1e6;
}

Outcome RunMica(mica::Partition& partition, const Keys& keys, const std::vector<uint64_t>& ranks,
                bool is_get, const std::vector<std::string>& values) {
  const uint32_t batch = FLAGS_batch;
  std::vector<mica::Request> requests(batch);
  std::vector<mica::Response> responses(batch);
  std::vector<char> out(static_cast<size_t>(batch) * FLAGS_value_bytes);
  for (uint32_t i = 0; i < batch; ++i) {
    requests[i].op = is_get ? mica::OpCode::kGet : mica::OpCode::kPut;
    requests[i].value_out = out.data() + static_cast<size_t>(i) * FLAGS_value_bytes;
    requests[i].value_out_bytes = FLAGS_value_bytes;
  }
  Outcome outcome{0, 0, 0};
  const auto start = Clock::now();
  for (size_t done = 0; done < ranks.size(); done += batch) {
    const size_t n = std::min<size_t>(batch, ranks.size() - done);
    for (size_t i = 0; i < n; ++i) {
      mica::Request& r = requests[i];
      r.key = keys[ranks[done + i]];
      r.keyhash = mica::KeyHash(r.key);
      r.value = values[(done + i) % kValuePatterns];
    }
    partition.ExecuteBatch(absl::MakeConstSpan(requests.data(), n),
                           absl::MakeSpan(responses.data(), n));
    for (size_t i = 0; i < n; ++i) {
      outcome.hits += responses[i].result == mica::Result::kOk;
      outcome.checksum += static_cast<unsigned char>(out[i * FLAGS_value_bytes]);
    }
  }
  outcome.mops = MopsSince(start, ranks.size());
  return outcome;
}

using FlatMap = absl::flat_hash_map<std::string, std::string>;

Outcome RunFlatMap(FlatMap& map, const Keys& keys, const std::vector<uint64_t>& ranks, bool is_get,
                   const std::vector<std::string>& values) {
  std::vector<char> out(FLAGS_value_bytes);
  Outcome outcome{0, 0, 0};
  const auto start = Clock::now();
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::string_view key = keys[ranks[i]];
    auto it = map.find(absl::string_view(key.data(), key.size()));
    if (it == map.end()) continue;
    ++outcome.hits;
    if (is_get) {
      std::memcpy(out.data(), it->second.data(), it->second.size());
      outcome.checksum += static_cast<unsigned char>(out[0]);
    } else {
      it->second.assign(values[i % kValuePatterns]);
    }
  }
  outcome.mops = MopsSince(start, ranks.size());
  return outcome;
}

void PrintCase(const char* store, uint64_t items, const std::string& dist, const char* op,
               const Outcome& outcome, uint64_t ops, double bytes_per_item) {
  std::printf(
      "{\"store\":\"%s\",\"items\":%lu,\"dist\":\"%s\",\"op\":\"%s\",\"mops\":%.3f,"
      "\"hit_ratio\":%.4f,\"batch\":%u,\"key_bytes\":%u,\"value_bytes\":%u,"
      "\"bytes_per_item\":%.1f,\"checksum\":%lu}\n",
      store, items, dist.c_str(), op, outcome.mops, static_cast<double>(outcome.hits) / ops,
      FLAGS_batch, FLAGS_key_bytes, FLAGS_value_bytes, bytes_per_item, outcome.checksum);
  std::fflush(stdout);
}

// The partition `mode` benchmarks `items` items in.
mica::PartitionConfig ConfigFor(mica::StoreMode mode, uint64_t items) {
  mica::PartitionConfig config;
  config.mode = mode;
  config.expected_items = items;
  config.max_value_bytes = FLAGS_value_bytes;
  const uint64_t item_bytes = mica::ItemBytes(FLAGS_key_bytes, FLAGS_value_bytes);
  config.log_bytes = static_cast<uint64_t>(kLogSlack * items * item_bytes);
  const uint64_t block_bytes = mica::SlabBlockBytesFor(item_bytes, mica::kSlabDefaultPageBytes);
  config.pool_bytes = static_cast<uint64_t>(kPoolSlack * items * block_bytes);
  config.try_hugepages = FLAGS_hugepages;
  return config;
}

std::string CaseName(uint64_t items) {
  return items % (1 << 20) == 0 ? absl::StrFormat("%dM", items >> 20) : absl::StrCat(items);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("single-core MICA partition vs absl::flat_hash_map, batched GET/PUT");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (FLAGS_batch == 0 || FLAGS_key_bytes == 0 || FLAGS_key_bytes > mica::kMaxKeyBytes) {
    LOG(ERROR) << "--batch must be positive and --key_bytes in 1.." << mica::kMaxKeyBytes;
    return 2;
  }
  std::vector<uint64_t> item_counts;
  // Debian builds Abseil with its own absl::string_view (not std::string_view).
  for (absl::string_view part : absl::StrSplit(FLAGS_items, ',', absl::SkipEmpty())) {
    uint64_t n;
    if (!absl::SimpleAtoi(part, &n) || n < 2) {
      LOG(ERROR) << "--items entries must be integers >= 2, got '" << part << "'";
      return 2;
    }
    item_counts.push_back(n);
  }
  const std::vector<std::string> dists = absl::StrSplit(FLAGS_dists, ',', absl::SkipEmpty());
  std::vector<std::string> values(kValuePatterns, std::string(FLAGS_value_bytes, '\0'));
  for (int i = 0; i < kValuePatterns; ++i) {
    bench::MakeValue(i, i, FLAGS_value_bytes, values[i].data());
  }

  std::vector<mica::StoreMode> modes;
  for (absl::string_view name : absl::StrSplit(FLAGS_modes, ',', absl::SkipEmpty())) {
    absl::StatusOr<mica::StoreMode> mode = mica::ParseStoreMode(std::string(name));
    if (!mode.ok()) {
      LOG(ERROR) << "--modes: " << mode.status().message();
      return 2;
    }
    modes.push_back(*mode);
  }

  double final_mica = 0, final_store = 0, final_map = 0;
  uint64_t final_items = 0;
  for (const uint64_t items : item_counts) {
    Keys keys{FLAGS_key_bytes, std::vector<char>(items * FLAGS_key_bytes)};
    for (uint64_t i = 0; i < items; ++i) {
      bench::MakeKey(i, FLAGS_key_bytes, keys.bytes.data() + i * FLAGS_key_bytes);
    }
    // The same ranks for every store: the rows of one case differ only in the store.
    std::vector<std::vector<uint64_t>> ranks;
    for (const std::string& dist : dists) ranks.push_back(MakeRanks(dist, items, FLAGS_ops));
    const bool largest_so_far = items >= final_items;
    if (largest_so_far) final_items = items;
    // One partition at a time (a 16M-item one takes gigabytes). All GET phases first, so every
    // GET finds its key; then the PUT phases.
    for (const mica::StoreMode mode : modes) {
      const bool store = mode == mica::StoreMode::kStore;
      auto partition = mica::Partition::Create(ConfigFor(mode, items));
      CHECK(partition.ok()) << partition.status();
      LOG(INFO) << "mica: " << (*partition)->layout().Describe(FLAGS_key_bytes, FLAGS_value_bytes);
      for (uint64_t i = 0; i < items; ++i) {
        const mica::Response r =
            (*partition)->Put(keys[i], mica::KeyHash(keys[i]), values[i % kValuePatterns]);
        CHECK(r.result == mica::Result::kOk) << "preload: " << mica::ResultName(r.result);
      }
      const double mica_bytes =
          (*partition)->layout().BytesPerItem(FLAGS_key_bytes, FLAGS_value_bytes);
      for (const bool is_get : {true, false}) {
        for (size_t d = 0; d < dists.size(); ++d) {
          const Outcome m = RunMica(**partition, keys, ranks[d], is_get, values);
          PrintCase(store ? "mica_store" : "mica", items, dists[d], is_get ? "get" : "put", m,
                    FLAGS_ops, mica_bytes);
          if (is_get && dists[d] == "uniform" && largest_so_far) {
            (store ? final_store : final_mica) = m.mops;
          }
        }
      }
    }
    FlatMap map;
    map.reserve(items);
    for (uint64_t i = 0; i < items; ++i) {
      map.emplace(std::string(keys[i]), values[i % kValuePatterns]);
    }
    // Table memory of the map: slots of two std::strings plus a control byte, plus the heap
    // bytes of strings too long for the small-string buffer (rounded to malloc's 16 bytes).
    auto heap = [](uint32_t n) { return n > 15 ? ((n + 1 + 8 + 15) / 16) * 16 : 0u; };
    const double map_bytes =
        static_cast<double>(map.capacity()) * (sizeof(FlatMap::value_type) + 1) / items +
        heap(FLAGS_key_bytes) + heap(FLAGS_value_bytes);
    for (const bool is_get : {true, false}) {
      for (size_t d = 0; d < dists.size(); ++d) {
        const Outcome f = RunFlatMap(map, keys, ranks[d], is_get, values);
        PrintCase("flat_hash_map", items, dists[d], is_get ? "get" : "put", f, FLAGS_ops,
                  map_bytes);
        if (is_get && dists[d] == "uniform" && largest_so_far) final_map = f.mops;
      }
    }
  }
  if (final_items > 0) {
    std::printf(
        "{\"case\":\"%s_uniform_get\",\"mica_mops\":%.3f,\"flat_hash_map_mops\":%.3f,"
        "\"ratio\":%.2f,\"mica_store_mops\":%.3f,\"store_ratio\":%.2f}\n",
        CaseName(final_items).c_str(), final_mica, final_map, final_mica / final_map, final_store,
        final_store / final_map);
  }
  return 0;
}
