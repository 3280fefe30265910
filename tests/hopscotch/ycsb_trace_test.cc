// The YCSB text trace: real-looking BasicDB output, skipped status lines, malformed lines with
// FILE:LINE, YCSB's key names.
#include "hopscotch/ycsb_trace.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "hopscotch/hash.h"

namespace hopscotch {
namespace {

TraceRecord Parse(std::string_view line) {
  absl::StatusOr<std::optional<TraceRecord>> r = ParseTraceLine(line);
  EXPECT_TRUE(r.ok()) << line << ": " << r.status();
  EXPECT_TRUE(r.ok() && r->has_value()) << line;
  return r.ok() && r->has_value() ? **r : TraceRecord{};
}

TEST(YcsbTrace, ParsesBasicDbLines) {
  const std::string value100(100, 'Q');
  TraceRecord r = Parse("INSERT usertable user6284781860667377211 [ field1=" + value100 +
                        " field0=" + value100 + " ]");
  EXPECT_EQ(r.op, TraceOp::kInsert);
  EXPECT_EQ(r.table, "usertable");
  EXPECT_EQ(r.key, "user6284781860667377211");
  EXPECT_TRUE(r.has_field_data);
  Value want{};
  std::memset(want.data(), 'Q', kValueBytes);
  EXPECT_EQ(ValueFor(r), want);

  r = Parse("READ usertable user123 [ <all fields>]");
  EXPECT_EQ(r.op, TraceOp::kRead);
  EXPECT_FALSE(r.has_field_data);
  EXPECT_EQ(ValueFor(r), ExpectedValue("user123"));
  r = Parse("READ usertable user123 [ field0 field3 ]");
  EXPECT_FALSE(r.has_field_data);
  r = Parse("UPDATE usertable user9 [ field3=a b=c ]\r\n");
  EXPECT_EQ(r.op, TraceOp::kUpdate);
  EXPECT_EQ(r.field_data, "a b=c");  // values may hold spaces and '='
  Value short_value{};
  std::memcpy(short_value.data(), "a b=c", 5);
  EXPECT_EQ(ValueFor(r), short_value);  // zero-padded
  r = Parse("SCAN usertable user5 57 [ <all fields>]");
  EXPECT_EQ(r.op, TraceOp::kScan);
  EXPECT_EQ(r.scan_count, 57u);
  r = Parse("DELETE usertable user5");
  EXPECT_EQ(r.op, TraceOp::kDelete);
  r = Parse("READMODIFYWRITE usertable user5 [ field0=x ]");
  EXPECT_EQ(r.op, TraceOp::kReadModifyWrite);
}

TEST(YcsbTrace, SkipsYcsbStatusLines) {
  for (const char* line :
       {"", "   ", "YCSB Client 0.17.0",
        "Command line: -db site.ycsb.BasicDB -P workloads/workloada", "Loading workload...",
        "Starting test.", "DBWrapper: report latency for each error is false",
        "2024-01-01 10:00:00:000 0 sec: 0 operations; est completion in 0 second",
        "[OVERALL], RunTime(ms), 1234", "[READ], Operations, 500", "READ-FAILED usertable x",
        "insert usertable user1 [ ]"}) {
    absl::StatusOr<std::optional<TraceRecord>> r = ParseTraceLine(line);
    ASSERT_TRUE(r.ok()) << line << ": " << r.status();
    EXPECT_FALSE(r->has_value()) << line;
  }
}

TEST(YcsbTrace, RejectsMalformedOperationLines) {
  for (const char* line :
       {"INSERT", "INSERT usertable", "READ usertable [ <all fields>]",
        "INSERT usertable user1 [ field0=abc", "SCAN usertable user1 [ <all fields>]",
        "SCAN usertable user1 many [ <all fields>]", "UPDATE usertable user1 junk",
        "INSERT usertable user012345678901234567890123456789 [ ]"}) {
    EXPECT_FALSE(ParseTraceLine(line).ok()) << line;
  }
}

TEST(YcsbTrace, FileReportsLineNumbers) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/trace.txt";
  {
    std::ofstream out(path);
    out << "Loading workload...\n"
        << "INSERT usertable user1 [ field0=abc ]\n"
        << "\n"
        << "READ usertable user1 [ <all fields>]\n"
        << "UPDATE usertable\n";
  }
  absl::StatusOr<TraceFile> file = TraceFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  TraceRecord r;
  ASSERT_TRUE(*file->Next(&r));
  EXPECT_EQ(r.key, "user1");
  EXPECT_EQ(file->line(), 2u);
  ASSERT_TRUE(*file->Next(&r));
  EXPECT_EQ(r.op, TraceOp::kRead);
  EXPECT_EQ(file->skipped(), 2u);
  absl::StatusOr<bool> bad = file->Next(&r);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path + ":5: UPDATE without a key"), std::string::npos)
      << bad.status();
  EXPECT_FALSE(TraceFile::Open(path + ".missing").ok());
}

TEST(YcsbTrace, KeyNamesAreYcsbs) {
  // Record 0 of every YCSB run with the default (hashed) insert order.
  EXPECT_EQ(YcsbKeyName(0), "user6284781860667377211");
  EXPECT_EQ(YcsbKeyName(7, /*ordered_inserts=*/true), "user7");
  EXPECT_NE(YcsbKeyName(1), YcsbKeyName(2));
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_TRUE(ValidateKey(YcsbKeyName(i)).ok());
    EXPECT_LE(YcsbKeyName(i).size(), 24u);
  }
  EXPECT_EQ(FormatRead("usertable", "user1"), "READ usertable user1 [ <all fields>]");
  EXPECT_EQ(FormatInsert("t", "k", "v"), "INSERT t k [ field0=v ]");
}

}  // namespace
}  // namespace hopscotch
