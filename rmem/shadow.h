// Shadow pages: atomic commits of a local buffer into remote memory (the remote-memory design's
// client layer). A local buffer of `bytes` is mapped to two remote regions of that size: the
// real one, which only ever changes by a server-side transaction, and its shadow, which takes
// every uncommitted change. Commit() WRITEs the dirty granules into the shadow and has the
// server copy exactly those ranges onto the real region in one transaction: the real region
// holds either the previous commit or this one, whatever dies (this client mid-commit, the
// server mid-apply: pool.h). Recover() after a restart re-allocates both regions by tag (the
// same ones) and reads the real region back: the last committed state.
//
// Granule (ShadowOptions::granule_bytes): the unit of dirty tracking. Adjacent dirty granules
// coalesce into one run, and a run costs one WRITE WR and one queued copy (48 bytes on the wire,
// 32 in the redo record), whatever its length; so a fine granule moves fewer bytes for scattered
// small changes and costs nothing for large ones, except the bitmap (one bit per granule,
// scanned at each commit). The default is a cache line (kRegionAlign, 64 B): a 64-byte change
// commits 64 bytes, not a 4 KiB page (bench/rmem_bench measures commits against the granule).
// A transaction holds at most the server's max_ops copies: a commit with more runs also commits
// the smallest clean gaps between them (as the local buffer holds them), so it needs no more.
// For a buffer shared by tag with other writers, that could overwrite their commits in those
// gaps: commit such buffers before they gather max_ops runs.
#ifndef HERD_RMEM_SHADOW_H_
#define HERD_RMEM_SHADOW_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rmem/client.h"

namespace rmem {

// By convention a shadow region's tag is its real region's with the top bit set.
inline constexpr uint64_t kShadowTagBit = uint64_t{1} << 63;

struct ShadowOptions {
  uint64_t tag = 0;    // the real region's tag (top bit clear); the shadow's adds kShadowTagBit
  uint64_t bytes = 0;  // the buffer's size (rounded up to a granule)
  uint64_t granule_bytes = kRegionAlign;  // a multiple of kRegionAlign
};

struct CommitStats {
  uint64_t runs = 0;           // dirty runs: WRITEs and queued copies
  uint64_t bytes_written = 0;  // WRITE payload (the dirty granules)
  TxnResult txn;
};

class ShadowMemory {
 public:
  // Allocates (or finds, by tag) the real and shadow regions and a registered local buffer,
  // zero-filled and clean. Recover() to load what was committed before.
  static absl::StatusOr<ShadowMemory> Open(Client* client, const ShadowOptions& options);

  uint8_t* data() const { return local_; }
  uint64_t size() const { return bytes_; }
  // Copies into the local buffer and marks the range dirty.
  absl::Status Write(uint64_t offset, const void* src, uint64_t bytes);
  // For changes made through data() directly.
  absl::Status MarkDirty(uint64_t offset, uint64_t bytes);
  uint64_t dirty_granules() const { return dirty_count_; }

  // Makes every dirty byte part of the real region at once; clean afterwards. Nothing dirty: a
  // no-op (no transaction). On an error the buffer stays dirty and the real region holds the
  // last commit (or, for a lost reply, possibly this one: see Client::TxnGo).
  absl::StatusOr<CommitStats> Commit();
  // Reads the real region into the local buffer (the last commit); clean afterwards.
  absl::Status Recover();

  const RemoteRegion& real() const { return real_; }
  const RemoteRegion& shadow() const { return shadow_; }

 private:
  ShadowMemory() = default;
  Client* client_ = nullptr;
  uint64_t bytes_ = 0, granule_ = 0;
  uint8_t* local_ = nullptr;
  RemoteRegion real_, shadow_;
  std::vector<uint64_t> dirty_;  // one bit per granule
  uint64_t dirty_count_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> runs_;  // Commit's scratch: (offset, bytes)
  std::vector<ChainedWrite> writes_;
};

}  // namespace rmem

#endif  // HERD_RMEM_SHADOW_H_
