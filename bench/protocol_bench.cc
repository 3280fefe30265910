// protocol_bench: the per-request CPU cost of herd's wire format, on one core, no fabric. What a
// client pays to encode a request (key, value, header, keyed checksum), what a worker pays to
// parse and check it (lengths, checksum, fields, key hash), and the checksum alone, at several
// value sizes. JSON lines: {"case","value_bytes","request_bytes","ns_per_op"}.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gflags/gflags.h"
#include "herd/protocol.h"
#include "mica/keyhash.h"

DEFINE_uint32(iterations, 2'000'000, "Operations timed per case");
DEFINE_string(value_bytes, "0,32,128,512", "Value sizes to time (a GET carries none)");
DEFINE_uint32(key_bytes, 16, "Key size");

namespace {

using Clock = std::chrono::steady_clock;
// The session secret of the timed requests: any nonzero value.
constexpr uint64_t kSecret = 0x5eed5eed5eed5eedULL;

template <typename Body>
double NsPerOp(uint32_t iterations, Body&& body) {
  const Clock::time_point start = Clock::now();
  for (uint32_t i = 0; i < iterations; ++i) body(i);
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / iterations;
}

void Report(const char* name, uint32_t value_bytes, uint32_t request_bytes, double ns) {
  std::printf("{\"case\":\"%s\",\"value_bytes\":%u,\"request_bytes\":%u,\"ns_per_op\":%.2f}\n",
              name, value_bytes, request_bytes, ns);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("protocol_bench: herd's per-request encode/parse/checksum cost");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const std::string key(FLAGS_key_bytes, 'k');
  volatile uint64_t sink = 0;  // keeps results alive
  for (const absl::string_view size : absl::StrSplit(FLAGS_value_bytes, ',')) {
    uint32_t value_bytes = 0;
    if (!absl::SimpleAtoi(size, &value_bytes)) {
      std::fprintf(stderr, "protocol_bench: --value_bytes: %s is not a number\n",
                   std::string(size).c_str());
      return 1;
    }
    const std::string value(value_bytes, 'v');
    herd::RequestHeader header{};
    header.keyhash = mica::KeyHash(key);
    header.value_bytes = value_bytes;
    header.key_bytes = static_cast<uint16_t>(key.size());
    header.op = static_cast<uint8_t>(value_bytes == 0 ? herd::Op::kGet : herd::Op::kPut);
    const uint32_t bytes =
        herd::RequestBytes(static_cast<herd::Op>(header.op), key.size(), value_bytes);
    std::vector<uint8_t> message(bytes);
    const herd::RequestLimits limits{static_cast<uint32_t>(key.size()), value_bytes};

    Report("encode", value_bytes, bytes, NsPerOp(FLAGS_iterations, [&](uint32_t i) {
             header.seq = i + 1;
             sink = sink + herd::EncodeRequest(header, key, value, kSecret, message.data());
           }));
    Report("checksum", value_bytes, bytes, NsPerOp(FLAGS_iterations, [&](uint32_t i) {
             message[0] = static_cast<uint8_t>(i);  // a new input each time
             sink = sink + herd::WireChecksum(kSecret, message.data(), bytes);
           }));
    header.seq = 1;
    herd::EncodeRequest(header, key, value, kSecret, message.data());
    herd::ParsedRequest parsed;
    herd::Status status;
    Report("parse", value_bytes, bytes, NsPerOp(FLAGS_iterations, [&](uint32_t) {
             sink = sink + static_cast<uint64_t>(herd::ParseRequest(message.data(), bytes, limits,
                                                                    kSecret, &parsed, &status));
           }));
    Report("keyhash", value_bytes, bytes, NsPerOp(FLAGS_iterations, [&](uint32_t i) {
             sink = sink + mica::KeyHash(parsed.key()) + i;
           }));
  }
  return 0;
}
