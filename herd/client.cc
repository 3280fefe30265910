// Client: connecting (the join), the session's QPs, memory and receive rings, and stats.
#include "herd/client.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "mica/keyhash.h"
#include "util/take.h"

namespace herd {
namespace {

using util::Take;

using Clock = std::chrono::steady_clock;

// Receives posted per outstanding request: room for a duplicate answer (a replay racing the
// original) without starving the next response.
constexpr uint32_t kReceivesPerOutstanding = 2;
// Consumed receives are re-posted in batches of up to this many (one PostRecv each), holding
// back at most half of the receives beyond one per outstanding request (none where the receive
// count is capped at one per request: then every Poll re-posts).
constexpr uint32_t kMaxRepostBatch = 32;

absl::StatusOr<std::unique_ptr<transport::SharedMemory>> Allocate(uint64_t bytes) {
  absl::StatusOr<transport::SharedMemory> memory = transport::SharedMemory::Allocate(bytes);
  if (!memory.ok()) return memory.status();
  return std::make_unique<transport::SharedMemory>(*std::move(memory));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.clients == 0) return absl::InvalidArgumentError("a Client needs at least 1 client");
  std::unique_ptr<Client> client(new Client(options));
  if (absl::Status s = client->Handshake(); !s.ok()) return s;
  return client;
}

namespace {

RetransmitPolicy PolicyOf(const ClientOptions& options) {
  return RetransmitPolicy{.initial = absl::ToChronoNanoseconds(options.retry_timeout),
                          .adaptive = options.adaptive_retry,
                          .floor = absl::ToChronoNanoseconds(options.min_retry_timeout),
                          .ceiling = absl::ToChronoNanoseconds(options.max_retry_timeout)};
}

}  // namespace

Client::Client(const ClientOptions& options)
    : options_(options),
      batching_(options.batch_doorbells),
      retransmit_policy_(PolicyOf(options)),
      absence_threshold_(
          retransmit_policy_.adaptive
              ? std::max(kMinAbsence,
                         RetransmitTimer(retransmit_policy_).TimeoutFor(1) / kAbsenceFraction)
              : std::chrono::nanoseconds::max()) {}

Client::~Client() = default;

absl::Status Client::Handshake() {
  if (absl::Status s = Take(transport::OpenDevice(options_.device), &device_); !s.ok()) return s;
  grh_is_ipv4_ = device_->port().grh_is_ipv4;
  absl::StatusOr<std::unique_ptr<transport::control::MessageChannel>> channel =
      ConnectControl(options_.connect, device_.get(), options_.server, options_.connect_timeout);
  if (!channel.ok()) return channel.status();
  channel_ = *std::move(channel);
  if (absl::Status s = channel_->Send(kHello, Encode(Hello{options_.clients})); !s.ok()) return s;
  absl::StatusOr<transport::control::Message> reply =
      Expect(*channel_, kServerConfig, options_.connect_timeout);
  if (!reply.ok()) return reply.status();
  absl::StatusOr<Config> config = DecodeConfig(reply->payload);
  if (!config.ok()) return config.status();
  if (absl::Status s = Validate(*config, device_->port().active_mtu); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the server's configuration does not work on this device: ", s.message()));
  }
  if (absl::Status s = CreateResources(*config); !s.ok()) return s;

  Join join;
  join.ud = ud_qp_->endpoint();
  join.ud_qkey = ud_qkey_;
  for (auto& qp : request_qps_) join.request_qps.push_back(qp->endpoint());
  for (auto& qp : response_qps_) join.response_qps.push_back(qp->endpoint());
  for (auto& qp : large_qps_) join.large_qps.push_back(qp->endpoint());
  if (responses_mr_) {
    join.response_region_addr = reinterpret_cast<uint64_t>(responses_->data());
    join.response_region_rkey = responses_mr_->rkey();
  }
  if (resume_.session != 0) {
    join.resume_first_client_id = resume_.first_client_id;
    join.resume_session = resume_.session;
  }
  if (absl::Status s = channel_->Send(kJoin, Encode(join)); !s.ok()) return s;
  reply = Expect(*channel_, kWelcome, options_.connect_timeout);
  if (!reply.ok()) return reply.status();
  absl::StatusOr<Welcome> welcome =
      DecodeWelcome(reply->payload, config_.workers, config_.ud_qps_per_worker);
  if (!welcome.ok()) return welcome.status();
  welcome_ = *std::move(welcome);
  first_client_id_ = welcome_.first_client_id;
  if (welcome_.worker_ud.size() != config_.workers ||
      welcome_.request_qps.size() != request_qps_.size() ||
      welcome_.response_qps.size() != response_qps_.size() ||
      welcome_.large_qps.size() != large_qps_.size()) {
    return absl::DataLossError("welcome: endpoint lists do not match the server's config");
  }
  for (uint32_t w = 0; w < config_.workers; ++w) {
    transport::ConnectConfig connect;
    if (!request_qps_.empty()) {
      connect.remote = welcome_.request_qps[w];
      if (absl::Status s = request_qps_[w]->Connect(connect); !s.ok()) return s;
    }
    if (!response_qps_.empty()) {
      connect.remote = welcome_.response_qps[w];
      if (absl::Status s = response_qps_[w]->Connect(connect); !s.ok()) return s;
    }
    if (!large_qps_.empty()) {
      connect.remote = welcome_.large_qps[w];
      if (absl::Status s = large_qps_[w]->Connect(connect); !s.ok()) return s;
    }
    std::unique_ptr<transport::AddressHandle> ah;
    const transport::QpEndpoint& ud = welcome_.worker_ud[w];
    if (absl::Status s = Take(pd_->CreateAddressHandle({ud.lid, ud.gid}), &ah); !s.ok()) return s;
    worker_ahs_.push_back(std::move(ah));
  }
  next_retry_check_ = Clock::now();
  last_watch_ = next_retry_check_;
  return absl::OkStatus();
}

absl::Status Client::CreateResources(const Config& config) {
  config_ = config;
  const Config& c = config_;
  if (absl::Status s = ValidateClientLoad(c, options_.clients); !s.ok()) return s;
  const uint64_t slot_count = uint64_t{options_.clients} * c.workers * c.window;
  receive_count_ = static_cast<uint32_t>(
      std::min<uint64_t>(slot_count * kReceivesPerOutstanding, kMaxClientReceives));
  const uint64_t spare_receives = receive_count_ > slot_count ? receive_count_ - slot_count : 0;
  repost_batch_ =
      static_cast<uint32_t>(std::clamp<uint64_t>(spare_receives / 2, 1, kMaxRepostBatch));
  receive_bytes_ = transport::kGrhBytes + ResponseBytes(c.slot_value_bytes());
  if (absl::Status s = Take(device_->AllocatePd(), &pd_); !s.ok()) return s;
  // UD, request and large-value queues: at most sq_depth WRs each, every one may complete.
  const uint32_t send_queues = 1 + 2 * c.workers;
  if (absl::Status s = Take(device_->CreateCq(send_queues * c.sq_depth), &send_cq_); !s.ok()) {
    return s;
  }
  if (absl::Status s = Take(device_->CreateCq(receive_count_ + 1), &recv_cq_); !s.ok()) return s;
  auto make_qp = [&](transport::QpType type, uint32_t receives,
                     std::unique_ptr<transport::QueuePair>* out) {
    transport::QpConfig qc;
    qc.type = type;
    qc.send_cq = send_cq_.get();
    qc.recv_cq = recv_cq_.get();
    qc.max_send_wr = c.sq_depth;
    qc.max_recv_wr = receives;
    qc.max_inline_data = c.max_inline;
    return Take(pd_->CreateQp(qc), out);
  };
  if (absl::Status s = make_qp(transport::QpType::kUd, receive_count_, &ud_qp_); !s.ok()) return s;
  // Our own qkey: a UD SEND with any other is dropped by our QP, so a process that does not know
  // it cannot deliver a forged response (one that does must also send from a worker's QP).
  std::random_device entropy;
  while (ud_qkey_ == 0 || ud_qkey_ == kQkey) ud_qkey_ = entropy() & ~kControlledQkeyBit;
  transport::ConnectConfig ud;
  ud.qkey = ud_qkey_;
  if (absl::Status s = ud_qp_->Connect(ud); !s.ok()) return s;
  for (uint32_t w = 0; w < c.workers; ++w) {
    if (c.request_uses_slots()) {
      request_qps_.emplace_back();
      const auto type =
          c.request_verb == RequestVerb::kRcWrite ? transport::QpType::kRc : transport::QpType::kUc;
      if (absl::Status s = make_qp(type, 1, &request_qps_.back()); !s.ok()) return s;
    }
    if (c.response_uses_slots()) {
      response_qps_.emplace_back();
      const auto type = c.response_verb == ResponseVerb::kRcWrite ? transport::QpType::kRc
                                                                  : transport::QpType::kUc;
      if (absl::Status s = make_qp(type, 1, &response_qps_.back()); !s.ok()) return s;
    }
  }
  auto region = [&](uint64_t bytes, uint32_t access, std::unique_ptr<transport::SharedMemory>* mem,
                    std::unique_ptr<transport::MemoryRegion>* mr) -> absl::Status {
    if (absl::Status s = Take(Allocate(bytes), mem); !s.ok()) return s;
    return Take(pd_->RegisterMemory((*mem)->data(), (*mem)->size(), access), mr);
  };
  if (absl::Status s =
          region(slot_count * c.slot_bytes, transport::kLocalWrite, &staging_, &staging_mr_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = region(uint64_t{receive_count_} * receive_bytes_, transport::kLocalWrite,
                              &receives_, &receives_mr_);
      !s.ok()) {
    return s;
  }
  if (c.response_uses_slots()) {
    if (absl::Status s =
            region(slot_count * c.response_slot_bytes(),
                   transport::kLocalWrite | transport::kRemoteWrite, &responses_, &responses_mr_);
        !s.ok()) {
      return s;
    }
  }
  queues_.resize(1 + request_qps_.size());
  for (size_t q = 0; q < queues_.size(); ++q) {
    queues_[q].qp = q == 0 ? ud_qp_.get() : request_qps_[q - 1].get();
    queues_[q].depth = c.sq_depth;
    queues_[q].unsig_batch = c.unsig_batch;
    queues_[q].table_slot = static_cast<uint16_t>(q);
  }
  if (c.large_values()) {
    if (absl::Status s = CreateLargeValueResources(); !s.ok()) return s;
  }
  slots_.resize(slot_count);
  next_seq_.assign(uint64_t{options_.clients} * c.workers, 1);
  // A client that follows a failover keeps what it learned of the workers' round trips.
  if (timers_.size() != c.workers) timers_.assign(c.workers, RetransmitTimer(retransmit_policy_));
  // A silence is counted from the join (an epoch-old last answer would make the first answer
  // end a silence as long as the clock's age).
  last_answer_.assign(c.workers, Clock::now());
  probe_sent_.assign(c.workers, Clock::time_point::min());
  probe_due_.assign(c.workers, Clock::time_point{});
  if (c.response_uses_slots()) {
    delivered_.resize(slot_count * c.response_slot_bytes());
    live_.reserve(slot_count);
    live_position_.assign(slot_count, kNotLive);
  }
  completions_.resize(std::max<uint32_t>(c.sq_depth, 64));
  recv_wrs_.resize(receive_count_);
  recv_sges_.resize(receive_count_);
  to_repost_.reserve(receive_count_);
  for (uint32_t i = 0; i < receive_count_; ++i) to_repost_.push_back(i);
  RepostReceives();
  return absl::OkStatus();
}

uint64_t Client::HashKey(std::string_view key) { return mica::KeyHash(key); }

uint32_t Client::WorkerOf(uint64_t keyhash) const {
  return mica::PartitionOf(keyhash, config_.workers);
}

ClientStats Client::stats() const {
  ClientStats s = stats_;
  std::chrono::nanoseconds longest{0};
  for (const RetransmitTimer& timer : timers_) longest = std::max(longest, timer.TimeoutFor(1));
  s.retry_timeout = absl::FromChrono(longest);
  s.fabric.Add(ud_qp_->counters());
  for (const auto& qp : request_qps_) s.fabric.Add(qp->counters());
  for (const auto& qp : large_qps_) s.fabric.Add(qp->counters());  // WRITE_WITH_IMMs and READs
  s.fabric.Add(send_cq_->counters());
  s.fabric.Add(recv_cq_->counters());
  return s;
}

}  // namespace herd
