// The poller of request slots, shared by herd's worker and the raw echo baseline (so the ratio
// between the two measures the engine and nothing else).
//
// A region of request slots is laid out [client][worker][window]: one poller (a worker) owns the
// runs of `window` slots at its worker index, one run per client, `client_stride` bytes apart.
// A request is written to END at its slot's end and its last 8 bytes are the marker: nonzero
// means "something landed, look". The scanner visits slots round-robin from where it stopped,
// two cursors and no division per slot, and consumes a marker (compare-and-swap to 0, so a
// marker that a newer WRITE replaced meanwhile survives) only when the visitor says so.
// It scans only the runs of the clients it was told are active (SetClients; all of them until
// then): a server provisioned for 1,024 clients with 16 connected scans 16 runs, not 1,024.
#ifndef HERD_HERD_SLOT_SCANNER_H_
#define HERD_HERD_SLOT_SCANNER_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace herd {

// What the visitor did with a slot whose marker was set.
enum class SlotAction : uint8_t {
  kConsume,  // the request was taken (or dropped for good): clear the marker
  kLeave,    // not yet (e.g. a WRITE still landing): look at it again on a later pass
};

struct SlotLayout {
  uint8_t* first = nullptr;    // the poller's first slot: client 0, window slot 0
  uint32_t clients = 0;        // runs (clients) to scan
  uint32_t window = 0;         // slots per run
  uint32_t slot_bytes = 0;     // one slot
  uint64_t client_stride = 0;  // bytes from one client's run to the next
};

class SlotScanner {
 public:
  explicit SlotScanner(const SlotLayout& layout) : layout_(layout) {
    clients_.reserve(layout.clients);  // SetClients never allocates
    for (uint32_t c = 0; c < layout.clients; ++c) clients_.push_back(c);
  }

  // The clients whose runs Scan visits from now on (each below layout.clients, at most
  // layout.clients of them). Not for the hot path: call it when the set changes.
  void SetClients(absl::Span<const uint32_t> clients) {
    clients_.assign(clients.begin(), clients.end());
    if (run_ >= clients_.size()) {
      run_ = 0;
      slot_ = 0;
    }
  }
  uint32_t active_clients() const { return static_cast<uint32_t>(clients_.size()); }

  // Visits slots from the cursor for at most one full pass, calling
  // visit(client, slot, slot_start, marker) for each slot with a nonzero marker, until done()
  // says the caller has enough. Returns the slots visited.
  template <typename Visit, typename Done>
  uint32_t Scan(Visit&& visit, Done&& done) {
    const auto runs = static_cast<uint32_t>(clients_.size());
    const uint32_t total = runs * layout_.window;
    uint32_t scanned = 0;
    for (; scanned < total && !done(); ++scanned) {
      const uint32_t client = clients_[run_];
      const uint32_t slot = slot_;
      if (++slot_ == layout_.window) {
        slot_ = 0;
        run_ = run_ + 1 == runs ? 0 : run_ + 1;
      }
      uint8_t* start =
          layout_.first + client * layout_.client_stride + uint64_t{slot} * layout_.slot_bytes;
      std::atomic_ref<uint64_t> marker(
          *reinterpret_cast<uint64_t*>(start + layout_.slot_bytes - sizeof(uint64_t)));
      uint64_t seq = marker.load(std::memory_order_acquire);
      if (seq == 0) continue;
      if (visit(client, slot, start, seq) == SlotAction::kConsume) {
        marker.compare_exchange_strong(seq, 0, std::memory_order_acq_rel);
      }
    }
    return scanned;
  }

 private:
  const SlotLayout layout_;
  std::vector<uint32_t> clients_;  // the runs scanned, by client
  uint32_t run_ = 0;               // the next slot to look at: clients_[run_], slot_
  uint32_t slot_ = 0;
};

}  // namespace herd

#endif  // HERD_HERD_SLOT_SCANNER_H_
