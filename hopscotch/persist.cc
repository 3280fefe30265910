#include "hopscotch/persist.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "absl/strings/str_format.h"
#include "util/errno_status.h"

namespace hopscotch {
namespace {

// The unit the flush instructions act on (every x86-64 CPU: 64 bytes; a bucket is one).
constexpr uintptr_t kCacheLineBytes = 64;
// CPUID leaf 7 (structured extended features), subleaf 0, EBX bits.
constexpr unsigned kCpuidExtendedFeatures = 7;
constexpr unsigned kEbxClflushopt = 1u << 23;
constexpr unsigned kEbxClwb = 1u << 24;

uintptr_t PageBytes() {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// One line's write-back, not yet ordered (FlushCacheLines and Persister fence after a batch).
void FlushLine(const void* line, FlushInstruction instruction) {
#if defined(__x86_64__)
  auto* p = static_cast<char*>(const_cast<void*>(line));
  switch (instruction) {
    case FlushInstruction::kClwb:
      // CLWB: writes the line back to memory if it is modified and MAY keep it cached (the
      // next read of it can still hit). Weakly ordered: only a later fence orders it.
      asm volatile("clwb %0" : "+m"(*p) : : "memory");
      break;
    case FlushInstruction::kClflushopt:
      // CLFLUSHOPT: writes the line back if modified and invalidates it in every cache. Weakly
      // ordered like CLWB (so several can be in flight at once).
      asm volatile("clflushopt %0" : "+m"(*p) : : "memory");
      break;
    case FlushInstruction::kClflush:
      // CLFLUSH: write-back and invalidate, ordered with respect to stores and other CLFLUSHes
      // (serialised: one line at a time, the slowest).
      asm volatile("clflush %0" : "+m"(*p) : : "memory");
      break;
  }
#else
  (void)line;
  (void)instruction;
#endif
}

// SFENCE: every earlier store, CLWB and CLFLUSHOPT is complete (for a flush: the line is in
// the persistence domain) before any later store becomes visible. This is what makes "flush
// step N, fence, store step N + 1" durable in that order.
void StoreFence() {
#if defined(__x86_64__)
  asm volatile("sfence" : : : "memory");
#endif
}

const uint8_t* LineOf(const uint8_t* p) {
  return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) & ~(kCacheLineBytes - 1));
}

}  // namespace

absl::StatusOr<Persistence> ParsePersistence(std::string_view name) {
  if (name == "process") return Persistence::kProcessCrash;
  if (name == "power") return Persistence::kPowerFailure;
  return absl::InvalidArgumentError(
      absl::StrFormat("persistence '%s': want process (survive kill -9) or power (survive power "
                      "failure: flushes at every ordering point)",
                      name));
}

std::string_view PersistenceName(Persistence persistence) {
  return persistence == Persistence::kPowerFailure ? "power" : "process";
}

bool CacheFlushSupported() {
#if defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

FlushInstruction BestFlushInstruction() {
  static const FlushInstruction best = [] {
#if defined(__x86_64__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, nullptr) >= kCpuidExtendedFeatures &&
        __get_cpuid_count(kCpuidExtendedFeatures, 0, &eax, &ebx, &ecx, &edx)) {
      if (ebx & kEbxClwb) return FlushInstruction::kClwb;
      if (ebx & kEbxClflushopt) return FlushInstruction::kClflushopt;
    }
#endif
    return FlushInstruction::kClflush;
  }();
  return best;
}

std::string_view FlushInstructionName(FlushInstruction instruction) {
  switch (instruction) {
    case FlushInstruction::kClwb:
      return "clwb";
    case FlushInstruction::kClflushopt:
      return "clflushopt";
    case FlushInstruction::kClflush:
      return "clflush";
  }
  return "?";
}

void FlushCacheLines(const void* p, size_t bytes, FlushInstruction instruction) {
  const auto* begin = static_cast<const uint8_t*>(p);
  for (const uint8_t* line = LineOf(begin); line < begin + bytes; line += kCacheLineBytes) {
    FlushLine(line, instruction);
  }
  StoreFence();
}

absl::Status SyncPages(const void* p, size_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first_page = begin & ~(PageBytes() - 1);
  if (msync(reinterpret_cast<void*>(first_page), begin + bytes - first_page, MS_SYNC) != 0) {
    return util::ErrnoStatus(absl::StatusCode::kInternal,
                             absl::StrFormat("msync of %u bytes", bytes));
  }
  return absl::OkStatus();
}

Persister::Persister(FlushMethod method, bool active, const uint8_t* base, WriteObserver* observer)
    : method_(method),
      active_(active),
      instruction_(BestFlushInstruction()),
      base_(base),
      observer_(observer) {}

void Persister::Stored(const uint8_t* word, uint64_t before, uint64_t after) {
  const uint8_t* line = LineOf(word);
  if (std::find(lines_.begin(), lines_.end(), line) == lines_.end()) lines_.push_back(line);
  if (observer_ != nullptr) observer_->OnStore(word - base_, before, after);
}

absl::Status Persister::PersistLines() {
  switch (method_) {
    case FlushMethod::kNone:
      break;
    case FlushMethod::kCacheLines:
      for (const uint8_t* line : lines_) FlushLine(line, instruction_);
      StoreFence();
      break;
    case FlushMethod::kSyncPages:
      for (size_t i = 0; i < lines_.size(); ++i) {
        const auto page = [&](size_t j) {
          return reinterpret_cast<uintptr_t>(lines_[j]) & ~(PageBytes() - 1);
        };
        bool synced = false;  // an earlier line of the same page
        for (size_t j = 0; j < i && !synced; ++j) synced = page(j) == page(i);
        if (synced) continue;
        if (absl::Status s = SyncPages(lines_[i], kCacheLineBytes); !s.ok()) return s;
      }
      break;
  }
  if (observer_ != nullptr) {
    for (const uint8_t* line : lines_) observer_->OnPersist(line - base_, kCacheLineBytes);
  }
  lines_.clear();
  return absl::OkStatus();
}

absl::Status Persister::PersistRange(const uint8_t* p, uint64_t bytes) {
  switch (method_) {
    case FlushMethod::kNone:
      break;
    case FlushMethod::kCacheLines:
      FlushCacheLines(p, bytes, instruction_);
      break;
    case FlushMethod::kSyncPages:
      if (absl::Status s = SyncPages(p, bytes); !s.ok()) return s;
      break;
  }
  if (observer_ != nullptr) observer_->OnPersist(p - base_, bytes);
  // Lines inside the range are durable now.
  lines_.erase(std::remove_if(lines_.begin(), lines_.end(),
                              [&](const uint8_t* line) { return line >= p && line < p + bytes; }),
               lines_.end());
  return absl::OkStatus();
}

}  // namespace hopscotch
