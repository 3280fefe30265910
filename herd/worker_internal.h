// What the worker's source files share and nothing else needs: a request of the batch being
// built, and the slot numbers that mark a request as not from a slot. Include only from
// herd/worker*.cc.
#ifndef HERD_HERD_WORKER_INTERNAL_H_
#define HERD_HERD_WORKER_INTERNAL_H_

#include <cstdint>

#include "herd/protocol.h"
#include "herd/send_queue.h"
#include "herd/worker.h"

namespace herd {
namespace worker_internal {

// Admit's `slot` for a request that came by receive (UD), or by WRITE_WITH_IMM into a landing
// buffer (a large PUT), not from a window slot.
inline constexpr uint32_t kFromReceive = UINT32_MAX;
inline constexpr uint32_t kFromLanding = UINT32_MAX - 1;

}  // namespace worker_internal

struct Worker::Pending {
  ParsedRequest request;
  Status status = Status::kOk;
  bool replay = false;
  bool held = false;     // the gate holds its response
  bool dropped = false;  // no send-queue room for its response
  bool aside = false;    // a GET whose answer is built in get_aside_ (it may have to wait)
  uint32_t client = 0;
  uint32_t slot = 0;
  const ClientRoute* route = nullptr;
  SendQueue* queue = nullptr;
  uint64_t wr_index = 0;
  uint8_t* staging = nullptr;
  uint64_t version = 0;
  uint32_t value_bytes = 0;
  uint8_t response_flags = 0;  // kResponseOutOfLine, kResponseCopied
};

}  // namespace herd

#endif  // HERD_HERD_WORKER_INTERNAL_H_
