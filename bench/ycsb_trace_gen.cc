#include "bench/ycsb_trace_gen.h"

#include <memory>
#include <random>

#include "bench/zipf.h"
#include "hopscotch/hash.h"
#include "hopscotch/ycsb_trace.h"

namespace bench {
namespace {

std::string_view ValueText(const hopscotch::Value& value) {
  return std::string_view(reinterpret_cast<const char*>(value.data()), value.size());
}

}  // namespace

absl::Status WriteTrace(const TraceOptions& o, std::ostream& out, TraceCounts* counts) {
  const double sum = o.read_proportion + o.update_proportion + o.insert_proportion;
  if (o.read_proportion < 0 || o.update_proportion < 0 || o.insert_proportion < 0 || !(sum > 0)) {
    return absl::InvalidArgumentError("proportions must be >= 0 and not all 0");
  }
  if (o.records == 0 && o.operations > 0 && o.insert_proportion < sum) {
    return absl::InvalidArgumentError("reads and updates need --records >= 1");
  }
  *counts = TraceCounts{};
  for (uint64_t i = 0; i < o.records; ++i) {
    const std::string key = hopscotch::YcsbKeyName(i);
    out << hopscotch::FormatInsert(o.table, key, ValueText(hopscotch::ExpectedValue(key))) << '\n';
  }
  counts->inserts = o.records;
  std::mt19937_64 rng(o.seed);
  std::unique_ptr<ZipfGenerator> zipf;
  if (o.zipfian) {
    const auto expected_new =
        static_cast<uint64_t>(o.operations * (o.insert_proportion / sum) * 2.0);
    zipf = std::make_unique<ZipfGenerator>(std::max<uint64_t>(o.records + expected_new, 2),
                                           kYcsbZipfTheta, /*scrambled=*/true);
  }
  uint64_t inserted = o.records;
  std::uniform_real_distribution<double> pick(0.0, sum);
  for (uint64_t op = 0; op < o.operations; ++op) {
    const double p = pick(rng);
    if (p >= o.read_proportion + o.update_proportion || inserted == 0) {
      const std::string key = hopscotch::YcsbKeyName(inserted++);
      out << hopscotch::FormatInsert(o.table, key, ValueText(hopscotch::ExpectedValue(key)))
          << '\n';
      ++counts->inserts;
      continue;
    }
    uint64_t keynum;
    if (zipf != nullptr) {
      do keynum = zipf->Next(rng);
      while (keynum >= inserted);
    } else {
      keynum = std::uniform_int_distribution<uint64_t>(0, o.records - 1)(rng);
    }
    const std::string key = hopscotch::YcsbKeyName(keynum);
    if (p < o.read_proportion) {
      out << hopscotch::FormatRead(o.table, key) << '\n';
      ++counts->reads;
    } else {
      out << hopscotch::FormatUpdate(o.table, key, ValueText(hopscotch::ExpectedValue(key)))
          << '\n';
      ++counts->updates;
    }
  }
  if (!out) return absl::DataLossError("write failed");
  return absl::OkStatus();
}

}  // namespace bench
