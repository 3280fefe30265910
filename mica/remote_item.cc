#include "mica/remote_item.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "util/word_checksum.h"

namespace mica {
namespace {

// Seeds the item checksum: a fixed, public constant (the checksum detects damage, it does not
// authenticate), distinct from any session's wire secret by construction of its purpose only.
constexpr uint64_t kItemChecksumSeed = 0x6d6963612d697465ULL;  // "mica-ite"

uint64_t ChecksumOf(const uint8_t* body, uint64_t body_bytes) {
  util::WordChecksum sum(kItemChecksumSeed, body_bytes);
  sum.AbsorbWords(body, body_bytes / sizeof(uint64_t));
  return sum.Finish();
}

}  // namespace

uint64_t ItemChecksum(const ItemHeader* item) {
  return ChecksumOf(reinterpret_cast<const uint8_t*>(item),
                    ItemBodyBytes(item->key_bytes, item->value_bytes));
}

absl::StatusOr<VerifiedItem> VerifyItem(const uint8_t* copy, uint64_t length, uint64_t keyhash,
                                        uint64_t version, std::string_view key) {
  ItemHeader header;
  if (length < sizeof(header) + kItemChecksumBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("an item copy of %d bytes is shorter than any item", length));
  }
  std::memcpy(&header, copy, sizeof(header));
  // Every length below is 64-bit: the copy's bytes may be anything.
  const uint64_t body = ItemBodyBytes(header.key_bytes, header.value_bytes);
  if ((header.flags & kItemHasChecksum) == 0 || body + kItemChecksumBytes != length) {
    // A torn header reads as any lengths: the copy is damaged, or was never this item.
    return absl::DataLossError(absl::StrFormat(
        "the item copy's header (flags %d, %d+%d bytes) does not describe a checksummed item of "
        "%d bytes: torn or overwritten",
        header.flags, header.key_bytes, header.value_bytes, length));
  }
  uint64_t stored;
  std::memcpy(&stored, copy + body, sizeof(stored));
  if (ChecksumOf(copy, body) != stored) {
    return absl::DataLossError("the item copy fails its checksum: torn or overwritten");
  }
  const std::string_view copied_key(reinterpret_cast<const char*>(copy) + sizeof(header),
                                    header.key_bytes);
  if (header.keyhash != keyhash || header.version != version ||
      (!key.empty() && copied_key != key)) {
    return absl::NotFoundError(absl::StrFormat(
        "the item read is whole but is another one (version %d, not %d)", header.version, version));
  }
  return VerifiedItem{header.version, copied_key,
                      std::string_view(copied_key.data() + header.key_bytes, header.value_bytes)};
}

}  // namespace mica
