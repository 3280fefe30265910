// herd's wire format on its own: EncodeRequest/ParseRequest and EncodeResponseHeader/
// ParseResponse round trips, every way a request is refused, and a fuzz test that random bytes
// are never read out of bounds nor taken for a request.
#include "herd/protocol.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "herd/client.h"
#include "mica/config.h"
#include "mica/keyhash.h"
#include "mica/partition.h"

namespace herd {
namespace {

constexpr uint64_t kSecret = 0x5EC2E7C0FFEE1234ULL;
constexpr uint64_t kOtherSecret = 0x0DDBA11CAFEF00D5ULL;
constexpr uint32_t kMaxKey = 16;
constexpr uint32_t kMaxValue = 64;
constexpr RequestLimits kLimits{kMaxKey, kMaxValue};
// A slot with room to spare in front of the request (requests end at the slot's end).
constexpr uint32_t kSlotBytes = 512;
constexpr uint64_t kSeq = 7;
constexpr uint32_t kClient = 3;
constexpr uint64_t kFuzzSeed = 20240611;
constexpr int kFuzzIterations = 200000;
constexpr uint32_t kFuzzMaxLength = 600;

std::string Bytes(uint32_t n, char first) {
  std::string s(n, '\0');
  for (uint32_t i = 0; i < n; ++i) s[i] = static_cast<char>(first + i % 23);
  return s;
}

RequestHeader HeaderFor(Op op, std::string_view key, std::string_view value,
                        uint64_t expected_version = 0) {
  RequestHeader h{};
  h.keyhash = mica::KeyHash(key);
  h.expected_version = expected_version;
  h.value_bytes = static_cast<uint32_t>(value.size());
  h.key_bytes = static_cast<uint16_t>(key.size());
  h.op = static_cast<uint8_t>(op);
  h.attempt = 0;
  h.seq = kSeq;
  return h;
}

// A slot holding one encoded request at its end.
struct Slot {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kSlotBytes, 0xAB);
  uint32_t length = 0;  // the request's
  uint8_t* request() { return bytes.data() + kSlotBytes - length; }
  RequestTrailer* header() {
    return reinterpret_cast<RequestTrailer*>(bytes.data() + kSlotBytes - kRequestTrailerBytes);
  }
  void Rechecksum(uint64_t secret = kSecret) {
    const uint64_t sum = WireChecksum(secret, request(), length);
    std::memcpy(bytes.data() + kSlotBytes - kChecksumFromEnd, &sum, sizeof(sum));
  }
};

Slot Encode(const RequestHeader& h, std::string_view key, std::string_view value,
            uint64_t secret = kSecret) {
  Slot slot;
  const uint32_t length = RequestBytes(static_cast<Op>(h.op), static_cast<uint32_t>(key.size()),
                                       static_cast<uint32_t>(value.size()), h.flags);
  slot.length = length;
  EXPECT_EQ(EncodeRequest(h, key, value, secret, slot.request()), length);
  return slot;
}

Parse ParseSlot(Slot& slot, ParsedRequest* out, Status* status, uint64_t secret = kSecret,
                const RequestLimits& limits = kLimits) {
  return ParseRequest(slot.bytes.data(), kSlotBytes, limits, secret, out, status);
}

// Parses, expecting a request; returns its status.
Status StatusOf(Slot& slot) {
  ParsedRequest parsed;
  Status status = Status::kOk;
  EXPECT_EQ(ParseSlot(slot, &parsed, &status), Parse::kRequest);
  return status;
}

TEST(ProtocolTest, RequestRoundTripsForEveryOpKeyAndValueLength) {
  for (uint8_t op = 0; op < kOpCount; ++op) {
    const bool carries_value =
        op == static_cast<uint8_t>(Op::kPut) || op == static_cast<uint8_t>(Op::kCas);
    for (uint32_t k = 1; k <= kMaxKey; ++k) {
      for (uint32_t v = 0; v <= (carries_value ? kMaxValue : 0); ++v) {
        const std::string key = Bytes(k, 'a');
        const std::string value = Bytes(v, 'A');
        RequestHeader h = HeaderFor(static_cast<Op>(op), key, value,
                                    op == static_cast<uint8_t>(Op::kCas) ? 99 : 0);
        h.attempt = k + v;
        Slot slot = Encode(h, key, value);
        ParsedRequest parsed;
        Status status = Status::kBadRequest;
        ASSERT_EQ(ParseSlot(slot, &parsed, &status), Parse::kRequest)
            << "op " << +op << " k " << k << " v " << v;
        EXPECT_EQ(status, Status::kOk);
        EXPECT_EQ(parsed.key(), key);
        EXPECT_EQ(parsed.value, value);
        EXPECT_EQ(parsed.header.seq, kSeq);
        EXPECT_EQ(parsed.header.attempt, k + v);
        EXPECT_EQ(parsed.header.op, op);
        EXPECT_EQ(parsed.header.expected_version, op == static_cast<uint8_t>(Op::kCas) ? 99u : 0u);
        EXPECT_EQ(parsed.header.keyhash, mica::KeyHash(key));
        // The value lies inside the slot; the key is the parse's own copy.
        const auto* lo = reinterpret_cast<const char*>(slot.bytes.data());
        EXPECT_GE(parsed.value.data(), lo);
        EXPECT_LE(parsed.value.data() + parsed.value.size(), lo + kSlotBytes);
      }
    }
  }
}

// The flake of Robustness.RetransmissionsNeverRewriteABufferAPendingWrReads (1 BAD_REQUEST in
// ~5,000 requests, 1 run in 10 under ASan): a late retransmission (seq S, attempt 1) of an
// answered request was parsed while the slot's next request (seq S + window, another key) landed
// over it; the checksum had passed on S's key, then the key was hashed again in place. What the
// parse checked must be what it hands out: the key stays S's whatever lands afterwards.
TEST(ProtocolTest, TheParsedKeyIsTheCheckedOneWhateverLandsInTheSlotLater) {
  const std::string key = "key-of-seq-S";
  Slot slot = Encode(HeaderFor(Op::kGet, key, ""), key, "");
  ParsedRequest parsed;
  Status status = Status::kBadRequest;
  ASSERT_EQ(ParseSlot(slot, &parsed, &status), Parse::kRequest);
  ASSERT_EQ(status, Status::kOk);
  // The next request of the slot lands: same layout, another key.
  const std::string next_key = "key-of-next!";
  ASSERT_EQ(next_key.size(), key.size());
  const Slot next = Encode(HeaderFor(Op::kGet, next_key, ""), next_key, "");
  std::memcpy(slot.bytes.data(), next.bytes.data(), kSlotBytes);
  EXPECT_EQ(parsed.key(), key);
  EXPECT_EQ(mica::KeyHash(parsed.key()), parsed.header.keyhash);
}

// A key longer than any key is refused, never copied (the copy holds mica::kMaxKeyBytes).
TEST(ProtocolTest, AKeyOverTheStoreLimitIsRefusedUncopied) {
  const std::string key(mica::kMaxKeyBytes + 8, 'k');
  std::vector<uint8_t> message(RequestBytes(Op::kGet, static_cast<uint32_t>(key.size()), 0));
  EncodeRequest(HeaderFor(Op::kGet, key, ""), key, "", kSecret, message.data());
  ParsedRequest parsed;
  Status status = Status::kOk;
  const RequestLimits limits{mica::kMaxKeyBytes + 64, kMaxValue};
  ASSERT_EQ(ParseRequest(message.data(), static_cast<uint32_t>(message.size()), limits, kSecret,
                         &parsed, &status),
            Parse::kRequest);
  EXPECT_EQ(status, Status::kKeyTooLong);
  EXPECT_TRUE(parsed.key().empty());
}

// Issue 15: every status on the wire has a name, and the API's error for it starts with that
// name (what herd_kv prints and scripts match on). NO_MEMORY and INTERNAL are among them, with
// codes that say what they are.
TEST(ProtocolTest, EveryStatusHasANameAndAnApiErrorThatStartsWithIt) {
  int named = 0;
  for (int v = 0; v < 256; ++v) {
    Result r;
    r.status = static_cast<Status>(v);
    const std::string_view name = StatusName(r.status);
    if (name == "UNKNOWN_STATUS") {
      EXPECT_TRUE(absl::IsInternal(ResultError(r))) << v;
      continue;
    }
    ++named;
    const absl::Status error = ResultError(r);
    if (r.status == Status::kOk) {
      EXPECT_TRUE(error.ok());
      continue;
    }
    EXPECT_TRUE(absl::StartsWith(error.message(), std::string(name) + ": ")) << error;
  }
  EXPECT_EQ(named, 16);
  EXPECT_EQ(StatusName(Status::kBackupBusy), "BACKUP_BUSY");
  EXPECT_EQ(StatusName(Status::kNotPrimary), "NOT_PRIMARY");
  EXPECT_EQ(StatusName(Status::kNoMemory), "NO_MEMORY");
  EXPECT_EQ(StatusName(Status::kInternal), "INTERNAL");
  Result r;
  r.status = Status::kNoMemory;
  EXPECT_TRUE(absl::IsResourceExhausted(ResultError(r)));
  r.status = Status::kInternal;
  EXPECT_TRUE(absl::IsInternal(ResultError(r)));
  // The store's results that reach the wire keep their values.
  EXPECT_EQ(static_cast<int>(Status::kNoMemory), static_cast<int>(mica::Result::kNoMemory));
}

TEST(ProtocolTest, LengthsThatDoNotFitAreIncomplete) {
  const std::string key = Bytes(8, 'k');
  const std::string value = Bytes(40, 'v');
  Slot slot = Encode(HeaderFor(Op::kPut, key, value), key, value);
  ParsedRequest parsed;
  Status status;
  // A message shorter than the header, or than the lengths it names.
  EXPECT_EQ(ParseRequest(slot.bytes.data() + kSlotBytes - (kRequestTrailerBytes - 8),
                         kRequestTrailerBytes - 8, kLimits, kSecret, &parsed, &status),
            Parse::kIncomplete);
  EXPECT_EQ(ParseRequest(slot.request() + 8, slot.length - 8, kLimits, kSecret, &parsed, &status),
            Parse::kIncomplete);
  // Lengths that name more than the slot, with a checksum over what there is (the forger knows
  // the secret): still refused before any byte outside is read.
  for (uint32_t value_bytes : {kSlotBytes, UINT32_MAX - 3, UINT32_MAX}) {
    Slot big = Encode(HeaderFor(Op::kPut, key, value), key, value);
    big.header()->value_bytes = value_bytes;
    big.Rechecksum();
    EXPECT_EQ(ParseSlot(big, &parsed, &status), Parse::kIncomplete) << value_bytes;
  }
  Slot long_key = Encode(HeaderFor(Op::kPut, key, value), key, value);
  long_key.header()->key_bytes = UINT16_MAX;
  long_key.Rechecksum();
  EXPECT_EQ(ParseSlot(long_key, &parsed, &status), Parse::kIncomplete);
}

TEST(ProtocolTest, AnyFlippedBitMakesTheRequestIncomplete) {
  const std::string key = Bytes(5, 'k');     // key padding: 3 bytes
  const std::string value = Bytes(13, 'v');  // value padding: 3 bytes
  const Slot original =
      Encode(HeaderFor(Op::kCas, key, value, /*expected_version=*/42), key, value);
  for (uint32_t byte = 0; byte < original.length; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      Slot slot = original;
      slot.request()[byte] ^= static_cast<uint8_t>(1u << bit);
      ParsedRequest parsed;
      Status status;
      EXPECT_EQ(ParseSlot(slot, &parsed, &status), Parse::kIncomplete)
          << "byte " << byte << " bit " << bit << " of " << original.length;
    }
  }
}

TEST(ProtocolTest, WrongSecretIsIncomplete) {
  const std::string key = "key";
  Slot slot = Encode(HeaderFor(Op::kGet, key, ""), key, "");
  ParsedRequest parsed;
  Status status;
  EXPECT_EQ(ParseSlot(slot, &parsed, &status, kOtherSecret), Parse::kIncomplete);
  EXPECT_EQ(ParseSlot(slot, &parsed, &status, 0), Parse::kIncomplete);
  EXPECT_EQ(ParseSlot(slot, &parsed, &status, kSecret), Parse::kRequest);
}

TEST(ProtocolTest, AuthenticButInvalidFieldsGetAStatus) {
  const std::string key = "key-1";
  const std::string value = "value";
  auto with = [&](Op op, std::string_view k, std::string_view v, auto mutate) {
    RequestHeader h = HeaderFor(op, k, v);
    mutate(h);
    Slot slot = Encode(h, k, v);
    return StatusOf(slot);
  };
  auto none = [](RequestHeader&) {};
  EXPECT_EQ(with(Op::kPut, key, value, none), Status::kOk);
  // kRequestCopyToLanding is a GET's only (and carries its landing word), and no other flag is.
  EXPECT_EQ(with(Op::kPut, key, value, [](RequestHeader& h) { h.flags = kRequestCopyToLanding; }),
            Status::kBadRequest);
  for (uint8_t flags : {uint8_t{2}, uint8_t{0x80}, uint8_t{kRequestCopyToLanding | 2}}) {
    EXPECT_EQ(with(Op::kGet, key, "", [flags](RequestHeader& h) { h.flags = flags; }),
              Status::kBadRequest)
        << +flags;
  }
  for (uint8_t op : {kOpCount, uint8_t{200}, uint8_t{255}}) {
    EXPECT_EQ(with(Op::kGet, key, "", [op](RequestHeader& h) { h.op = op; }), Status::kInvalidOp);
  }
  EXPECT_EQ(with(Op::kGet, "", "", none), Status::kKeyTooLong);
  const std::string too_long_key = Bytes(kMaxKey + 1, 'k');
  EXPECT_EQ(with(Op::kGet, too_long_key, "", none), Status::kKeyTooLong);
  {  // Past mica's own bound too, with limits that would allow it.
    const std::string huge_key = Bytes(mica::kMaxKeyBytes + 8, 'h');
    Slot slot = Encode(HeaderFor(Op::kGet, huge_key, ""), huge_key, "");
    ParsedRequest parsed;
    Status status;
    ASSERT_EQ(ParseSlot(slot, &parsed, &status, kSecret, {mica::kMaxKeyBytes + 64, kMaxValue}),
              Parse::kRequest);
    EXPECT_EQ(status, Status::kKeyTooLong);
  }
  EXPECT_EQ(with(Op::kPut, key, Bytes(kMaxValue + 1, 'v'), none), Status::kValueTooLong);
  EXPECT_EQ(with(Op::kCas, key, Bytes(kMaxValue + 1, 'v'), none), Status::kValueTooLong);
  EXPECT_EQ(with(Op::kGet, key, value, none), Status::kBadRequest);
  EXPECT_EQ(with(Op::kDelete, key, value, none), Status::kBadRequest);
  EXPECT_EQ(with(Op::kCas, key, value, [](RequestHeader& h) { h.expected_version = 5; }),
            Status::kOk);
}

// What a request of each op carries and no more: a GET of a 16-byte key is 40 bytes (the
// original HERD's is 17; herd's used to be 80). The expected version travels only in a CAS, the
// landing word only with kRequestCopyToLanding, and the key hash and client id never: fields
// the encoder is given for them are not sent, and the parse computes the key hash itself.
TEST(ProtocolTest, ARequestCarriesOnlyTheFieldsItsOpNeeds) {
  static_assert(RequestBytes(Op::kGet, 16, 0) == 40);
  static_assert(RequestBytes(Op::kPut, 16, 32) == 72);
  static_assert(RequestBytes(Op::kCas, 16, 32) == 80);
  static_assert(RequestBytes(Op::kGet, 16, 0, kRequestCopyToLanding) == 48);
  static_assert(ResponseBytes(32) == 64);
  static_assert(kRequestHeaderMaxBytes == RequestHeaderBytes(Op::kCas, 0));
  const std::string key(16, 'k');
  for (Op op : {Op::kGet, Op::kPut, Op::kDelete, Op::kInsert}) {
    const std::string value = CarriesValue(op) ? "value" : "";
    RequestHeader h = HeaderFor(op, key, value, /*expected_version=*/5);
    h.keyhash = 12345;     // wrong, and not sent
    h.landing_buffer = 3;  // no kRequestCopyToLanding: not sent
    Slot slot = Encode(h, key, value);
    EXPECT_EQ(slot.length, RequestBytes(op, 16, static_cast<uint32_t>(value.size())));
    ParsedRequest parsed;
    Status status = Status::kBadRequest;
    ASSERT_EQ(ParseSlot(slot, &parsed, &status), Parse::kRequest) << OpName(op);
    EXPECT_EQ(status, Status::kOk) << OpName(op);
    EXPECT_EQ(parsed.header.expected_version, 0u) << OpName(op);
    EXPECT_EQ(parsed.header.landing_buffer, 0u) << OpName(op);
    EXPECT_EQ(parsed.header.keyhash, mica::KeyHash(key)) << OpName(op);
  }
}

// The copy-to-landing word: a buffer index in range, and a zero upper half.
TEST(ProtocolTest, TheLandingWordIsAnIndexInRange) {
  const std::string key = "landing";
  const RequestLimits limits{kMaxKey, kMaxValue, /*landing_buffers=*/4};
  auto status_of = [&](uint32_t landing, uint32_t upper_half) {
    RequestHeader h = HeaderFor(Op::kGet, key, "");
    h.flags = kRequestCopyToLanding;
    h.landing_buffer = landing;
    Slot slot = Encode(h, key, "");
    std::memcpy(slot.bytes.data() + kSlotBytes - kRequestTrailerBytes - sizeof(uint32_t),
                &upper_half, sizeof(upper_half));
    slot.Rechecksum();
    ParsedRequest parsed;
    Status status = Status::kOk;
    EXPECT_EQ(ParseSlot(slot, &parsed, &status, kSecret, limits), Parse::kRequest);
    if (status == Status::kOk) {
      EXPECT_EQ(parsed.header.landing_buffer, landing);
    }
    return status;
  };
  EXPECT_EQ(status_of(0, 0), Status::kOk);
  EXPECT_EQ(status_of(3, 0), Status::kOk);
  EXPECT_EQ(status_of(4, 0), Status::kBadRequest);
  EXPECT_EQ(status_of(0, 1), Status::kBadRequest);
  EXPECT_EQ(status_of(UINT32_MAX, UINT32_MAX), Status::kBadRequest);
}

// A hostile CAS that also sets kRequestCopyToLanding carries both extension words, the most
// header a parse copies: authentic, it is BAD_REQUEST (the flag is a GET's), with a key too long
// to copy too; never read outside the message.
TEST(ProtocolTest, ACasAskingForACopyCarriesBothWordsAndIsBadRequest) {
  const RequestLimits limits{mica::kMaxKeyBytes + 64, kMaxValue, /*landing_buffers=*/4};
  for (const std::string& key : {std::string("cas-key"), Bytes(mica::kMaxKeyBytes + 8, 'h')}) {
    RequestHeader h = HeaderFor(Op::kCas, key, "value", /*expected_version=*/9);
    h.flags = kRequestCopyToLanding;
    h.landing_buffer = 1;
    const auto key_bytes = static_cast<uint32_t>(key.size());
    std::vector<uint8_t> message(RequestBytes(Op::kCas, key_bytes, 5, kRequestCopyToLanding));
    ASSERT_EQ(message.size(), Pad8(key_bytes) + 8 + kRequestTrailerBytes + 16);
    ASSERT_EQ(EncodeRequest(h, key, "value", kSecret, message.data()), message.size());
    ParsedRequest parsed;
    Status status = Status::kOk;
    ASSERT_EQ(ParseRequest(message.data(), static_cast<uint32_t>(message.size()), limits, kSecret,
                           &parsed, &status),
              Parse::kRequest)
        << key.size();
    EXPECT_EQ(status, Status::kBadRequest) << key.size();
    EXPECT_EQ(parsed.header.expected_version, 9u);
    EXPECT_EQ(parsed.header.keyhash, 0u) << "no hash for a refused request";
  }
}

// SetRequestCopyToLanding grows a laid-out GET by its landing word once, and rewrites it after.
TEST(ProtocolTest, SetRequestCopyToLandingGrowsAGetOnce) {
  const std::string key = "copy-me";
  const RequestLimits limits{kMaxKey, kMaxValue, /*landing_buffers=*/8};
  std::vector<uint8_t> buffer(RequestBytes(Op::kGet, 7, 0, kRequestCopyToLanding));
  const uint32_t plain =
      EncodeRequest(HeaderFor(Op::kGet, key, ""), key, "", kSecret, buffer.data());
  ASSERT_EQ(plain, RequestBytes(Op::kGet, 7, 0));
  uint32_t length = plain;
  for (uint32_t landing : {5u, 2u}) {  // the second call rewrites the word in place
    length = SetRequestCopyToLanding(landing, kSecret, buffer.data(), length);
    ASSERT_EQ(length, plain + kRequestExtensionBytes);
    ParsedRequest parsed;
    Status status = Status::kBadRequest;
    ASSERT_EQ(ParseRequest(buffer.data(), length, limits, kSecret, &parsed, &status),
              Parse::kRequest);
    EXPECT_EQ(status, Status::kOk);
    EXPECT_EQ(parsed.header.flags, kRequestCopyToLanding);
    EXPECT_EQ(parsed.header.landing_buffer, landing);
    EXPECT_EQ(parsed.header.seq, kSeq);
    EXPECT_EQ(parsed.key(), key);
  }
}

// The marker packs both numbers; either one changing changes the word a poller sees.
TEST(ProtocolTest, TheMarkerPacksSequenceAndAttempt) {
  static_assert(SeqOfMarker(PackMarker(kMaxSeq, kMaxAttempt)) == kMaxSeq);
  static_assert(AttemptOfMarker(PackMarker(kMaxSeq, kMaxAttempt)) == kMaxAttempt);
  static_assert(PackMarker(1, 0) != PackMarker(1, 1));
  static_assert(PackMarker(1, 0) != 0);
  const std::string key = "marker";
  RequestHeader h = HeaderFor(Op::kGet, key, "");
  h.seq = kMaxSeq;
  h.attempt = kMaxAttempt;
  Slot slot = Encode(h, key, "");
  EXPECT_EQ(slot.header()->marker, PackMarker(kMaxSeq, kMaxAttempt));
  ParsedRequest parsed;
  Status status;
  ASSERT_EQ(ParseSlot(slot, &parsed, &status), Parse::kRequest);
  EXPECT_EQ(parsed.header.seq, kMaxSeq);
  EXPECT_EQ(parsed.header.attempt, kMaxAttempt);
}

TEST(ProtocolTest, SetRequestAttemptRechecksums) {
  const std::string key = "attempted";
  const std::string value = "v";
  Slot slot = Encode(HeaderFor(Op::kPut, key, value), key, value);
  const uint64_t before = slot.header()->checksum;
  SetRequestAttempt(3, kSecret, slot.request(), slot.length);
  EXPECT_NE(slot.header()->checksum, before);
  ParsedRequest parsed;
  Status status;
  ASSERT_EQ(ParseSlot(slot, &parsed, &status), Parse::kRequest);
  EXPECT_EQ(status, Status::kOk);
  EXPECT_EQ(parsed.header.attempt, 3u);
  EXPECT_EQ(parsed.value, value);
  // Setting it back gives back the original bytes.
  SetRequestAttempt(0, kSecret, slot.request(), slot.length);
  EXPECT_EQ(slot.header()->checksum, before);
  // The sequence number is kept.
  EXPECT_EQ(SeqOfMarker(slot.header()->marker), kSeq);
  // An attempt changed without the checksum is not a request.
  slot.header()->marker = PackMarker(kSeq, 1);
  EXPECT_EQ(ParseSlot(slot, &parsed, &status), Parse::kIncomplete);
}

// A response laid out at the end of `buffer`; returns its length.
uint32_t EncodeResponse(const ResponseHeader& header, std::string_view value, uint64_t secret,
                        std::vector<uint8_t>& buffer) {
  const uint32_t length = ResponseBytes(header.value_bytes);
  buffer.assign(length, 0xCD);
  if (!value.empty()) std::memcpy(buffer.data(), value.data(), value.size());
  EncodeResponseHeader(header, secret, buffer.data());
  return length;
}

TEST(ProtocolTest, ResponseRoundTrips) {
  for (uint32_t v = 0; v <= kMaxValue; ++v) {
    for (uint64_t secret : {uint64_t{0}, kSecret}) {
      const std::string value = Bytes(v, 'r');
      ResponseHeader h{};
      h.version = 77;
      h.value_bytes = v;
      h.client_id = kClient;  // not sent
      // Every field distinct and nonzero: the encoder packs the narrow ones into one word.
      h.status = static_cast<uint8_t>(Status::kCasFailed);
      h.flags = kResponseOutOfLine | kResponseCopied;
      h.worker = 0x1234;
      h.attempt = 4;
      h.seq = kSeq;
      std::vector<uint8_t> buffer;
      const uint32_t length = EncodeResponse(h, value, secret, buffer);
      ParsedResponse parsed;
      ASSERT_TRUE(ParseResponse(buffer.data(), length, secret, &parsed)) << v;
      EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(parsed.value), v), value);
      EXPECT_EQ(parsed.header.client_id, 0u) << "the client id does not travel";
      EXPECT_EQ(parsed.header.version, h.version);
      EXPECT_EQ(parsed.header.value_bytes, v);
      EXPECT_EQ(parsed.header.attempt, h.attempt);
      EXPECT_EQ(parsed.header.worker, h.worker);
      EXPECT_EQ(parsed.header.status, h.status);
      EXPECT_EQ(parsed.header.flags, h.flags);
      EXPECT_EQ(parsed.header.seq, kSeq);
      if (secret == 0) {
        EXPECT_EQ(parsed.header.checksum, 0u);
      } else {
        EXPECT_EQ(parsed.header.checksum, WireChecksum(secret, buffer.data(), length));
      }
    }
  }
}

TEST(ProtocolTest, ResponseRejections) {
  ResponseHeader h{};
  h.value_bytes = 20;
  h.seq = kSeq;
  std::vector<uint8_t> buffer;
  const uint32_t length = EncodeResponse(h, Bytes(20, 'x'), kSecret, buffer);
  ParsedResponse parsed;
  ASSERT_TRUE(ParseResponse(buffer.data(), length, kSecret, &parsed));
  // Shorter than the header; shorter than the value it names.
  EXPECT_FALSE(ParseResponse(buffer.data() + length - (kResponseHeaderBytes - 8),
                             kResponseHeaderBytes - 8, kSecret, &parsed));
  EXPECT_FALSE(ParseResponse(buffer.data() + 8, length - 8, kSecret, &parsed));
  EXPECT_FALSE(ParseResponse(buffer.data() + 8, length - 8, 0, &parsed));
  // Checksum mismatch: another secret, or any flipped bit; secret 0 skips the check.
  EXPECT_FALSE(ParseResponse(buffer.data(), length, kOtherSecret, &parsed));
  for (uint32_t byte = 0; byte < length; ++byte) {
    std::vector<uint8_t> flipped = buffer;
    flipped[byte] ^= 0x10;
    const bool length_field =
        byte >= length - kResponseHeaderBytes + offsetof(ResponseTrailer, value_bytes) &&
        byte < length - kResponseHeaderBytes + offsetof(ResponseTrailer, value_bytes) + 4;
    EXPECT_FALSE(ParseResponse(flipped.data(), length, kSecret, &parsed)) << byte;
    if (!length_field) {
      EXPECT_TRUE(ParseResponse(flipped.data(), length, 0, &parsed)) << byte;
    }
  }
}

// value_bytes within 7 of 2^32: Pad8 rounds it up in 32 bits, to 0, before ParseRequest and
// ParseResponse widen it, so the length check passes with a value "of 4 GiB" that is not there.
// Both promise views inside the message. Fails today (see the report); the worker and the client
// happen to refuse such values later (kValueTooLong, Accept's max_value_bytes check).
constexpr uint32_t kWrappingValueBytes[] = {UINT32_MAX - 6, UINT32_MAX - 3, UINT32_MAX};

TEST(ProtocolTest, ParseRequestValueBytesNearTwoTo32AreIncomplete) {
  const std::string key = "k";
  for (uint32_t value_bytes : kWrappingValueBytes) {
    // Laid out as Pad8 (wrapped) sees it: key, no value, header; checksummed with the secret,
    // as the session itself could write it.
    Slot slot = Encode(HeaderFor(Op::kPut, key, ""), key, "");
    slot.header()->value_bytes = value_bytes;
    slot.Rechecksum();
    ParsedRequest parsed;
    Status status = Status::kOk;
    const Parse parse = ParseSlot(slot, &parsed, &status);
    EXPECT_EQ(parse, Parse::kIncomplete)
        << "value_bytes " << value_bytes << " parsed with a " << parsed.value.size()
        << "-byte value view in a " << kSlotBytes << "-byte slot (status " << StatusName(status)
        << ")";
  }
}

TEST(ProtocolTest, ParseResponseValueBytesNearTwoTo32AreRefused) {
  for (uint32_t value_bytes : kWrappingValueBytes) {
    ResponseTrailer h{};
    h.value_bytes = value_bytes;
    h.marker = PackMarker(kSeq, 0);
    std::vector<uint8_t> b(kResponseHeaderBytes);
    std::memcpy(b.data(), &h, sizeof(h));
    ParsedResponse parsed;
    EXPECT_FALSE(ParseResponse(b.data(), kResponseHeaderBytes, 0, &parsed))
        << "a " << kResponseHeaderBytes << "-byte message accepted with value_bytes "
        << value_bytes;
    // With a secret: the checksum over the bytes Pad8 says there are.
    const uint64_t sum = WireChecksum(kSecret, b.data(), kResponseHeaderBytes);
    std::memcpy(b.data() + kResponseHeaderBytes - kChecksumFromEnd, &sum, sizeof(sum));
    EXPECT_FALSE(ParseResponse(b.data(), kResponseHeaderBytes, kSecret, &parsed))
        << "value_bytes " << value_bytes;
  }
}

TEST(ProtocolTest, WireChecksumDependsOnPositionLengthAndSecret) {
  std::vector<uint8_t> message(64, 0);
  for (uint32_t i = 0; i < 8; ++i) message[i] = static_cast<uint8_t>(i + 1);
  for (uint32_t i = 8; i < 16; ++i) message[i] = static_cast<uint8_t>(0x40 + i);
  const uint64_t base = WireChecksum(kSecret, message.data(), message.size());
  std::vector<uint8_t> swapped = message;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  EXPECT_NE(WireChecksum(kSecret, swapped.data(), swapped.size()), base);
  // Length: a zero word appended (same prefix) changes it; so does dropping one.
  std::vector<uint8_t> longer = message;
  longer.resize(72, 0);
  EXPECT_NE(WireChecksum(kSecret, longer.data(), longer.size()), base);
  EXPECT_NE(WireChecksum(kSecret, message.data(), 56), base);
  EXPECT_NE(WireChecksum(kOtherSecret, message.data(), message.size()), base);
  // The checksum word itself (16 bytes from the end) is skipped; the marker after it is not.
  std::vector<uint8_t> other_sum = message;
  other_sum[64 - kChecksumFromEnd] ^= 0xFF;
  EXPECT_EQ(WireChecksum(kSecret, other_sum.data(), other_sum.size()), base);
  std::vector<uint8_t> other_marker = message;
  other_marker[63] ^= 0x01;
  EXPECT_NE(WireChecksum(kSecret, other_marker.data(), other_marker.size()), base);
  // All-zero words at different positions are still position-dependent.
  std::vector<uint8_t> zeros(64, 0);
  std::vector<uint8_t> one_at_0 = zeros, one_at_8 = zeros;
  one_at_0[0] = 1;
  one_at_8[8] = 1;
  EXPECT_NE(WireChecksum(kSecret, one_at_0.data(), 64), WireChecksum(kSecret, one_at_8.data(), 64));
}

// Random bytes of random lengths: never read out of bounds (each message is its own heap block,
// so ASan sees an overread), never taken for a request or an authentic response.
TEST(ProtocolTest, FuzzRandomBytesAreNeverARequest) {
  std::printf("fuzz seed %llu, %d iterations\n", static_cast<unsigned long long>(kFuzzSeed),
              kFuzzIterations);
  std::mt19937_64 rng(kFuzzSeed);
  int requests = 0;
  int responses = 0;
  for (int i = 0; i < kFuzzIterations; ++i) {
    const uint32_t length = static_cast<uint32_t>(rng() % (kFuzzMaxLength + 1));
    std::vector<uint8_t> bytes(length);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    // Often make the lengths plausible, so the checksum is what refuses them.
    if (length >= kRequestTrailerBytes && rng() % 2 == 0) {
      RequestTrailer h;
      std::memcpy(&h, bytes.data() + length - kRequestTrailerBytes, sizeof(h));
      h.key_bytes = static_cast<uint16_t>(rng() % (kMaxKey + 1));
      h.value_bytes = static_cast<uint32_t>(rng() % (kMaxValue + 1));
      std::memcpy(bytes.data() + length - kRequestTrailerBytes, &h, sizeof(h));
    }
    ParsedRequest parsed;
    Status status;
    const uint64_t secret = i % 3 == 0 ? 0 : kSecret;
    if (ParseRequest(bytes.data(), length, kLimits, secret, &parsed, &status) == Parse::kRequest) {
      ++requests;
    }
    ParsedResponse response;
    if (ParseResponse(bytes.data(), length, kSecret, &response)) ++responses;
    // Without a secret only the lengths are checked: whatever they accept lies inside.
    if (ParseResponse(bytes.data(), length, 0, &response)) {
      EXPECT_GE(response.value, bytes.data());
      EXPECT_LE(response.value + response.header.value_bytes, bytes.data() + length);
    }
  }
  EXPECT_EQ(requests, 0) << "seed " << kFuzzSeed;
  EXPECT_EQ(responses, 0) << "seed " << kFuzzSeed;
}

// Mutations of a real request (bit flips, overwritten words, truncation) never parse as a
// request, except the unchanged original.
TEST(ProtocolTest, FuzzMutatedRequestsAreNeverARequest) {
  std::mt19937_64 rng(kFuzzSeed + 1);
  const std::string key = "fuzzkey";
  const std::string value = Bytes(30, 'f');
  const Slot original = Encode(HeaderFor(Op::kPut, key, value), key, value);
  int accepted = 0;
  for (int i = 0; i < kFuzzIterations / 4; ++i) {
    Slot slot = original;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      slot.request()[rng() % slot.length] = static_cast<uint8_t>(rng());
    }
    if (slot.bytes == original.bytes) continue;  // the edits undid each other
    ParsedRequest parsed;
    Status status;
    if (ParseSlot(slot, &parsed, &status) == Parse::kRequest) {
      ++accepted;
      ADD_FAILURE() << "iteration " << i << " accepted: key_bytes " << parsed.header.key_bytes
                    << " value_bytes " << parsed.header.value_bytes << " status "
                    << StatusName(status);
    }
  }
  EXPECT_EQ(accepted, 0) << "seed " << kFuzzSeed + 1;
}

}  // namespace
}  // namespace herd
