#include "herd/flags.h"

#include "gflags/gflags.h"

DEFINE_string(request_verb, "uc_write", "How requests travel: uc_write, rc_write or ud_send");
DEFINE_string(response_verb, "ud_send", "How responses travel: ud_send, uc_write or rc_write");
DEFINE_uint32(workers, 1, "Worker threads (one core and one MICA partition each)");
DEFINE_uint32(ud_qps_per_worker, 1, "UD QPs each worker sends responses from");
DEFINE_uint32(window, 4, "Outstanding requests per client per worker");
DEFINE_uint32(postlist, 16, "Most responses chained into one post_send (doorbell batching)");
DEFINE_uint32(unsig_batch, 32, "One send in this many is signalled");
DEFINE_bool(inline, true, "Send requests and responses inline when they fit --max_inline");
DEFINE_uint32(max_inline, 188, "Inline limit asked of each QP, in bytes");
DEFINE_uint32(slot_bytes, 256,
              "Request slot size: header (at most 32 bytes) + key + value, multiple of 8");
DEFINE_uint32(max_key_bytes, 16, "Largest key (1..256)");
DEFINE_uint32(max_clients, 64, "Logical clients the request region has slots for");
DEFINE_uint32(sq_depth, 256, "Send queue depth of every QP");
DEFINE_uint32(recv_depth, 1024, "UD request receives per worker (--request_verb=ud_send)");
DEFINE_uint32(inline_value_limit, 0,
              "Values longer than this travel out of line (PUT by WRITE_WITH_IMM, GET by READ) "
              "when --max_value_bytes allows larger ones; 0: what a slot holds");
DEFINE_uint32(landing_buffers, 2,
              "Landing buffers per session and worker for out-of-line PUTs (each the largest "
              "request: --max_value_bytes + key + header, or --landing_value_bytes + key + "
              "header)");
DEFINE_uint32(landing_value_bytes, 0,
              "The value a landing buffer is sized for (0: --max_value_bytes). Landing memory is "
              "sessions x workers x --landing_buffers x (this + key + header); a larger "
              "out-of-line PUT/CAS/INSERT fails at the client with NO_MEMORY");

namespace herd {

absl::StatusOr<Config> ConfigFromFlags() {
  Config c;
  absl::StatusOr<RequestVerb> request = ParseRequestVerb(FLAGS_request_verb);
  if (!request.ok()) return request.status();
  absl::StatusOr<ResponseVerb> response = ParseResponseVerb(FLAGS_response_verb);
  if (!response.ok()) return response.status();
  c.request_verb = *request;
  c.response_verb = *response;
  c.workers = FLAGS_workers;
  c.ud_qps_per_worker = FLAGS_ud_qps_per_worker;
  c.window = FLAGS_window;
  c.postlist = FLAGS_postlist;
  c.unsig_batch = FLAGS_unsig_batch;
  c.use_inline = FLAGS_inline;
  c.max_inline = FLAGS_max_inline;
  c.slot_bytes = FLAGS_slot_bytes;
  c.max_key_bytes = FLAGS_max_key_bytes;
  c.max_clients = FLAGS_max_clients;
  c.sq_depth = FLAGS_sq_depth;
  c.recv_depth = FLAGS_recv_depth;
  c.inline_value_limit = FLAGS_inline_value_limit;
  c.landing_buffers = FLAGS_landing_buffers;
  c.landing_value_bytes = FLAGS_landing_value_bytes;
  return c;
}

}  // namespace herd
