#include "hopscotch/wire.h"

#include <bit>
#include <string_view>

#include "absl/strings/str_format.h"
#include "transport/control/wire.h"

namespace hopscotch {

using transport::control::WireReader;
using transport::control::WireWriter;

namespace {

// Hello flags.
constexpr uint32_t kHelloLookupQp = 1;

WireWriter& WriteTable(const HopWelcome& w, WireWriter& out) {
  return out.U64(w.table_addr)
      .U32(w.table_rkey)
      .U64(w.table_bytes)
      .U64(w.home_buckets)
      .U64(w.hash_seed)
      .U32(w.shard)
      .U32(w.shards);
}

void ReadTable(WireReader& r, HopWelcome* w) {
  r.U64(&w->table_addr);
  r.U32(&w->table_rkey);
  r.U64(&w->table_bytes);
  r.U64(&w->home_buckets);
  r.U64(&w->hash_seed);
  r.U32(&w->shard);
  r.U32(&w->shards);
}

// What a client relies on: a table of a valid geometry, an address range that does not wrap,
// shard < shards.
absl::Status ValidateTable(const HopWelcome& w) {
  if (w.home_buckets == 0 || w.home_buckets > kMaxHomeBuckets ||
      !std::has_single_bit(w.home_buckets) || w.table_bytes != FileBytes(w.home_buckets) ||
      w.table_addr + w.table_bytes < w.table_addr || w.shards == 0 || w.shards > kMaxShards ||
      w.shard >= w.shards) {
    return absl::DataLossError(absl::StrFormat(
        "hop welcome describes no valid table (%u home buckets, %u bytes at %#x, shard %u of %u)",
        w.home_buckets, w.table_bytes, w.table_addr, w.shard, w.shards));
  }
  return absl::OkStatus();
}

absl::Status CheckVersion(uint32_t version) {
  if (version != kHopProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "hop protocol version %u, this server speaks %u", version, kHopProtocolVersion));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<uint8_t> Encode(const HopHello& hello) {
  return WireWriter()
      .U32(hello.version)
      .U32(hello.lookup_qp ? kHelloLookupQp : 0)
      .Endpoint(hello.qp)
      .Take();
}

std::vector<uint8_t> Encode(const HopWelcome& w) {
  WireWriter out;
  out.Endpoint(w.qp);
  return WriteTable(w, out).Take();
}

std::vector<uint8_t> EncodeCmHello() { return WireWriter().U32(kHopProtocolVersion).Take(); }

absl::Status DecodeCmHello(absl::Span<const uint8_t> bytes) {
  const std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  WireReader r(copy, "hop RDMA-CM hello");
  uint32_t version = 0;
  r.U32(&version);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return CheckVersion(version);
}

std::vector<uint8_t> EncodeCmWelcome(const HopWelcome& welcome) {
  WireWriter out;
  return WriteTable(welcome, out).Take();
}

absl::StatusOr<HopWelcome> DecodeCmWelcome(absl::Span<const uint8_t> bytes) {
  const std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  WireReader r(copy, "hop RDMA-CM welcome");
  HopWelcome w;
  ReadTable(r, &w);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (absl::Status s = ValidateTable(w); !s.ok()) return s;
  return w;
}

std::vector<uint8_t> Encode(const std::vector<HopUpsert>& upserts) {
  WireWriter w;
  w.U32(static_cast<uint32_t>(upserts.size()));
  for (const HopUpsert& u : upserts) {
    w.Bytes(u.key);
    w.Bytes(std::string_view(reinterpret_cast<const char*>(u.value.data()), u.value.size()));
  }
  return w.Take();
}

std::vector<uint8_t> Encode(const HopUpserted& upserted) {
  WireWriter w;
  w.U32(static_cast<uint32_t>(upserted.codes.size()));
  for (uint32_t code : upserted.codes) w.U32(code);
  return w.Take();
}

absl::StatusOr<HopHello> DecodeHello(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "hop hello");
  HopHello hello;
  uint32_t flags = 0;
  r.U32(&hello.version);
  r.U32(&flags);
  r.Endpoint(&hello.qp);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (absl::Status s = CheckVersion(hello.version); !s.ok()) return s;
  if ((flags & ~kHelloLookupQp) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("hop hello flags %#x unknown", flags));
  }
  hello.lookup_qp = (flags & kHelloLookupQp) != 0;
  return hello;
}

absl::StatusOr<HopWelcome> DecodeWelcome(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "hop welcome");
  HopWelcome w;
  r.Endpoint(&w.qp);
  ReadTable(r, &w);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (absl::Status s = ValidateTable(w); !s.ok()) return s;
  return w;
}

absl::StatusOr<std::vector<HopUpsert>> DecodeUpserts(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "hop upsert");
  uint32_t n = 0;
  if (!r.U32(&n)) return r.status();
  if (n == 0 || n > kMaxUpsertsPerMessage) {
    return absl::InvalidArgumentError(
        absl::StrFormat("an upsert message carries 1..%u pairs, not %u", kMaxUpsertsPerMessage, n));
  }
  std::vector<HopUpsert> upserts(n);
  for (HopUpsert& u : upserts) {
    std::string value;
    r.Bytes(&u.key, kKeyBytes);
    if (!r.Bytes(&value, kValueBytes)) break;
    if (value.size() != kValueBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("an upsert value is %u bytes, not %u", value.size(), kValueBytes));
    }
    std::memcpy(u.value.data(), value.data(), kValueBytes);
  }
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return upserts;
}

absl::StatusOr<HopUpserted> DecodeUpserted(const std::vector<uint8_t>& bytes) {
  WireReader r(bytes, "hop upserted");
  uint32_t n = 0;
  if (!r.U32(&n)) return r.status();
  if (n > kMaxUpsertsPerMessage) {
    return absl::DataLossError(absl::StrFormat("%u upsert statuses", n));
  }
  HopUpserted upserted;
  upserted.codes.resize(n);
  for (uint32_t& code : upserted.codes) r.U32(&code);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return upserted;
}

}  // namespace hopscotch
