// A backup link for tests that must see a primary's chains without executing them: an RC QP
// that keeps each posted chain's WRs (source, length, destination) and executes nothing. Tests
// apply any prefix of a chain to a backup, as a primary that died there would have left it.
#ifndef HERD_TESTS_HERD_RECORDING_QP_H_
#define HERD_TESTS_HERD_RECORDING_QP_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "transport/fabric.h"

namespace herd::testing {

class RecordingQp : public transport::QueuePair {
 public:
  struct Wr {
    uint64_t from;
    uint32_t length;
    uint64_t to;
  };
  RecordingQp(transport::CompletionQueue* cq, uint32_t depth) : QueuePair(ConfigFor(cq, depth)) {}
  absl::Status PostSend(transport::SendWr* chain, transport::SendWr** /*bad*/) override {
    std::vector<Wr> wrs;
    for (const transport::SendWr* wr = chain; wr != nullptr; wr = wr->next) {
      wrs.push_back(Wr{wr->sg_list[0].addr, wr->sg_list[0].length, wr->remote_addr});
    }
    chains.push_back(std::move(wrs));
    return absl::OkStatus();
  }
  absl::Status PostRecv(transport::RecvWr*, transport::RecvWr**) override {
    return absl::UnimplementedError("a recording QP receives nothing");
  }
  absl::Status Connect(const transport::ConnectConfig&) override { return absl::OkStatus(); }
  void SetError() override {}
  transport::QpState state() const override { return transport::QpState::kRts; }
  transport::QpEndpoint endpoint() const override { return {}; }

  std::vector<std::vector<Wr>> chains;

 private:
  static transport::QpConfig ConfigFor(transport::CompletionQueue* cq, uint32_t depth) {
    transport::QpConfig config;
    config.type = transport::QpType::kRc;
    config.send_cq = cq;
    config.recv_cq = cq;
    config.max_send_wr = depth;
    return config;
  }
};

}  // namespace herd::testing

#endif  // HERD_TESTS_HERD_RECORDING_QP_H_
