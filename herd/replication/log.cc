#include "herd/replication/log.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/str_format.h"
#include "util/word_checksum.h"

namespace herd {
namespace {

// Seeds the record checksum (detects damage and strays; it does not authenticate).
constexpr uint64_t kRedoChecksumSeed = kRedoMagic;

// Bounded by kMaxRedoRanges (a 32-bit word count: the loop's length is one a table can have).
uint64_t ChecksumOf(const RedoHeader& header, const uint8_t* table) {
  RedoHeader copy = header;
  copy.checksum = 0;
  const auto table_words = static_cast<uint32_t>(std::min(header.ranges, kMaxRedoRanges) *
                                                 (sizeof(RedoRange) / sizeof(uint64_t)));
  util::WordChecksum sum(kRedoChecksumSeed, sizeof(copy) + uint64_t{table_words} * 8);
  // Word by word (GCC's loop analysis misjudges AbsorbWords over a local object at -O2).
  uint64_t words[sizeof(copy) / sizeof(uint64_t)];
  std::memcpy(words, &copy, sizeof(copy));
  for (const uint64_t word : words) sum.Absorb(word);
  sum.AbsorbWords(table, table_words);
  return sum.Finish();
}

}  // namespace

uint64_t LandingWords::Quiet(bool* quiet) const {
  // Done first: if begun still equals it afterwards, no chain was between the two at that moment.
  const uint64_t done =
      std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(done_)).load(std::memory_order_acquire);
  const uint64_t begun =
      std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(begun_)).load(std::memory_order_acquire);
  *quiet = begun == done;
  return *quiet ? begun : 0;
}

bool LandingWords::StillQuiet(uint64_t begun) const {
  std::atomic_thread_fence(std::memory_order_acquire);  // the partition reads before this load
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(begun_))
             .load(std::memory_order_relaxed) == begun;
}

namespace {
uint64_t LoadWord(const uint64_t* word) {
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(word)).load(std::memory_order_acquire);
}
}  // namespace

bool ReleasedWords::Released(uint64_t version) const {
  std::atomic_thread_fence(std::memory_order_acquire);  // the partition reads before this load
  return version <= LoadWord(released_);
}

bool ReleasedWords::MissReleased() const {
  std::atomic_thread_fence(std::memory_order_acquire);
  // Deletes first: a DELETE that landed before the read named itself here before its in-place
  // writes; the watermark only grows, so reading it second is the most favourable and still true.
  const uint64_t deletes = LoadWord(deletes_);
  return deletes <= LoadWord(released_);
}

void ClearCommitLine(uint8_t* redo_area) {
  for (const uint64_t offset : {uint64_t{0}, kRedoBegunWordOffset, kRedoDoneWordOffset}) {
    std::memset(redo_area + offset, 0, sizeof(uint64_t));
  }
}

void SealRedoRecord(RedoHeader* header) {
  header->magic = kRedoMagic;
  header->checksum = ChecksumOf(*header, reinterpret_cast<const uint8_t*>(header + 1));
}

absl::Status ReplayLastBatch(absl::Span<const uint8_t> redo_area, absl::Span<uint8_t> region) {
  if (redo_area.size() <= kRedoCommitLineBytes) {
    return absl::InvalidArgumentError("a redo area has a commit line and a ring");
  }
  uint64_t commit;
  std::memcpy(&commit, redo_area.data(), sizeof(commit));
  if (commit == 0) return absl::OkStatus();  // nothing was ever committed
  const uint64_t ring_bytes = redo_area.size() - kRedoCommitLineBytes;
  const uint8_t* ring = redo_area.data() + kRedoCommitLineBytes;
  const uint64_t at = commit - 1;  // the record's offset in the ring
  // Every length below is 64-bit and checked against what is left: the bytes may be anything.
  if (at > ring_bytes || ring_bytes - at < sizeof(RedoHeader)) {
    return absl::DataLossError(
        absl::StrFormat("the commit word names ring offset %d: no record header fits there", at));
  }
  RedoHeader header;
  std::memcpy(&header, ring + at, sizeof(header));
  const uint64_t room = ring_bytes - at - sizeof(RedoHeader);
  if (header.magic != kRedoMagic || header.ranges > kMaxRedoRanges ||
      header.ranges > room / sizeof(RedoRange) || header.record_bytes > ring_bytes - at) {
    return absl::DataLossError(absl::StrFormat(
        "the committed redo record at ring offset %d is not one (magic %#x, %d ranges, %d bytes)",
        at, header.magic, header.ranges, header.record_bytes));
  }
  const uint8_t* table = ring + at + sizeof(RedoHeader);
  if (ChecksumOf(header, table) != header.checksum) {
    return absl::DataLossError("the committed redo record fails its checksum");
  }
  // Bounds first, for every range, so that nothing is applied unless all of it can be.
  const uint64_t table_end = sizeof(RedoHeader) + header.ranges * sizeof(RedoRange);
  if (header.record_bytes < table_end) {
    return absl::DataLossError(
        absl::StrFormat("the committed redo record claims %d bytes, less than its %d-range table",
                        header.record_bytes, header.ranges));
  }
  uint64_t data = table_end;
  for (uint64_t i = 0; i < header.ranges; ++i) {
    RedoRange r;
    std::memcpy(&r, table + i * sizeof(RedoRange), sizeof(r));
    if (r.offset > region.size() || r.bytes > region.size() - r.offset ||
        r.bytes > header.record_bytes || RedoPadded(r.bytes) > header.record_bytes - data) {
      return absl::DataLossError(absl::StrFormat(
          "redo record batch %d: range %d (%d bytes at %d) is outside the region or the record",
          header.batch, i, r.bytes, r.offset));
    }
    data += RedoPadded(r.bytes);
  }
  data = table_end;
  for (uint64_t i = 0; i < header.ranges; ++i) {
    RedoRange r;
    std::memcpy(&r, table + i * sizeof(RedoRange), sizeof(r));
    std::memcpy(region.data() + r.offset, ring + at + data, r.bytes);
    data += RedoPadded(r.bytes);
  }
  return absl::OkStatus();
}

}  // namespace herd
