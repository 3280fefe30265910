// The hopscotch table file (issue 17): one header page, then buckets. Every byte is here; the
// consistency and durability arguments are in table.h and docs/architecture.md.
//
//   file:  [ header: 4096 B ][ bucket 0 .. bucket home_buckets + H - 2: 64 B each ]
//
// Header (little-endian; only the first 88 bytes are used, the rest of the page is zero):
//   off size field
//     0    8 magic            "HERDHOP\0"
//     8    4 format_version   kFormatVersion (2; version 1 left shard and shards outside the
//                             checksum, and is refused: rebuild it with hop_build)
//    12    4 header_bytes     4096: buckets start here, page-aligned, so every bucket is one
//                             64-byte-aligned cache line
//    16    8 home_buckets     power of two, 1..2^32: home = hash & (home_buckets - 1)
//    24    4 neighbourhood    H = 32
//    28    4 bucket_bytes     64
//    32    4 key_bytes        32
//    36    4 value_bytes      27
//    40    8 hash_seed        Jenkins lookup3 seed of the home hash (hash.h)
//    48    8 total_buckets    home_buckets + H - 1 (see "tail" below)
//    56    8 checksum         util::WordChecksum(kHeaderChecksumSeed) of bytes 0..55 then
//                             80..87: the geometry and the sharding, which never change after
//                             Create (a changed shard field would make a table claim keys it
//                             does not hold: false misses, no error)
//    64    8 state            0 = clean (closed by its writer), 1 = dirty (open for writing, or
//                             its writer died): not checksummed, so flipping it is one store.
//                             Open still checks a clean file for busy lines (table.h)
//    72    8 item_count       exact when clean; recounted by Open when dirty
//    80    4 shard            which of `shards` servers this table serves: it holds exactly the
//                             keys k with ServerOf(k, shards) == shard (hash.h)
//    84    4 shards           1..kMaxShards
//    88 4008 reserved         zero
//
// Bucket (64 B, one cache line):
//   off size field
//     0    1 info      bit 7: occupied; bits 0..6: version, odd while the writer rewrites the
//                      bucket's key or value (a per-bucket seqlock; table.h)
//     1    4 hop       little-endian u32: bit i set <=> bucket (this + i) holds a key whose home
//                      is this bucket (i = 0: the bucket itself)
//     5   32 key       1..32 bytes without NUL, zero-padded: a stored key is the bytes before
//                      its first NUL (no length field: the info byte has no room for one)
//    37   27 value     27 bytes, opaque
//   Bytes 0..7 are one aligned 64-bit word ("word 0": info, hop, key[0..2]); the writer changes
//   info and hop only by storing that whole word, so a reader never sees half a hop update.
//   An empty bucket's key and value bytes are meaningless (left from an earlier occupant).
//
// Tail: a key whose home is the last home bucket may sit up to H - 1 buckets after it, so the
// file holds H - 1 buckets past the last home bucket (no wrap-around). Every neighbourhood,
// buckets [home, home + H), is then ONE contiguous 2 KiB range at header_bytes + home * 64: one
// READ, never two. The price is 31 x 64 B per file.
#ifndef HERD_HOPSCOTCH_FORMAT_H_
#define HERD_HOPSCOTCH_FORMAT_H_

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hopscotch {

static_assert(std::endian::native == std::endian::little, "the file format is little-endian");

inline constexpr char kMagic[8] = {'H', 'E', 'R', 'D', 'H', 'O', 'P', '\0'};
inline constexpr uint32_t kFormatVersion = 2;
// The last version whose checksum left shard and shards out: what Open names as too old.
inline constexpr uint32_t kUnshardedChecksumVersion = 1;
inline constexpr uint64_t kHeaderBytes = 4096;
inline constexpr uint32_t kNeighbourhood = 32;  // H
inline constexpr uint32_t kBucketBytes = 64;
inline constexpr uint32_t kKeyBytes = 32;
inline constexpr uint32_t kValueBytes = 27;
inline constexpr uint64_t kNeighbourhoodBytes = uint64_t{kNeighbourhood} * kBucketBytes;
inline constexpr uint64_t kMaxHomeBuckets = uint64_t{1} << 32;  // the home hash is 32 bits
// The most servers one key space is sharded over (a sanity bound on a header field).
inline constexpr uint32_t kMaxShards = 1 << 16;
inline constexpr uint64_t kHeaderChecksumSeed = 0x68657264686f7031ULL;  // "herdhop1"

// Bucket byte offsets.
inline constexpr uint32_t kInfoOffset = 0;
inline constexpr uint32_t kHopOffset = 1;
inline constexpr uint32_t kKeyOffset = 5;
inline constexpr uint32_t kValueOffset = kKeyOffset + kKeyBytes;  // 37
inline constexpr uint8_t kOccupied = 0x80;
inline constexpr uint8_t kVersionMask = 0x7f;

static_assert(1 + 4 + kKeyBytes + kValueBytes == kBucketBytes, "a bucket is info+hop+key+value");
static_assert(kValueOffset + kValueBytes == kBucketBytes);
static_assert(kNeighbourhoodBytes == 2048, "a neighbourhood is one 2 KiB READ");
static_assert(kNeighbourhood == 32, "the hop info is a u32: one bit per neighbourhood bucket");
static_assert(kHeaderBytes % kBucketBytes == 0 && kHeaderBytes == 4096, "buckets are lines");

inline constexpr uint64_t kStateClean = 0;
inline constexpr uint64_t kStateDirty = 1;

struct Header {
  char magic[8];
  uint32_t format_version;
  uint32_t header_bytes;
  uint64_t home_buckets;
  uint32_t neighbourhood;
  uint32_t bucket_bytes;
  uint32_t key_bytes;
  uint32_t value_bytes;
  uint64_t hash_seed;
  uint64_t total_buckets;
  uint64_t checksum;
  uint64_t state;
  uint64_t item_count;
  uint32_t shard;
  uint32_t shards;
  uint8_t reserved[kHeaderBytes - 88];
};
static_assert(sizeof(Header) == kHeaderBytes);
static_assert(offsetof(Header, format_version) == 8 && offsetof(Header, header_bytes) == 12);
static_assert(offsetof(Header, home_buckets) == 16 && offsetof(Header, neighbourhood) == 24);
static_assert(offsetof(Header, bucket_bytes) == 28 && offsetof(Header, key_bytes) == 32);
static_assert(offsetof(Header, value_bytes) == 36 && offsetof(Header, hash_seed) == 40);
static_assert(offsetof(Header, total_buckets) == 48 && offsetof(Header, checksum) == 56);
static_assert(offsetof(Header, state) == 64 && offsetof(Header, item_count) == 72);
static_assert(offsetof(Header, shard) == 80 && offsetof(Header, shards) == 84);
// The checksum covers two ranges: the geometry before it and the sharding after the state and
// count (which change while the table is open and stay outside).
inline constexpr size_t kChecksummedHeaderBytes = offsetof(Header, checksum);
inline constexpr size_t kChecksummedShardingOffset = offsetof(Header, shard);
inline constexpr size_t kChecksummedShardingBytes = sizeof(uint32_t) * 2;  // shard, shards
static_assert(kChecksummedHeaderBytes % 8 == 0 && kChecksummedShardingOffset % 8 == 0 &&
                  kChecksummedShardingBytes == 8,
              "the checksum absorbs whole 8-byte words");

using Value = std::array<uint8_t, kValueBytes>;
using PaddedKey = std::array<uint8_t, kKeyBytes>;

// Bytes of file for `home_buckets` home buckets (plus the H - 1 tail buckets).
constexpr uint64_t FileBytes(uint64_t home_buckets) {
  return kHeaderBytes + (home_buckets + kNeighbourhood - 1) * kBucketBytes;
}

// Decoding one bucket's bytes (a snapshot or the mapping; plain reads).
inline uint8_t InfoOf(const uint8_t* bucket) { return bucket[kInfoOffset]; }
inline bool IsOccupied(uint8_t info) { return (info & kOccupied) != 0; }
inline bool IsBusy(uint8_t info) { return (info & 1) != 0; }  // odd version
inline uint32_t HopOf(const uint8_t* bucket) {
  uint32_t hop;
  std::memcpy(&hop, bucket + kHopOffset, sizeof(hop));
  return hop;
}

// Word 0 (bytes 0..7) as the writer stores it: info | hop << 8 | key[0..2] << 40.
inline uint8_t WordInfo(uint64_t w0) { return static_cast<uint8_t>(w0); }
inline uint32_t WordHop(uint64_t w0) { return static_cast<uint32_t>(w0 >> 8); }
inline uint64_t WithInfo(uint64_t w0, uint8_t info) { return (w0 & ~uint64_t{0xff}) | info; }
inline uint64_t WithHop(uint64_t w0, uint32_t hop) {
  return (w0 & ~(uint64_t{0xffffffff} << 8)) | (uint64_t{hop} << 8);
}

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_FORMAT_H_
