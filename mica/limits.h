// The limits a partition enforces that its callers (herd's wire format, clients) size their own
// buffers by. Constants only: including this header links nothing of the store.
#ifndef HERD_MICA_LIMITS_H_
#define HERD_MICA_LIMITS_H_

#include <cstdint>

namespace mica {

// The longest key a partition stores; herd's request slots and key copies are sized by it.
inline constexpr uint32_t kMaxKeyBytes = 256;
inline constexpr uint32_t kDefaultMaxValueBytes = uint32_t{1} << 20;  // 1 MiB

// PartitionConfig::checksum_from_value_bytes that checksums nothing.
inline constexpr uint32_t kNoItemChecksums = UINT32_MAX;

}  // namespace mica

#endif  // HERD_MICA_LIMITS_H_
