#include "hopscotch/ycsb_trace.h"

#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "hopscotch/hash.h"

namespace hopscotch {
namespace {

// The next space-separated token of *rest (consumed), empty at the end.
std::string_view NextToken(std::string_view* rest) {
  const size_t start = rest->find_first_not_of(' ');
  if (start == std::string_view::npos) {
    *rest = {};
    return {};
  }
  rest->remove_prefix(start);
  const size_t end = std::min(rest->find(' '), rest->size());
  std::string_view token = rest->substr(0, end);
  rest->remove_prefix(end);
  return token;
}

std::optional<TraceOp> OpOf(std::string_view word) {
  if (word == "INSERT") return TraceOp::kInsert;
  if (word == "READ") return TraceOp::kRead;
  if (word == "UPDATE") return TraceOp::kUpdate;
  if (word == "SCAN") return TraceOp::kScan;
  if (word == "READMODIFYWRITE") return TraceOp::kReadModifyWrite;
  if (word == "DELETE") return TraceOp::kDelete;
  return std::nullopt;
}

// Java's Utils.fnvhash64 (FNV-1a over the 8 bytes of a long, then Math.abs).
int64_t YcsbFnvHash64(int64_t value) {
  uint64_t hash = 0xCBF29CE484222325ULL;
  auto v = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) {
    hash ^= v & 0xff;
    hash *= 1099511628211ULL;
    v >>= 8;
  }
  const auto signed_hash = static_cast<int64_t>(hash);
  if (signed_hash == std::numeric_limits<int64_t>::min()) return signed_hash;  // Math.abs
  return signed_hash < 0 ? -signed_hash : signed_hash;
}

}  // namespace

std::string_view TraceOpName(TraceOp op) {
  switch (op) {
    case TraceOp::kInsert:
      return "INSERT";
    case TraceOp::kRead:
      return "READ";
    case TraceOp::kUpdate:
      return "UPDATE";
    case TraceOp::kScan:
      return "SCAN";
    case TraceOp::kReadModifyWrite:
      return "READMODIFYWRITE";
    case TraceOp::kDelete:
      return "DELETE";
  }
  return "?";
}

absl::StatusOr<std::optional<TraceRecord>> ParseTraceLine(std::string_view line) {
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.remove_suffix(1);
  std::string_view rest = line;
  const std::optional<TraceOp> op = OpOf(NextToken(&rest));
  if (!op.has_value()) return std::nullopt;
  TraceRecord record;
  record.op = *op;
  const std::string_view name = TraceOpName(*op);
  const std::string_view table = NextToken(&rest);
  if (table.empty() || table[0] == '[') {
    return absl::InvalidArgumentError(absl::StrFormat("%s without a table name", name));
  }
  const std::string_view key = NextToken(&rest);
  if (key.empty() || key[0] == '[') {
    return absl::InvalidArgumentError(absl::StrFormat("%s without a key", name));
  }
  if (absl::Status s = ValidateKey(key); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("key '%s': %s", key, s.message()));
  }
  record.table = std::string(table);
  record.key = std::string(key);
  if (*op == TraceOp::kScan) {
    const std::string_view count = NextToken(&rest);
    if (!absl::SimpleAtoi(absl::string_view(count.data(), count.size()), &record.scan_count)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("SCAN without a record count (got '%s')", count));
    }
  }
  const size_t start = rest.find_first_not_of(' ');
  if (start == std::string_view::npos) return record;  // no field list (DELETE)
  rest.remove_prefix(start);
  while (!rest.empty() && rest.back() == ' ') rest.remove_suffix(1);
  if (rest[0] != '[') {
    return absl::InvalidArgumentError(absl::StrFormat("unexpected '%s' after the key", rest));
  }
  if (rest.size() < 2 || rest.back() != ']') {
    return absl::InvalidArgumentError("unterminated field list (no closing ']')");
  }
  std::string_view fields = rest.substr(1, rest.size() - 2);
  const size_t eq = fields.find('=');
  if (eq != std::string_view::npos) {
    std::string_view data = fields.substr(eq + 1);
    if (!data.empty() && data.back() == ' ') data.remove_suffix(1);  // BasicDB's "value ]"
    record.has_field_data = true;
    record.field_data = std::string(data);
  }
  return record;
}

Value ValueFor(const TraceRecord& record) {
  if (!record.has_field_data) return ExpectedValue(record.key);
  Value value{};
  std::memcpy(value.data(), record.field_data.data(),
              std::min<size_t>(record.field_data.size(), kValueBytes));
  return value;
}

std::string YcsbKeyName(uint64_t keynum, bool ordered_inserts) {
  const int64_t n =
      ordered_inserts ? static_cast<int64_t>(keynum) : YcsbFnvHash64(static_cast<int64_t>(keynum));
  return absl::StrFormat("user%d", n);
}

std::string FormatInsert(std::string_view table, std::string_view key, std::string_view field0) {
  return absl::StrFormat("INSERT %s %s [ field0=%s ]", table, key, field0);
}

std::string FormatUpdate(std::string_view table, std::string_view key, std::string_view field0) {
  return absl::StrFormat("UPDATE %s %s [ field0=%s ]", table, key, field0);
}

std::string FormatRead(std::string_view table, std::string_view key) {
  return absl::StrFormat("READ %s %s [ <all fields>]", table, key);
}

absl::StatusOr<TraceFile> TraceFile::Open(const std::string& path) {
  TraceFile file;
  file.path_ = path;
  file.in_.open(path);
  if (!file.in_.is_open()) {
    return absl::NotFoundError(absl::StrFormat("%s: cannot open: %s", path, std::strerror(errno)));
  }
  return file;
}

absl::StatusOr<bool> TraceFile::Next(TraceRecord* record) {
  std::string text;
  while (std::getline(in_, text)) {
    ++line_;
    absl::StatusOr<std::optional<TraceRecord>> parsed = ParseTraceLine(text);
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(),
                          absl::StrFormat("%s:%u: %s", path_, line_, parsed.status().message()));
    }
    if (!parsed->has_value()) {
      ++skipped_;
      continue;
    }
    *record = std::move(**parsed);
    return true;
  }
  if (in_.bad()) return absl::DataLossError(absl::StrFormat("%s:%u: read error", path_, line_));
  return false;
}

}  // namespace hopscotch
