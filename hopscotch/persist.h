// Making the table writer's stores durable against power failure (table.h's "Durability"), and
// the test hook that watches them. Internal to hopscotch/ apart from Persistence and
// WriteObserver, which table.h's options name.
//
// The writer's protocol needs each ordered step durable before the step that depends on it: a
// filled line before the hop bit that publishes it, a hop switch before the clear of the
// move's source, and everything at the end of an Insert. The writer calls Persister::Stored
// after each store and Persister::Persist at each of those points; Persist makes every line
// stored since the previous point durable:
//   - kCacheLines (the mapping IS the persistent memory: a MAP_SYNC mapping of a DAX file, whose
//     block mapping the kernel makes durable before a write fault returns, or a device-DAX
//     character device, which has no file system at all): write the lines back from the CPU
//     caches (CLWB, else CLFLUSHOPT, else CLFLUSH), then SFENCE;
//   - kSyncPages (a page-cache file): msync(MS_SYNC) of the pages holding the lines. A system
//     call per ordering point, on the upsert path only: lookups are one-sided READs and never
//     come here.
#ifndef HERD_HOPSCOTCH_PERSIST_H_
#define HERD_HOPSCOTCH_PERSIST_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hopscotch {

// What an acknowledged Insert survives.
enum class Persistence {
  // The writer process dying (kill -9): its stores are in the shared mapping, i.e. the page
  // cache or the DAX media behind the CPU caches, as soon as they are made. No flushes: free.
  kProcessCrash,
  // Also power failure or a kernel crash: each ordered step is flushed before the next one and
  // Insert returns once its stores are durable.
  kPowerFailure,
};

// "process" or "power" (hop_server's --persistence).
absl::StatusOr<Persistence> ParsePersistence(std::string_view name);
std::string_view PersistenceName(Persistence persistence);

// How a mapping's lines are made durable.
enum class FlushMethod {
  kNone,        // anonymous memory: nothing outlives the process
  kCacheLines,  // cache-line write-back + SFENCE (MAP_SYNC DAX file, device-DAX)
  kSyncPages,   // msync(MS_SYNC) of the pages (a file in the page cache)
};

enum class FlushInstruction { kClwb, kClflushopt, kClflush };
// The best instruction this CPU has (CPUID leaf 7: EBX bit 24 CLWB, bit 23 CLFLUSHOPT; CLFLUSH
// is in every x86-64 CPU), asked once.
FlushInstruction BestFlushInstruction();
std::string_view FlushInstructionName(FlushInstruction instruction);

// Writes every cache line of [p, p + bytes) back with `instruction`, then SFENCE: on return the
// lines are in the persistence domain (on an ADR platform, the memory controller's queues).
// x86-64 only; elsewhere FlushMethod::kCacheLines is refused when a table is mapped.
void FlushCacheLines(const void* p, size_t bytes, FlushInstruction instruction);
// Whether FlushCacheLines exists on this architecture.
bool CacheFlushSupported();
// msync(MS_SYNC) of the pages covering [p, p + bytes).
absl::Status SyncPages(const void* p, size_t bytes);

// Tests: sees, in program order, every store the writer makes to a kPowerFailure table's
// mapping (the byte offset of the 8-byte word in the file, its value before and after) and
// every range made durable. Called on the writer's thread.
class WriteObserver {
 public:
  virtual ~WriteObserver() = default;
  virtual void OnStore(uint64_t offset, uint64_t before, uint64_t after) = 0;
  virtual void OnPersist(uint64_t offset, uint64_t bytes) = 0;
};

// One mapping's durability points. Inactive (kProcessCrash): Stored is never called, Persist
// finds nothing to do. PersistRange works in either mode (Create, recovery, Close).
class Persister {
 public:
  Persister() = default;
  Persister(FlushMethod method, bool active, const uint8_t* base, WriteObserver* observer);

  bool active() const { return active_; }
  FlushMethod method() const { return method_; }
  // After a store of `after` (was `before`) to the 8-byte word at `word` of the mapping.
  void Stored(const uint8_t* word, uint64_t before, uint64_t after);
  // An ordering point: every line stored since the previous one is durable on return.
  absl::Status Persist() { return lines_.empty() ? absl::OkStatus() : PersistLines(); }
  // Makes [p, p + bytes) durable, whatever was stored there.
  absl::Status PersistRange(const uint8_t* p, uint64_t bytes);

 private:
  absl::Status PersistLines();

  FlushMethod method_ = FlushMethod::kNone;
  bool active_ = false;
  FlushInstruction instruction_ = FlushInstruction::kClflush;
  const uint8_t* base_ = nullptr;
  WriteObserver* observer_ = nullptr;
  // Lines stored to since the last ordering point (an Insert step touches one or two).
  absl::InlinedVector<const uint8_t*, 4> lines_;
};

}  // namespace hopscotch

#endif  // HERD_HOPSCOTCH_PERSIST_H_
