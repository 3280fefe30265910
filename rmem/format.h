// The remote-memory pool's file format (issue 18), byte by byte. One file (or anonymous memory)
// holds everything the server must not lose: which regions exist and which tag each is tied to,
// the transaction being applied, and what each client's last transaction was, next to the data.
//
//   [ header: 4096 B ][ region table ][ client table ][ redo area ][ data: pool_bytes ]
//   each section starts on a 4096-byte boundary (kSectionAlign)
//
//   header      magic "HERDRMEM"(8) version(4)=1 header_bytes(4)=4096 pool_bytes(8)
//               max_regions(4) max_clients(4) max_ops(4) zero(4) data_offset(8)
//               checksum(8) of bytes 0..47 | zero
//   region      tag(8) offset(8) bytes(8) state(4) zero(4)          32 B, kRegionBytes
//               state 0: free record; kRegionLive: the region [offset, offset + bytes) of the
//               data area is allocated and tied to `tag` (never 0). The tag and extent are
//               stored before the state, so a record is live only once it is complete.
//   client      client_id(8) secret(8) last_txn(8) last_code(4) zero(4) last_used(8) zero(24)
//               64 B, kClientBytes. client_id 0: unused (the id is stored last when a record is
//               taken, first when it is given up). secret: what a client presents to resume its
//               identity on a new connection (random, as the id). last_txn: the newest
//               transaction of that client answered (a retried txn_go with this id is answered
//               as before, not applied again), last_code its outcome. last_used: the pool's use
//               clock when the client last registered, resumed or committed (the least recently
//               used record is the one taken over when the table is full).
//   redo        state(8) client_id(8) txn_id(8) ops(4) zero(4) checksum(8) zero(24) | ops
//               64-byte head, then `ops` records of 32 B: kind(4) zero(4) a(8) b(8) bytes(8)
//               copy: a = source offset, b = destination offset (both in the data area);
//               free: a = region record index, b = its tag.
//               state kRedoCommitted (the commit point, one 8-byte store) means: apply these
//               ops, then record the txn in the client table, then store state 0.
//
// Offsets, never pointers: a region is named by its offset in the data area, which means the same
// thing in every process that maps the file and after a restart.
#ifndef HERD_RMEM_FORMAT_H_
#define HERD_RMEM_FORMAT_H_

#include <cstddef>
#include <cstdint>

namespace rmem {

inline constexpr uint64_t kPoolMagic = 0x4d454d5244524548;  // "HERDRMEM" little-endian
inline constexpr uint32_t kPoolVersion = 2;                 // 2: client records carry a secret
inline constexpr uint64_t kHeaderBytes = 4096;
inline constexpr uint64_t kSectionAlign = 4096;  // every section starts on a page
inline constexpr uint64_t kChecksummedHeaderBytes = 48;
inline constexpr uint64_t kRegionBytes = 32;
inline constexpr uint64_t kClientBytes = 64;
inline constexpr uint64_t kRedoHeadBytes = 64;
inline constexpr uint64_t kRedoOpBytes = 32;
// Regions start and end on cache lines: two regions never share a line (a one-sided WRITE to
// one never tears a line of another), and the shadow layer's unit divides every region.
inline constexpr uint64_t kRegionAlign = 64;

inline constexpr uint32_t kRegionLive = 1;
inline constexpr uint64_t kRedoCommitted = 0x54494d4d4f43;  // "COMMIT": anything else is empty

// Limits a pool is created with (and the most a file may claim).
inline constexpr uint32_t kDefaultMaxRegions = 65536;
inline constexpr uint32_t kDefaultMaxClients = 1024;
// Ops one transaction may queue: bounds the redo area (128 KiB) and one txn_go's work.
inline constexpr uint32_t kDefaultMaxOps = 4096;
inline constexpr uint32_t kMaxRegionsLimit = 1u << 24;
inline constexpr uint32_t kMaxClientsLimit = 1u << 20;
inline constexpr uint32_t kMaxOpsLimit = 1u << 16;
inline constexpr uint64_t kMaxPoolBytes = uint64_t{1} << 44;  // 16 TiB

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t pool_bytes;
  uint32_t max_regions;
  uint32_t max_clients;
  uint32_t max_ops;
  uint32_t zero;
  uint64_t data_offset;
  uint64_t checksum;  // of the 48 bytes above
};
static_assert(sizeof(Header) == kChecksummedHeaderBytes + 8);

struct RegionRecord {
  uint64_t tag;
  uint64_t offset;  // in the data area
  uint64_t bytes;
  uint32_t state;
  uint32_t zero;
};
static_assert(sizeof(RegionRecord) == kRegionBytes);

struct ClientRecord {
  uint64_t client_id;
  uint64_t secret;
  uint64_t last_txn;
  uint32_t last_code;  // absl::StatusCode of that transaction's outcome
  uint32_t zero;
  uint64_t last_used;
  uint64_t zero2[3];
};
static_assert(sizeof(ClientRecord) == kClientBytes);

struct RedoHead {
  uint64_t state;
  uint64_t client_id;
  uint64_t txn_id;
  uint32_t ops;
  // The outcome Apply records for the client: 0 (applied), or a refusal's absl::StatusCode
  // (then ops == 0): a refusal goes through the redo too, so the client's record (last_txn and
  // last_code, two stores) is never left half-written by a kill.
  uint32_t code;
  uint64_t checksum;  // of client_id, txn_id, ops, code and the op records
  uint64_t zero2[3];
};
static_assert(sizeof(RedoHead) == kRedoHeadBytes);

enum class OpKind : uint32_t { kCopy = 1, kFree = 2 };

struct RedoOp {
  uint32_t kind;  // OpKind
  uint32_t zero;
  uint64_t a;
  uint64_t b;
  uint64_t bytes;
};
static_assert(sizeof(RedoOp) == kRedoOpBytes);

// The geometry every section's place follows from.
struct Layout {
  uint64_t region_offset = 0, client_offset = 0, redo_offset = 0, data_offset = 0;
  uint64_t file_bytes = 0;
};
Layout LayoutFor(uint64_t pool_bytes, uint32_t max_regions, uint32_t max_clients, uint32_t max_ops);

}  // namespace rmem

#endif  // HERD_RMEM_FORMAT_H_
