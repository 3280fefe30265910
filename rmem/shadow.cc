#include "rmem/shadow.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "util/round_up.h"

namespace rmem {

absl::StatusOr<ShadowMemory> ShadowMemory::Open(Client* client, const ShadowOptions& o) {
  if (o.tag == 0 || (o.tag & kShadowTagBit) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shadow tag %#x: want non-zero with the top bit clear", o.tag));
  }
  if (o.granule_bytes == 0 || o.granule_bytes % kRegionAlign != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("granule of %u bytes: want a multiple of %u",
                                                      o.granule_bytes, kRegionAlign));
  }
  if (o.bytes == 0) return absl::InvalidArgumentError("a shadow buffer of 0 bytes");
  ShadowMemory m;
  m.client_ = client;
  m.granule_ = o.granule_bytes;
  m.bytes_ = util::RoundUp(o.bytes, o.granule_bytes);
  absl::StatusOr<RemoteRegion> real = client->Alloc(m.bytes_, o.tag);
  if (!real.ok()) return real.status();
  absl::StatusOr<RemoteRegion> shadow = client->Alloc(m.bytes_, o.tag | kShadowTagBit);
  if (!shadow.ok()) return shadow.status();
  absl::StatusOr<uint8_t*> local = client->AllocateLocal(m.bytes_);
  if (!local.ok()) return local.status();
  m.real_ = *real;
  m.shadow_ = *shadow;
  m.local_ = *local;
  m.dirty_.assign((m.bytes_ / m.granule_ + 63) / 64, 0);
  return m;
}

absl::Status ShadowMemory::MarkDirty(uint64_t offset, uint64_t bytes) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return absl::OutOfRangeError(
        absl::StrFormat("[%u, +%u) leaves the %u-byte buffer", offset, bytes, bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  for (uint64_t g = offset / granule_; g <= (offset + bytes - 1) / granule_; ++g) {
    const uint64_t bit = uint64_t{1} << (g % 64);
    if ((dirty_[g / 64] & bit) == 0) {
      dirty_[g / 64] |= bit;
      ++dirty_count_;
    }
  }
  return absl::OkStatus();
}

absl::Status ShadowMemory::Write(uint64_t offset, const void* src, uint64_t bytes) {
  if (absl::Status s = MarkDirty(offset, bytes); !s.ok()) return s;
  if (bytes > 0) std::memcpy(local_ + offset, src, bytes);
  return absl::OkStatus();
}

absl::StatusOr<CommitStats> ShadowMemory::Commit() {
  CommitStats stats;
  if (dirty_count_ == 0) return stats;
  // Runs of dirty granules, in order.
  runs_.clear();
  const uint64_t granules = bytes_ / granule_;
  for (uint64_t g = 0; g < granules;) {
    const uint64_t word = dirty_[g / 64] >> (g % 64);
    if (word == 0) {
      g += 64 - g % 64;  // the rest of this word is clean
      continue;
    }
    g += __builtin_ctzll(word);
    uint64_t end = g;
    while (end < granules && (dirty_[end / 64] >> (end % 64) & 1) != 0) ++end;
    runs_.push_back({g * granule_, (end - g) * granule_});
    g = end;
  }
  // A transaction holds at most max_ops copies: past that, the smallest clean gaps between runs
  // are committed too (their bytes as the local buffer has them), so the commit still happens.
  if (runs_.size() > client_->max_ops()) {
    // Merge exactly the (runs - max_ops) smallest gaps (ties by position).
    std::vector<std::pair<uint64_t, size_t>> gaps;  // (gap bytes, index of the run after it)
    for (size_t i = 1; i < runs_.size(); ++i) {
      gaps.push_back({runs_[i].first - (runs_[i - 1].first + runs_[i - 1].second), i});
    }
    const size_t merges = runs_.size() - client_->max_ops();
    std::nth_element(gaps.begin(), gaps.begin() + (merges - 1), gaps.end());
    std::vector<bool> merge(runs_.size(), false);
    for (size_t k = 0; k < merges; ++k) merge[gaps[k].second] = true;
    size_t kept = 0;
    for (size_t i = 1; i < runs_.size(); ++i) {
      if (merge[i]) {
        runs_[kept].second = runs_[i].first + runs_[i].second - runs_[kept].first;
      } else {
        runs_[++kept] = runs_[i];
      }
    }
    runs_.resize(kept + 1);
  }
  // Each run: one WRITE into the shadow and one copy onto the real region.
  writes_.clear();
  for (const auto& [offset, run] : runs_) {
    writes_.push_back(ChainedWrite{local_ + offset, run, shadow_, offset});
    if (absl::Status s = client_->Cp(real_, offset, shadow_, offset, run); !s.ok()) return s;
    stats.bytes_written += run;
  }
  stats.runs = writes_.size();
  absl::StatusOr<TxnResult> txn = client_->WriteAndCommit(writes_);
  if (!txn.ok()) return txn.status();
  stats.txn = *txn;
  std::fill(dirty_.begin(), dirty_.end(), 0);
  dirty_count_ = 0;
  return stats;
}

absl::Status ShadowMemory::Recover() {
  if (absl::Status s = client_->Get(real_, 0, local_, bytes_); !s.ok()) return s;
  std::fill(dirty_.begin(), dirty_.end(), 0);
  dirty_count_ = 0;
  return absl::OkStatus();
}

}  // namespace rmem
