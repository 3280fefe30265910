// A session's large-value path (Config::large_values()): its landing buffers, its read-only view
// of every worker's log, and one RC QP per worker for WRITE_WITH_IMM (large PUTs) and READ
// (large GETs). All of it lives in the session's own protection domain: its QPs can write its
// landing buffers and read the logs, and nothing else.
#include "absl/strings/str_format.h"
#include "herd/join.h"
#include "herd/server.h"
#include "herd/server_session.h"
#include "mica/partition.h"
#include "util/take.h"

namespace herd {

using util::Take;

absl::Status Server::BuildLargeValuePath(Session& session, const Join& join) {
  const Config& c = options_.config;
  const uint64_t per_worker = uint64_t{c.landing_buffers} * c.landing_bytes();
  absl::StatusOr<transport::SharedMemory> landing = transport::SharedMemory::Allocate(
      per_worker * c.workers, "herd-landing", options_.region_pages);
  if (!landing.ok()) return landing.status();
  session.landing = std::make_unique<transport::SharedMemory>(*std::move(landing));
  // Remote read too: a GET that falls back to a copy through the worker is answered with a
  // descriptor of the landing buffer the client named.
  if (absl::Status s =
          Take(session.pd->RegisterMemory(
                   session.landing->data(), session.landing->size(),
                   transport::kLocalWrite | transport::kRemoteWrite | transport::kRemoteRead),
               &session.landing_mr);
      !s.ok()) {
    return s;
  }
  for (uint32_t w = 0; w < c.workers; ++w) {
    Session::PerWorker& pw = session.workers[w];
    WorkerResources& r = workers_[w];
    // The log and its mirror (an item that wraps the ring's end is one READ): read-only.
    const mica::MirroredRegion& region = r.worker->partition().region();
    if (absl::Status s = Take(
            session.pd->RegisterMemory(region.ring(), region.ring_bytes() + region.mirror_bytes(),
                                       transport::kRemoteRead),
            &pw.log_mr);
        !s.ok()) {
      return s;
    }
    transport::QpConfig qc;
    qc.type = transport::QpType::kRc;
    qc.send_cq = idle_cq_.get();  // the server never sends on it
    qc.recv_cq = r.imm_cq.get();  // a large PUT's WRITE_WITH_IMM completes here
    qc.max_send_wr = 1;
    qc.max_recv_wr = LargeReceiveDepth(c);
    qc.max_inline_data = 0;
    if (absl::Status s = Take(session.pd->CreateQp(qc), &pw.large_qp); !s.ok()) return s;
    transport::ConnectConfig connect;
    connect.remote = join.large_qps[w];
    if (absl::Status s = pw.large_qp->Connect(connect); !s.ok()) return s;
    // WRITE_WITH_IMM consumes a receive and places nothing in it: no buffers. The wr_id names
    // the session (its first client id): the worker reposts on this QP whatever the sender's
    // immediate says.
    for (uint32_t i = 0; i < LargeReceiveDepth(c); ++i) {
      transport::RecvWr wr;
      wr.wr_id = session.first_client;
      transport::RecvWr* bad = nullptr;
      if (absl::Status s = pw.large_qp->PostRecv(&wr, &bad); !s.ok()) return s;
    }
    uint8_t* landing_of_worker = session.landing->data() + w * per_worker;
    for (ClientRoute& route : pw.routes) {
      route.large_qp = pw.large_qp.get();
      route.large_qpn = pw.large_qp->qp_num();
      route.landing = landing_of_worker;
      route.landing_rkey = session.landing_mr->rkey();
      route.log_addr = reinterpret_cast<uint64_t>(region.ring());
      route.log_rkey = pw.log_mr->rkey();
    }
  }
  return absl::OkStatus();
}

}  // namespace herd
