// herd's own history checker: self-checking values, a recorded history of GET/PUT/DELETE/CAS
// operations (invocation and completion on CLOCK_MONOTONIC, which every process of one machine
// shares), its serialization, and a per-key linearizability check that uses the store's versions
// as the order of the writes.
//
// What Check() proves, per key (one key lives in one MICA partition, whose clock hands out
// strictly increasing versions, so a correct server's writes to a key are totally ordered by
// version and that order is a legal linearization order):
//   1. every value a GET returned is well formed, of its key, and is the value of the write that
//      produced the version the GET reports (no torn or mixed value, no value/version mismatch);
//   2. no stale read (a read sees at least the newest version acknowledged or observed before it
//      was invoked) and no read from the future (the write it saw was invoked before the read
//      completed); a write's version is newer than everything seen before it was invoked;
//   3. no lost acknowledged write: a NOT_FOUND is legal only if no write was seen before it, or
//      a DELETE at least as new as everything seen before it was invoked before it completed;
//   4. versions are unique among a key's writes; a successful CAS's expected version is that of
//      the write immediately before it in version order (and not a DELETE);
//   5. no write is applied twice or applied although it was answered as not applied: its value
//      is never seen under any version but the one it was acknowledged (or first seen) with.
// What it cannot prove: an operation that timed out (outcome unknown) may or may not have taken
// effect; a PUT/CAS of that kind that some read saw gets that version, otherwise it is ignored,
// and a timed-out DELETE may explain any later NOT_FOUND. A double application that nobody ever
// read, and a write that was applied and overwritten before any read, leave no trace. The checks
// are the necessary conditions above, not a complete linearizability search.
#ifndef HERD_TESTS_HERD_HISTORY_H_
#define HERD_TESTS_HERD_HISTORY_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "herd/protocol.h"

namespace herd::testing::history {

// ---- Self-checking values ----
//
// value = [magic "HV1\0"][key u32][writer u32][length u32][seq u64][fill ...], little-endian;
// fill word i is a hash of (key, writer, seq, length, i), so any byte of another write, of
// another key, of another length, or garbage is detected from the value alone.
inline constexpr uint32_t kValueMagic = 0x00315648;  // "HV1\0"
inline constexpr uint32_t kValueHeaderBytes = 24;    // the smallest value

struct ValueId {
  uint32_t key = 0;
  uint32_t writer = 0;
  uint64_t seq = 0;
  uint32_t length = 0;
};

// `length` >= kValueHeaderBytes.
std::string EncodeValue(const ValueId& id);
// The identity of a well-formed value, or InvalidArgument naming the first inconsistency (and
// the first bytes, hex).
absl::StatusOr<ValueId> DecodeValue(std::string_view bytes);

// ---- Histories ----

// Completion time of an operation whose outcome is unknown (timed out): it may take effect at
// any time after its invocation.
inline constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// One operation as its client saw it.
struct Event {
  int64_t invoke_ns = 0;    // CLOCK_MONOTONIC, taken before Submit
  int64_t complete_ns = 0;  // CLOCK_MONOTONIC, taken after Poll delivered it; kNever: unknown
  uint32_t key = 0;         // key index
  uint32_t writer = 0;      // globally unique logical client
  uint64_t seq = 0;         // the writer's operation number (unique per writer)
  Op op = Op::kGet;
  Status status = Status::kOk;    // kTimedOut: unknown outcome
  uint64_t version = 0;           // the response's version
  uint64_t expected_version = 0;  // CAS
  uint32_t value_bytes = 0;       // PUT/CAS: length of the value written (EncodeValue of
                                  // {key, writer, seq, value_bytes})
  uint32_t attempts = 0;          // sends, retransmissions included
  // GET answered kOk: what the value decoded to, or why it did not decode.
  bool read_well_formed = false;
  ValueId read;
  std::string read_error;

  bool unknown() const { return status == Status::kTimedOut; }
};

// Current CLOCK_MONOTONIC in nanoseconds.
int64_t MonotonicNowNs();

// Fills `e`'s read fields from a GET's value (copies nothing: call it before the next Poll).
void RecordRead(std::string_view value, Event* e);

std::string Serialize(absl::Span<const Event> events);
absl::StatusOr<std::vector<Event>> Parse(std::string_view bytes);

// ---- The check ----

enum class Rule {
  kMalformedValue,        // 1: torn, mixed, garbage, or another key's value
  kValueVersionMismatch,  // 1: the value is not the one of the write with the reported version
  kStaleRead,             // 2/3: older than a version acknowledged or seen before invocation
  kFutureRead,            // 2: the write seen was invoked after the read completed
  kWriteOrder,            // 2: a write's version is not newer than one seen before it began
  kLostWrite,             // 3: NOT_FOUND although a newer non-DELETE write was acknowledged
  kDuplicateVersion,      // 4: two writes of a key with one version
  kPrecondition,          // 4: a CAS succeeded over another write (or a DELETE) or failed
                          //    although its expected version was current; a DELETE succeeded
                          //    on an absent key
  kUnknownVersion,        // a version reported that no write of the key produced
  kDoubleApply,           // 5: a write applied twice, or applied although answered as not
  kUnexpectedStatus,      // a well-formed request answered with a status its op cannot have
                          // (e.g. BAD_REQUEST: the worker read a torn request slot)
};
inline constexpr int kRuleCount = 11;
std::string_view RuleName(Rule rule);

struct Violation {
  Rule rule;
  uint32_t key;
  std::string detail;
};

struct CheckResult {
  uint64_t operations = 0;   // events checked
  uint64_t reads = 0;        // GETs answered (OK or NOT_FOUND)
  uint64_t values_read = 0;  // GETs that returned a value
  uint64_t writes = 0;       // PUT/DELETE/CAS answered OK
  uint64_t unknown = 0;      // timed out
  uint64_t keys = 0;         // keys with at least one event
  std::vector<Violation> violations;

  bool ok() const { return violations.empty(); }
  // Counts per rule and the first `max_examples` violations, one per line.
  std::string Summary(size_t max_examples = 10) const;
  size_t Count(Rule rule) const;
};

// Checks a whole history (every process's events, any order). Keys start absent.
CheckResult Check(absl::Span<const Event> events);

// One line describing an event (for violation reports).
std::string Describe(const Event& e);

}  // namespace herd::testing::history

#endif  // HERD_TESTS_HERD_HISTORY_H_
