// The server's record of one session (one client connection): internal to the server's files.
#ifndef HERD_HERD_SERVER_SESSION_H_
#define HERD_HERD_SERVER_SESSION_H_

#include <memory>
#include <string>
#include <vector>

#include "herd/send_queue.h"
#include "herd/server.h"
#include "herd/worker.h"
#include "transport/control/message_channel.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

namespace herd {

struct Server::Session {
  std::unique_ptr<transport::control::MessageChannel> channel;  // TCP or RDMA-CM
  std::string peer;
  uint32_t first_client = 0;
  uint32_t clients = 0;
  uint32_t generation = 0;
  uint64_t secret = 0;
  uint16_t queue_slot = 0;  // response_verb = *_write
  bool has_queue_slot = false;
  // The session's own protection domain: its request QPs and the one memory region they may
  // write, its block of request slots. A WRITE through its QPs to anything else fails at the
  // NIC (and at the shm fabric) whatever rkey it names. Declared before `workers`: destroyed
  // after the QPs in it.
  std::unique_ptr<transport::ProtectionDomain> pd;
  std::unique_ptr<transport::MemoryRegion> region_mr;
  // Config::large_values(): the session's landing buffers, [worker][landing_buffers], writable
  // and readable by its large-value QPs alone.
  std::unique_ptr<transport::SharedMemory> landing;
  std::unique_ptr<transport::MemoryRegion> landing_mr;
  // Declared so that destruction (reverse order) takes the QPs first: a QP's pending WRs read
  // its staging buffers and name its address handle until the QP is gone.
  struct PerWorker {
    std::unique_ptr<transport::SharedMemory> staging;
    std::unique_ptr<transport::MemoryRegion> staging_mr;
    std::unique_ptr<transport::AddressHandle> ah;
    // Config::large_values(): the worker's log, readable through this session's PD only, and
    // the RC QP the client WRITE_WITH_IMMs large PUTs and READs large values through.
    std::unique_ptr<transport::MemoryRegion> log_mr;
    std::unique_ptr<transport::QueuePair> large_qp;
    std::unique_ptr<transport::QueuePair> request_qp;
    std::unique_ptr<transport::QueuePair> response_qp;
    SendQueue queue;
    std::vector<ClientRoute> routes;
  };
  std::vector<PerWorker> workers;
};

}  // namespace herd

#endif  // HERD_HERD_SERVER_SESSION_H_
