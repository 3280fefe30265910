// The worker's admission rules as pure functions: what a send into a request slot is, given
// the slot's dedupe state, and what an authentic request's fate is before it executes. The
// worker (worker.cc Admit) applies them; tests/herd/admission_test.cc checks them case by case
// with no fabric, and tests/herd/worker_rules_test.cc end to end.
#ifndef HERD_HERD_ADMISSION_H_
#define HERD_HERD_ADMISSION_H_

#include <cstdint>

#include "herd/protocol.h"

namespace herd {

// What one send (sequence number and attempt) into a slot is, against the newest request the
// slot has seen (`last_seq`, its newest send `last_attempt`, and whether the gate still holds
// its answer). Sequence numbers of a slot only grow; attempts of one request only grow.
enum class SendKind : uint8_t {
  kOld,                 // an older request's retransmission: its answer was sent; drop it
  kDuplicate,           // the same send landed again (a WRITE marker twice, a UD duplicate): drop
  kHeldRetransmission,  // a newer attempt of a request whose answer the gate holds: the release
                        // answers this attempt; nothing executes
  kRetransmission,      // a newer attempt of the newest request: a mutation replays its recorded
                        // outcome (never applied twice), a GET runs again
  kNew,                 // a newer request
};

inline SendKind ClassifySend(uint64_t last_seq, uint32_t last_attempt, bool held, uint64_t seq,
                             uint32_t attempt) {
  if (seq < last_seq) return SendKind::kOld;
  if (seq > last_seq) return SendKind::kNew;
  if (attempt <= last_attempt) return SendKind::kDuplicate;
  return held ? SendKind::kHeldRetransmission : SendKind::kRetransmission;
}

// The fate of a request that checked out (authentic, its slot consistent with its sequence
// number) and is not dropped by ClassifySend, in order of precedence: a request parsed with an
// error status keeps it; a key this worker does not own is WRONG_WORKER; a mutation at a backup
// is NOT_PRIMARY; a retransmitted mutation is answered from its recorded outcome (a replay).
enum class Admission : uint8_t { kKeepStatus, kWrongWorker, kNotPrimary, kReplay, kExecute };

inline Admission AdmissionOf(Status parsed, bool owns_key, bool at_backup, bool mutation,
                             SendKind kind) {
  if (parsed != Status::kOk) return Admission::kKeepStatus;
  if (!owns_key) return Admission::kWrongWorker;
  if (at_backup && mutation) return Admission::kNotPrimary;
  if (kind == SendKind::kRetransmission && mutation) return Admission::kReplay;
  return Admission::kExecute;
}

}  // namespace herd

#endif  // HERD_HERD_ADMISSION_H_
