#include "tests/herd/history.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace herd::testing::history {
namespace {

// How many leading bytes of a malformed value its report shows (hex).
constexpr size_t kMalformedPrefixBytes = 48;

// Serialized history: magic, format version, event count, then the events.
constexpr uint32_t kHistoryMagic = 0x53494848;  // "HHIS"
constexpr uint32_t kHistoryFormat = 1;

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fill word `i` of the value `id`.
uint64_t FillWord(const ValueId& id, uint64_t i) {
  uint64_t h = SplitMix((uint64_t{id.key} << 32) | id.writer);
  h = SplitMix(h ^ id.seq);
  h = SplitMix(h ^ ((uint64_t{id.length} << 32) | i));
  return h;
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
bool Take(std::string_view* in, T* v) {
  if (in->size() < sizeof(T)) return false;
  std::memcpy(v, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}

std::string Hex(std::string_view bytes) {
  return absl::BytesToHexString(
      absl::string_view(bytes.data(), std::min(bytes.size(), kMalformedPrefixBytes)));
}

std::string TimeOf(int64_t ns) {
  if (ns == kNever) return "never";
  return absl::StrFormat("%.6fs", static_cast<double>(ns) / 1e9);
}

bool IsWrite(Op op) { return op != Op::kGet; }

// The state a NOT_FOUND / CAS-failed observation reports: the event is a read of the key.
bool IsAbsentObservation(const Event& e) {
  return e.status == Status::kNotFound &&
         (e.op == Op::kGet || e.op == Op::kDelete || e.op == Op::kCas);
}

// The statuses a well-formed request of this op can be answered with.
bool StatusFits(const Event& e) {
  switch (e.status) {
    case Status::kOk:
      return true;
    case Status::kNotFound:
      return e.op != Op::kPut;
    case Status::kCasFailed:
      return e.op == Op::kCas;
    default:
      return false;
  }
}

}  // namespace

std::string EncodeValue(const ValueId& id) {
  std::string v(std::max(id.length, kValueHeaderBytes), '\0');
  char* p = v.data();
  const uint32_t length = static_cast<uint32_t>(v.size());
  std::memcpy(p, &kValueMagic, 4);
  std::memcpy(p + 4, &id.key, 4);
  std::memcpy(p + 8, &id.writer, 4);
  std::memcpy(p + 12, &length, 4);
  std::memcpy(p + 16, &id.seq, 8);
  ValueId full = id;
  full.length = length;
  for (uint32_t off = kValueHeaderBytes, i = 0; off < length; off += 8, ++i) {
    const uint64_t w = FillWord(full, i);
    std::memcpy(p + off, &w, std::min<uint32_t>(8, length - off));
  }
  return v;
}

absl::StatusOr<ValueId> DecodeValue(std::string_view bytes) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(why), " (", bytes.size(), " bytes: ", Hex(bytes), ")"));
  };
  if (bytes.size() < kValueHeaderBytes) return bad("shorter than a value header");
  uint32_t magic;
  ValueId id;
  std::memcpy(&magic, bytes.data(), 4);
  std::memcpy(&id.key, bytes.data() + 4, 4);
  std::memcpy(&id.writer, bytes.data() + 8, 4);
  std::memcpy(&id.length, bytes.data() + 12, 4);
  std::memcpy(&id.seq, bytes.data() + 16, 8);
  if (magic != kValueMagic) return bad("bad magic");
  if (id.length != bytes.size()) {
    return bad(absl::StrCat("header says ", id.length, " bytes"));
  }
  for (uint32_t off = kValueHeaderBytes, i = 0; off < id.length; off += 8, ++i) {
    const uint64_t w = FillWord(id, i);
    const uint32_t n = std::min<uint32_t>(8, id.length - off);
    if (std::memcmp(bytes.data() + off, &w, n) != 0) {
      return bad(absl::StrFormat("fill bytes at offset %d are not those of key %d writer %d seq %d",
                                 off, id.key, id.writer, id.seq));
    }
  }
  return id;
}

int64_t MonotonicNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void RecordRead(std::string_view value, Event* e) {
  absl::StatusOr<ValueId> id = DecodeValue(value);
  e->read_well_formed = id.ok();
  if (id.ok()) {
    e->read = *id;
    e->read_error.clear();
  } else {
    e->read = ValueId{};
    e->read_error = std::string(id.status().message());
  }
}

std::string Serialize(absl::Span<const Event> events) {
  std::string out;
  out.reserve(16 + events.size() * 96);
  Put(&out, kHistoryMagic);
  Put(&out, kHistoryFormat);
  Put(&out, uint64_t{events.size()});
  for (const Event& e : events) {
    Put(&out, e.invoke_ns);
    Put(&out, e.complete_ns);
    Put(&out, e.key);
    Put(&out, e.writer);
    Put(&out, e.seq);
    Put(&out, static_cast<uint8_t>(e.op));
    Put(&out, static_cast<uint8_t>(e.status));
    Put(&out, static_cast<uint8_t>(e.read_well_formed));
    Put(&out, e.version);
    Put(&out, e.expected_version);
    Put(&out, e.value_bytes);
    Put(&out, e.attempts);
    Put(&out, e.read.key);
    Put(&out, e.read.writer);
    Put(&out, e.read.seq);
    Put(&out, e.read.length);
    Put(&out, static_cast<uint32_t>(e.read_error.size()));
    out.append(e.read_error);
  }
  return out;
}

absl::StatusOr<std::vector<Event>> Parse(std::string_view in) {
  uint32_t magic = 0, format = 0;
  uint64_t count = 0;
  if (!Take(&in, &magic) || !Take(&in, &format) || !Take(&in, &count) || magic != kHistoryMagic ||
      format != kHistoryFormat) {
    return absl::DataLossError("not a history (bad header)");
  }
  std::vector<Event> events;
  events.reserve(std::min<uint64_t>(count, in.size() / 64));
  for (uint64_t i = 0; i < count; ++i) {
    Event e;
    uint8_t op, status, well_formed;
    uint32_t error_bytes;
    const bool ok = Take(&in, &e.invoke_ns) && Take(&in, &e.complete_ns) && Take(&in, &e.key) &&
                    Take(&in, &e.writer) && Take(&in, &e.seq) && Take(&in, &op) &&
                    Take(&in, &status) && Take(&in, &well_formed) && Take(&in, &e.version) &&
                    Take(&in, &e.expected_version) && Take(&in, &e.value_bytes) &&
                    Take(&in, &e.attempts) && Take(&in, &e.read.key) && Take(&in, &e.read.writer) &&
                    Take(&in, &e.read.seq) && Take(&in, &e.read.length) && Take(&in, &error_bytes);
    if (!ok || in.size() < error_bytes || op >= kOpCount) {
      return absl::DataLossError(absl::StrCat("history truncated or corrupt at event ", i));
    }
    e.op = static_cast<Op>(op);
    e.status = static_cast<Status>(status);
    e.read_well_formed = well_formed != 0;
    e.read_error = std::string(in.substr(0, error_bytes));
    in.remove_prefix(error_bytes);
    events.push_back(std::move(e));
  }
  if (!in.empty()) return absl::DataLossError("trailing bytes after the last event");
  return events;
}

std::string_view RuleName(Rule rule) {
  switch (rule) {
    case Rule::kMalformedValue:
      return "malformed-value";
    case Rule::kValueVersionMismatch:
      return "value-version-mismatch";
    case Rule::kStaleRead:
      return "stale-read";
    case Rule::kFutureRead:
      return "future-read";
    case Rule::kWriteOrder:
      return "write-order";
    case Rule::kLostWrite:
      return "lost-write";
    case Rule::kDuplicateVersion:
      return "duplicate-version";
    case Rule::kPrecondition:
      return "precondition";
    case Rule::kUnknownVersion:
      return "unknown-version";
    case Rule::kDoubleApply:
      return "double-apply";
    case Rule::kUnexpectedStatus:
      return "unexpected-status";
  }
  return "?";
}

std::string Describe(const Event& e) {
  std::string s = absl::StrFormat("w%d#%d %s key %d", e.writer, e.seq,
                                  e.op == Op::kGet      ? "GET"
                                  : e.op == Op::kPut    ? "PUT"
                                  : e.op == Op::kDelete ? "DELETE"
                                                        : "CAS",
                                  e.key);
  if (e.op == Op::kCas) absl::StrAppend(&s, " expect v", e.expected_version);
  if (e.op == Op::kPut || e.op == Op::kCas) absl::StrAppend(&s, " (", e.value_bytes, " B)");
  absl::StrAppend(&s, " -> ", std::string(StatusName(e.status)));
  if (e.status != Status::kTimedOut && e.status != Status::kNotFound) {
    absl::StrAppend(&s, " v", e.version);
  }
  if (e.op == Op::kGet && e.status == Status::kOk) {
    if (e.read_well_formed) {
      absl::StrAppend(&s, absl::StrFormat(" value{key %d w%d#%d %d B}", e.read.key, e.read.writer,
                                          e.read.seq, e.read.length));
    } else {
      absl::StrAppend(&s, " value MALFORMED: ", e.read_error);
    }
  }
  absl::StrAppend(&s, " [", TimeOf(e.invoke_ns), " .. ", TimeOf(e.complete_ns), "] attempts ",
                  e.attempts);
  return s;
}

size_t CheckResult::Count(Rule rule) const {
  return std::count_if(violations.begin(), violations.end(),
                       [rule](const Violation& v) { return v.rule == rule; });
}

std::string CheckResult::Summary(size_t max_examples) const {
  std::string s = absl::StrFormat(
      "%d operations on %d keys: %d reads (%d returned a value), %d writes acknowledged, %d "
      "unknown (timed out); %d violations",
      operations, keys, reads, values_read, writes, unknown, violations.size());
  for (int r = 0; r < kRuleCount; ++r) {
    if (const size_t n = Count(static_cast<Rule>(r)); n > 0) {
      absl::StrAppend(&s, "\n  ", std::string(RuleName(static_cast<Rule>(r))), ": ", n);
    }
  }
  // Examples round robin over the rules, so a rule with few violations still shows one.
  std::vector<std::vector<const Violation*>> by_rule(kRuleCount);
  for (const Violation& v : violations) by_rule[static_cast<int>(v.rule)].push_back(&v);
  size_t shown = 0;
  for (size_t round = 0; shown < max_examples && shown < violations.size(); ++round) {
    for (int r = 0; r < kRuleCount && shown < max_examples; ++r) {
      if (round >= by_rule[r].size()) continue;
      const Violation& v = *by_rule[r][round];
      absl::StrAppend(&s, "\n  [", std::string(RuleName(v.rule)), "] key ", v.key, ": ", v.detail);
      ++shown;
    }
  }
  return s;
}

namespace {

// Checks one key's events (indices into `events`).
class KeyChecker {
 public:
  KeyChecker(absl::Span<const Event> events, uint32_t key,
             const absl::flat_hash_map<std::pair<uint32_t, uint64_t>, size_t>& by_id,
             CheckResult* result)
      : events_(events), key_(key), by_id_(by_id), result_(result) {}

  void Run(const std::vector<size_t>& mine) {
    mine_ = mine;
    IndexWrites();
    AttributeValues();
    BuildFloor();
    CheckWrites();
    CheckReads();
  }

 private:
  const Event& E(size_t i) const { return events_[i]; }

  void Report(Rule rule, std::string detail) {
    result_->violations.push_back(Violation{rule, key_, std::move(detail)});
  }

  // Acknowledged writes by version; counts.
  void IndexWrites() {
    for (size_t i : mine_) {
      const Event& e = E(i);
      ++result_->operations;
      if (e.unknown()) {
        ++result_->unknown;
        if (IsWrite(e.op)) unknown_writes_.push_back(i);
        continue;
      }
      if (!StatusFits(e)) {
        Report(Rule::kUnexpectedStatus, Describe(e));
        continue;
      }
      if (e.op == Op::kGet) {
        ++result_->reads;
        if (e.status == Status::kOk) ++result_->values_read;
        continue;
      }
      if (e.status != Status::kOk) continue;
      ++result_->writes;
      AddWrite(i, e.version);
    }
  }

  void AddWrite(size_t i, uint64_t version) {
    auto [it, inserted] = by_version_.emplace(version, i);
    if (!inserted) {
      Report(Rule::kDuplicateVersion, absl::StrCat("version ", version, " for two writes: ",
                                                   Describe(E(it->second)), " | ", Describe(E(i))));
    }
  }

  // Rules 1 and 5: which write each GET's value came from; versions of timed-out writes that a
  // read saw.
  void AttributeValues() {
    absl::flat_hash_map<size_t, uint64_t> unknown_seen;  // timed-out write -> version seen
    std::vector<std::pair<size_t, size_t>> pending;      // (read, write) checked after
    for (size_t i : mine_) {
      const Event& r = E(i);
      if (r.op != Op::kGet || r.status != Status::kOk) continue;
      if (!r.read_well_formed) {
        Report(Rule::kMalformedValue, Describe(r));
        continue;
      }
      if (r.read.key != key_) {
        Report(Rule::kMalformedValue,
               absl::StrCat("the value of key ", r.read.key, ": ", Describe(r)));
        continue;
      }
      auto w = by_id_.find({r.read.writer, r.read.seq});
      if (w == by_id_.end() || E(w->second).key != key_) {
        Report(Rule::kValueVersionMismatch,
               absl::StrCat("a value no PUT/CAS of this key wrote: ", Describe(r)));
        continue;
      }
      const Event& wr = E(w->second);
      if (wr.value_bytes != r.read.length) {
        Report(Rule::kMalformedValue, absl::StrCat("length ", r.read.length, " but ", Describe(wr),
                                                   " wrote ", wr.value_bytes, ": ", Describe(r)));
        continue;
      }
      if (wr.unknown()) {
        auto [it, inserted] = unknown_seen.emplace(w->second, r.version);
        if (!inserted && it->second != r.version) {
          Report(Rule::kDoubleApply,
                 absl::StrCat("timed-out ", Describe(wr), " seen at v", it->second, " and at v",
                              r.version, ": ", Describe(r)));
          continue;
        }
        if (inserted) {
          // Give the timed-out write the version it was seen with (a clash is reported below,
          // as the read's mismatch).
          if (by_version_.emplace(r.version, w->second).second) seen_unknown_.insert(w->second);
        }
      } else if (wr.status != Status::kOk) {
        Report(Rule::kDoubleApply,
               absl::StrCat("applied although answered ", std::string(StatusName(wr.status)), ": ",
                            Describe(wr), " | read ", Describe(r)));
        continue;
      }
      pending.emplace_back(i, w->second);
    }
    for (const auto& [i, w] : pending) {
      const Event& r = E(i);
      auto at = by_version_.find(r.version);
      if (at != by_version_.end() && at->second == w) {
        valid_reads_.push_back(i);
        continue;
      }
      if (at != by_version_.end()) {
        Report(Rule::kValueVersionMismatch,
               absl::StrCat("version v", r.version, " is ", Describe(E(at->second)),
                            " but the value is of ", Describe(E(w)), ": ", Describe(r)));
      } else {
        Report(
            Rule::kDoubleApply,
            absl::StrCat("the value of ", Describe(E(w)), " at v", r.version,
                         ", which no acknowledged write produced (applied twice?): ", Describe(r)));
      }
    }
    for (size_t i : unknown_writes_) {
      if (!seen_unknown_.contains(i)) unseen_unknown_.push_back(i);
    }
  }

  // floor(t) = newest version acknowledged or seen by an operation that completed before t.
  void BuildFloor() {
    for (const auto& [version, i] : by_version_) {
      if (E(i).complete_ns != kNever) floor_.push_back({E(i).complete_ns, version, i});
    }
    for (size_t i : valid_reads_) floor_.push_back({E(i).complete_ns, E(i).version, i});
    // CAS failures name the current version: a read without a value.
    for (size_t i : mine_) {
      const Event& c = E(i);
      if (c.op != Op::kCas || c.status != Status::kCasFailed) continue;
      if (c.expected_version == c.version) {
        Report(Rule::kPrecondition,
               absl::StrCat("CAS failed although it expected the version it names: ", Describe(c)));
      }
      auto at = by_version_.find(c.version);
      if (at == by_version_.end()) {
        if (!AnUnseenUnknownWriteBefore(c.complete_ns, /*deletes_only=*/false)) {
          Report(Rule::kUnknownVersion,
                 absl::StrCat("CAS failure names a version no write produced: ", Describe(c)));
        }
        continue;
      }
      if (E(at->second).op == Op::kDelete) {
        Report(Rule::kUnknownVersion, absl::StrCat("CAS failure names the version of ",
                                                   Describe(E(at->second)), ": ", Describe(c)));
        continue;
      }
      floor_.push_back({c.complete_ns, c.version, i});
      cas_reads_.push_back(i);
    }
    std::sort(floor_.begin(), floor_.end(),
              [](const Mark& a, const Mark& b) { return a.time < b.time; });
    for (size_t k = 1; k < floor_.size(); ++k) {
      if (floor_[k].version < floor_[k - 1].version) {
        floor_[k].version = floor_[k - 1].version;
        floor_[k].event = floor_[k - 1].event;
      }
    }
    // Deletes in version order with the earliest invocation at or after each.
    for (const auto& [version, i] : by_version_) {
      if (E(i).op == Op::kDelete) deletes_.push_back({E(i).invoke_ns, version, i});
    }
    for (size_t k = deletes_.size(); k-- > 1;) {
      deletes_[k - 1].time = std::min(deletes_[k - 1].time, deletes_[k].time);
    }
  }

  // The floor before time t: {version, event}, version 0 if nothing.
  std::pair<uint64_t, size_t> Floor(int64_t t) const {
    auto it = std::lower_bound(floor_.begin(), floor_.end(), t,
                               [](const Mark& m, int64_t time) { return m.time < time; });
    if (it == floor_.begin()) return {0, 0};
    --it;
    return {it->version, it->event};
  }

  bool AnUnseenUnknownWriteBefore(int64_t t, bool deletes_only) const {
    for (size_t i : unseen_unknown_) {
      if (deletes_only && E(i).op != Op::kDelete) continue;
      if (E(i).invoke_ns < t) return true;
    }
    return false;
  }

  void CheckWrites() {
    const Event* previous = nullptr;
    uint64_t previous_version = 0;
    for (const auto& [version, i] : by_version_) {
      const Event& w = E(i);
      if (const auto [f, by] = Floor(w.invoke_ns); f >= version) {
        Report(Rule::kWriteOrder,
               absl::StrCat(Describe(w), " got v", version, " although ", Describe(E(by)),
                            " had completed (seeing v", f, ") before it was invoked"));
      }
      if (w.op == Op::kCas && !w.unknown()) {
        auto expected = by_version_.find(w.expected_version);
        if (expected == by_version_.end()) {
          if (!AnUnseenUnknownWriteBefore(w.complete_ns, false)) {
            Report(Rule::kPrecondition,
                   absl::StrCat(Describe(w), " succeeded expecting a version no write produced"));
          }
        } else if (E(expected->second).op == Op::kDelete) {
          Report(Rule::kPrecondition,
                 absl::StrCat(Describe(w), " succeeded over ", Describe(E(expected->second))));
        } else if (previous_version != w.expected_version) {
          Report(Rule::kPrecondition,
                 absl::StrCat(Describe(w), " succeeded although ", Describe(*previous),
                              " sits between its expected version and its own"));
        }
      }
      if (w.op == Op::kDelete && (previous == nullptr || previous->op == Op::kDelete) &&
          !AnUnseenUnknownWriteBefore(w.complete_ns, false)) {
        Report(Rule::kPrecondition,
               absl::StrCat(Describe(w), " succeeded on an absent key (previous write: ",
                            previous == nullptr ? "none" : Describe(*previous), ")"));
      }
      previous = &w;
      previous_version = version;
    }
  }

  void CheckReads() {
    auto check_seen = [&](size_t i) {
      const Event& r = E(i);
      const Event& w = E(by_version_.at(r.version));
      if (const auto [f, by] = Floor(r.invoke_ns); r.version < f) {
        Report(Rule::kStaleRead,
               absl::StrCat(Describe(r), " although ", Describe(E(by)), " had completed (seeing v",
                            f, ") before it was invoked"));
      }
      if (w.invoke_ns >= r.complete_ns) {
        Report(Rule::kFutureRead, absl::StrCat(Describe(r), " saw ", Describe(w),
                                               ", invoked after the read completed"));
      }
    };
    for (size_t i : valid_reads_) check_seen(i);
    for (size_t i : cas_reads_) check_seen(i);
    for (size_t i : mine_) {
      const Event& r = E(i);
      if (!IsAbsentObservation(r)) continue;
      const auto [f, by] = Floor(r.invoke_ns);
      if (f == 0) continue;  // the key may not have been written yet
      auto d = std::lower_bound(deletes_.begin(), deletes_.end(), f,
                                [](const Mark& m, uint64_t v) { return m.version < v; });
      if (d != deletes_.end() && d->time < r.complete_ns) continue;
      if (AnUnseenUnknownWriteBefore(r.complete_ns, /*deletes_only=*/true)) continue;
      Report(Rule::kLostWrite,
             absl::StrCat(Describe(r), " although ", Describe(E(by)), " had completed (v", f,
                          ") before it was invoked and no DELETE at or after v", f,
                          " was invoked before it completed"));
    }
  }

  struct Mark {
    int64_t time;
    uint64_t version;
    size_t event;
  };

  absl::Span<const Event> events_;
  const uint32_t key_;
  const absl::flat_hash_map<std::pair<uint32_t, uint64_t>, size_t>& by_id_;
  CheckResult* result_;
  std::vector<size_t> mine_;
  std::map<uint64_t, size_t> by_version_;  // writes with a known version
  std::vector<size_t> unknown_writes_;     // timed out
  absl::flat_hash_set<size_t> seen_unknown_;
  std::vector<size_t> unseen_unknown_;
  std::vector<size_t> valid_reads_;  // GETs whose value is the write of their version
  std::vector<size_t> cas_reads_;    // CAS failures naming a known version
  std::vector<Mark> floor_;          // by completion time, version = running maximum
  std::vector<Mark> deletes_;        // by version, time = earliest invocation from here on
};

}  // namespace

CheckResult Check(absl::Span<const Event> events) {
  CheckResult result;
  absl::flat_hash_map<std::pair<uint32_t, uint64_t>, size_t> by_id;
  std::map<uint32_t, std::vector<size_t>> by_key;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    by_key[e.key].push_back(i);
    if (e.op == Op::kPut || e.op == Op::kCas) by_id.emplace(std::make_pair(e.writer, e.seq), i);
  }
  result.keys = by_key.size();
  for (const auto& [key, mine] : by_key) {
    KeyChecker(events, key, by_id, &result).Run(mine);
  }
  return result;
}

}  // namespace herd::testing::history
