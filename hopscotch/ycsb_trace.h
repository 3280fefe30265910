// YCSB's text trace: what its BasicDB prints with -p basicdb.verbose=true (and what
// bench's ycsb_trace writes), one operation per line:
//   INSERT usertable user6284781860667377211 [ field0=... field1=... ]
//   UPDATE usertable user123 [ field3=... ]
//   READ usertable user123 [ <all fields>]        (or [ field0 field1 ] when fields are named)
//   SCAN usertable user123 57 [ <all fields>]
//   DELETE usertable user123
//   READMODIFYWRITE usertable user123 [ ... ]      (not printed by BasicDB; accepted)
// Every other line (YCSB's banner, "Loading workload...", progress lines, the [OVERALL]
// summary, blank lines) is skipped. A line that starts with an operation word but lacks its
// table or key, has a key this table cannot store, a SCAN without a count or an unterminated
// field list is malformed: TraceFile reports it as FILE:LINE: why.
//
// Field data: YCSB's values are printable bytes that may contain spaces and '=', so the field
// list cannot be split reliably. A record's value is defined as the first 27 bytes after the
// first '=' of its field list (zero-padded if shorter; YCSB's values are 100 bytes), and
// ExpectedValue(key) when the line has no field data.
#ifndef HERD_HOPSCOTCH_YCSB_TRACE_H_
#define HERD_HOPSCOTCH_YCSB_TRACE_H_

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hopscotch/format.h"

namespace hopscotch {

enum class TraceOp { kInsert, kRead, kUpdate, kScan, kReadModifyWrite, kDelete };
std::string_view TraceOpName(TraceOp op);

struct TraceRecord {
  TraceOp op = TraceOp::kRead;
  std::string table;
  std::string key;
  uint64_t scan_count = 0;      // SCAN only
  bool has_field_data = false;  // a field list with at least one name=value
  std::string field_data;       // the bytes after the first '=', to the list's closing " ]"
};

// One line: nullopt when it is not an operation line (skip it), an error when malformed.
absl::StatusOr<std::optional<TraceRecord>> ParseTraceLine(std::string_view line);

// The value a record stores (see the header comment).
Value ValueFor(const TraceRecord& record);

// YCSB's CoreWorkload.buildKeyName with its defaults (zeropadding=1): "user" + the decimal of
// Utils.hash(keynum) = |FNV-1a-64 of the 8 little-endian bytes of keynum| (as a Java long:
// Math.abs, so Long.MIN_VALUE stays negative), or of keynum itself for ordered inserts.
std::string YcsbKeyName(uint64_t keynum, bool ordered_inserts = false);

// The lines YCSB's BasicDB prints.
std::string FormatInsert(std::string_view table, std::string_view key, std::string_view field0);
std::string FormatUpdate(std::string_view table, std::string_view key, std::string_view field0);
std::string FormatRead(std::string_view table, std::string_view key);

// Reads a trace file record by record, skipping non-operation lines.
class TraceFile {
 public:
  static absl::StatusOr<TraceFile> Open(const std::string& path);
  // True with *record filled, false at the end, or "PATH:LINE: why" for a malformed line.
  absl::StatusOr<bool> Next(TraceRecord* record);
  uint64_t line() const { return line_; }
  uint64_t skipped() const { return skipped_; }  // non-operation lines so far

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t line_ = 0;
  uint64_t skipped_ = 0;
};

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_YCSB_TRACE_H_
