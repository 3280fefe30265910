// The memcached baseline client's binary-protocol codec: request layout byte for byte, and
// response parsing from a stream that arrives in pieces or is corrupt.
#include <string>

#include "bench/memcached/binary_protocol.h"
#include "gtest/gtest.h"

namespace bench::memcached {
namespace {

// A response as memcached would write it: header, extras, key, value.
std::string MakeResponse(Opcode opcode, ResponseStatus status, uint32_t opaque, uint64_t cas,
                         const std::string& extras, const std::string& key,
                         const std::string& value) {
  std::string r(kHeaderBytes, '\0');
  r[0] = static_cast<char>(kResponseMagic);
  r[1] = static_cast<char>(opcode);
  r[2] = static_cast<char>(key.size() >> 8);
  r[3] = static_cast<char>(key.size());
  r[4] = static_cast<char>(extras.size());
  r[6] = static_cast<char>(static_cast<uint16_t>(status) >> 8);
  r[7] = static_cast<char>(static_cast<uint16_t>(status));
  const uint32_t body = static_cast<uint32_t>(extras.size() + key.size() + value.size());
  for (int i = 0; i < 4; ++i) r[8 + i] = static_cast<char>(body >> (24 - 8 * i));
  std::memcpy(&r[12], &opaque, 4);
  for (int i = 0; i < 8; ++i) r[16 + i] = static_cast<char>(cas >> (56 - 8 * i));
  return r + extras + key + value;
}

TEST(MemcachedProtocol, GetRequestLayout) {
  std::string out;
  AppendGet("key", 0x01020304, &out);
  ASSERT_EQ(out.size(), kHeaderBytes + 3);
  EXPECT_EQ(static_cast<uint8_t>(out[0]), kRequestMagic);
  EXPECT_EQ(out[1], 0x00);                                  // GET
  EXPECT_EQ(out.substr(2, 2), std::string("\0\3", 2));      // key length, big-endian
  EXPECT_EQ(out[4], 0);                                     // no extras
  EXPECT_EQ(out.substr(8, 4), std::string("\0\0\0\3", 4));  // body = key
  uint32_t opaque;
  std::memcpy(&opaque, &out[12], 4);
  EXPECT_EQ(opaque, 0x01020304u);
  EXPECT_EQ(out.substr(16, 8), std::string(8, '\0'));
  EXPECT_EQ(out.substr(kHeaderBytes), "key");
}

TEST(MemcachedProtocol, SetRequestCarriesExtrasKeyValueAndCas) {
  std::string out;
  AppendSet("k", "value", 0x0102030405060708ull, 7, &out);
  ASSERT_EQ(out.size(), kHeaderBytes + 8 + 1 + 5);
  EXPECT_EQ(out[1], 0x01);  // SET
  EXPECT_EQ(out[4], 8);     // flags + expiration
  EXPECT_EQ(out.substr(8, 4), std::string("\0\0\0\x0e", 4));
  EXPECT_EQ(out.substr(16, 8), std::string("\1\2\3\4\5\6\7\x08", 8));
  EXPECT_EQ(out.substr(kHeaderBytes, 8), std::string(8, '\0'));
  EXPECT_EQ(out.substr(kHeaderBytes + 8), "kvalue");
}

TEST(MemcachedProtocol, RequestsAppendToTheSameBuffer) {
  std::string out;
  AppendDelete("a", 1, &out);
  AppendGet("b", 2, &out);
  ASSERT_EQ(out.size(), 2 * (kHeaderBytes + 1));
  EXPECT_EQ(out[1], 0x04);                 // DELETE
  const size_t second = kHeaderBytes + 1;  // after the first request's 1-byte key
  EXPECT_EQ(static_cast<uint8_t>(out[second]), kRequestMagic);
  EXPECT_EQ(out[second + 1], 0x00);  // GET
  EXPECT_EQ(out.substr(second + kHeaderBytes), "b");
}

TEST(MemcachedProtocol, ParsesAGetHitWithItsValue) {
  const std::string stream =
      MakeResponse(Opcode::kGet, ResponseStatus::kOk, 9, 42, std::string(4, '\0'), "", "hello");
  absl::StatusOr<Response> r = ParseResponse(stream);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes, stream.size());
  EXPECT_EQ(r->opcode, Opcode::kGet);
  EXPECT_EQ(r->status, ResponseStatus::kOk);
  EXPECT_EQ(r->opaque, 9u);
  EXPECT_EQ(r->cas, 42u);
  EXPECT_EQ(r->value, "hello");
}

TEST(MemcachedProtocol, AStreamInPiecesParsesOnlyWhenWhole) {
  const std::string one = MakeResponse(Opcode::kSet, ResponseStatus::kOk, 1, 5, "", "", "");
  const std::string two =
      MakeResponse(Opcode::kGet, ResponseStatus::kKeyNotFound, 2, 0, "", "", "Not found");
  const std::string stream = one + two;
  for (size_t cut = 0; cut < one.size(); ++cut) {
    absl::StatusOr<Response> r = ParseResponse(std::string_view(stream).substr(0, cut));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->bytes, 0u) << "a response parsed from " << cut << " bytes";
  }
  absl::StatusOr<Response> first = ParseResponse(stream);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->bytes, one.size());
  absl::StatusOr<Response> second = ParseResponse(std::string_view(stream).substr(first->bytes));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->status, ResponseStatus::kKeyNotFound);
  EXPECT_EQ(second->opaque, 2u);
  EXPECT_EQ(second->bytes, two.size());
}

TEST(MemcachedProtocol, CorruptStreamsAreDataLoss) {
  std::string bad_magic = MakeResponse(Opcode::kGet, ResponseStatus::kOk, 1, 0, "", "", "");
  bad_magic[0] = static_cast<char>(kRequestMagic);
  EXPECT_EQ(ParseResponse(bad_magic).status().code(), absl::StatusCode::kDataLoss);

  std::string bad_opcode = MakeResponse(Opcode::kGet, ResponseStatus::kOk, 1, 0, "", "", "");
  bad_opcode[1] = 0x42;
  EXPECT_EQ(ParseResponse(bad_opcode).status().code(), absl::StatusCode::kDataLoss);

  // A body shorter than its own extras and key.
  std::string short_body = MakeResponse(Opcode::kGet, ResponseStatus::kOk, 1, 0, "", "", "");
  short_body[3] = 10;  // claims a 10-byte key in a 0-byte body
  EXPECT_EQ(ParseResponse(short_body).status().code(), absl::StatusCode::kDataLoss);

  // A length no value can have: rejected from the header alone, before waiting for the body.
  std::string huge = MakeResponse(Opcode::kGet, ResponseStatus::kOk, 1, 0, "", "", "");
  huge[8] = 0x7f;
  EXPECT_EQ(ParseResponse(std::string_view(huge).substr(0, kHeaderBytes)).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace bench::memcached
