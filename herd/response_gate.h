// The worker's seam for responses that must wait: a mutation's answer can be held after the
// store applied it and released later, without blocking the worker. Replication holds a PUT's
// answer until its backups' WRITEs complete (the write is acknowledged only once it survives the
// primary); anything else that must happen before an acknowledgement plugs in the same way.
//
// The contract, as the worker keeps it (tests/herd/response_gate_test.cc checks each rule):
// - Mutations (PUT, DELETE, CAS) that the store executed are offered to Hold, in batch order,
//   after the batch ran. GETs are offered to HoldRead only by a gate whose HoldsReads() is true
//   (a replicated primary: a GET must not answer with a write that a failover could still take
//   back); the others answer every GET with the batch that read it.
// - A held response reserves nothing: no send-queue entry, no staging buffer. A mutation's
//   outcome (status, version) lives in the slot's dedupe state until released; a held GET's
//   answer (status, version, value or descriptor) in one of the worker's held-read buffers
//   (kHeldReadBatches batches' worth: with none free, the GET goes unanswered and its client's
//   retransmission reads again).
// - While held, a retransmission of the mutation is consumed unanswered (never re-applied, never
//   answered from the dedupe table: that would acknowledge what is not yet safe). The release
//   answers the newest attempt seen.
// - A release names a held response by its HeldId. One that no longer matches (the client id
//   now belongs to a new session, or the slot moved on) is ignored. Once released, a
//   retransmission is answered from the dedupe table as any replay is.
// - A released response that finds its send queue full is dropped; the client's retransmission
//   replays it from the dedupe table.
// All calls are made on the worker's thread: an implementation needs no locks of its own for
// them (what it shares with other threads is its business), and must not block.
#ifndef HERD_HERD_RESPONSE_GATE_H_
#define HERD_HERD_RESPONSE_GATE_H_

#include <cstdint>

#include "absl/types/span.h"
#include "herd/config.h"
#include "herd/protocol.h"

namespace herd {

// Names one held response: the request's client, window slot, session generation and sequence.
struct HeldId {
  uint32_t client = 0;
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint64_t seq = 0;
  // The worker's: a held GET's saved answer (kNotARead for a mutation). A gate passes it back.
  uint32_t read = UINT32_MAX;
};
inline constexpr uint32_t kNotARead = UINT32_MAX;

// A mutation the store executed, offered to the gate.
struct ExecutedMutation {
  HeldId id;
  Op op = Op::kPut;
  uint64_t keyhash = 0;
  Status status = Status::kOk;  // the store's answer (CAS_FAILED and NOT_FOUND included)
  uint64_t version = 0;
};

class ResponseGate {
 public:
  virtual ~ResponseGate() = default;
  // Returns true to hold `mutation`'s response until a later Release names it.
  virtual bool Hold(const ExecutedMutation& mutation) = 0;
  // Whether GETs are offered to HoldRead (fixed for the gate's life: the worker keeps GET
  // answers aside before it knows).
  virtual bool HoldsReads() const { return false; }
  // A GET of `keyhash` the store answered in this batch (among the batch's Holds, before its
  // EndBatch), `found` with the item's `version`, or a miss: whether its answer must wait. The
  // worker then saves the answer and calls HoldRead (or, with no buffer free, leaves the GET
  // unanswered).
  virtual bool ReadMustWait(bool found, uint64_t version, uint64_t keyhash) const {
    (void)found, (void)version, (void)keyhash;
    return false;
  }
  // Asked as a batch begins: true when no GET could be made to wait by what happened before
  // it (ReadMustWait would say false whatever the store has now). The worker then skips
  // keeping the answers aside for the GETs ahead of the batch's first mutation.
  virtual bool ReadsCaughtUp() const { return false; }
  // Holds a GET's answer (ReadMustWait said so) until a later Release names `id` (released, as
  // every held response, in the order they were held).
  virtual void HoldRead(const HeldId& id) { (void)id; }
  // After each executed batch's Holds (e.g. to post the batch's replication WRITEs with one
  // doorbell).
  virtual void EndBatch() {}
  // Once per worker loop: fills `released` with held responses that may go now; returns how
  // many (at most released.size()).
  virtual uint32_t Release(absl::Span<HeldId> released) = 0;
  // Large writes (each up to a landing buffer's bytes) the next batch may admit beside a
  // batch of small requests: as many as a batch holds (postlist) unless the gate bounds what
  // one batch's changes may add; 0 while it is backlogged.
  virtual uint32_t LargeWritesAllowed(const Config& config) const { return config.postlist; }
};

}  // namespace herd

#endif  // HERD_HERD_RESPONSE_GATE_H_
