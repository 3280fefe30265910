// Items read from outside the owning core: a one-sided RDMA READ of an item the partition named
// (GET's item_position / item_bytes), or any other copy made while the owner may be overwriting
// the log. The copy is trusted only if it is whole and is the item that was named:
//   - the checksum word at its end matches ItemChecksum of everything before it (a copy torn by
//     a concurrent overwrite, or holding bytes of several items, fails this with overwhelming
//     probability: the checksum is a 64-bit word hash, util/word_checksum.h);
//   - its keyhash, version and key are the ones the reader expects (another intact item now
//     lying at the same place is not the one named).
// Why a checksum and not versions at both ends: the log overwrites an item's middle with a
// later item's bytes (any alignment) while its first and last words may survive, so equal
// end-versions do not prove the middle intact; per-cache-line versions (FaRM) would cost 1/8 of
// the log and a copy to strip them. The checksum costs one pass over the item at write and at
// read, and nothing for items below the partition's checksum threshold (they are never read
// remotely). It does not authenticate: see docs/architecture.md's trust model.
#ifndef HERD_MICA_REMOTE_ITEM_H_
#define HERD_MICA_REMOTE_ITEM_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "mica/item.h"

namespace mica {

// The checksum word of an item laid out at `item` (header, key and value must be in place).
uint64_t ItemChecksum(const ItemHeader* item);

struct VerifiedItem {
  uint64_t version = 0;
  std::string_view key;    // into the copy
  std::string_view value;  // into the copy
};

// Checks a copy of `length` bytes (any alignment) against the item a reader was told of. An
// empty `key` is not compared (keys are never empty): (keyhash, version) alone names one item,
// since versions are unique within a partition.
// kDataLoss when the copy is torn or overwritten (read again), kNotFound when it is whole but
// another key's or another version's item, kInvalidArgument when the lengths are impossible.
absl::StatusOr<VerifiedItem> VerifyItem(const uint8_t* copy, uint64_t length, uint64_t keyhash,
                                        uint64_t version, std::string_view key);

}  // namespace mica

#endif  // HERD_MICA_REMOTE_ITEM_H_
