// replication_bench: what replication costs the primary, per PUT, at the partition: batched
// PUTs on one partition with 0, 1 and 2 backups behind a ReplicationGate (herd/replication/gate.h)
// on the in-process shm fabric (synchronous: each WRITE executes inside its post, on this core,
// so the time is the primary's CPU plus the fabric's copy, as a NIC's DMA would not be), in one
// run. Per case: Mops, and from the gate's and the link QPs' counters the verb economy per PUT
// (WRs, doorbells and bytes per backup) and per batch.
//
//   bazel run -c opt //bench:replication_bench [-- --mode=store --value_bytes=32 --batch=16]
//
// One JSON line per backup count, then {"case":"replication","ratio_1":..,"ratio_2":..}: the
// throughput with 1 and 2 backups over the throughput with none (same run).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/keys.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/replication/gate.h"
#include "herd/replication/log.h"
#include "mica/keyhash.h"
#include "mica/partition.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"

DEFINE_string(mode, "store", "Partition mode: cache or store.");
DEFINE_uint64(keys, 100000, "Distinct keys (uniform).");
DEFINE_uint32(key_bytes, 16, "Key size.");
DEFINE_uint32(value_bytes, 32, "Value size.");
DEFINE_uint32(batch, 16, "PUTs per batch (a worker's postlist).");
DEFINE_uint64(ops, 2000000, "PUTs timed per case.");
DEFINE_uint32(max_backups, 2, "Cases run: 0..max_backups backups.");
DEFINE_bool(drops_need_consent, false,
            "Coordinated replication's gates (issue 35): a dropped backup holds releases until "
            "the control plane consents. Nothing is dropped here: this measures what the mode "
            "costs a healthy cluster's write path.");

namespace {

using Clock = std::chrono::steady_clock;

// Completions that must arrive before the bench gives up on a backup (they come at once on the
// synchronous fabric).
constexpr auto kReleaseDeadline = std::chrono::seconds(30);
// Room per item in the partition, so the PUT phase never fills it.
constexpr double kRoomSlack = 2.0;

struct Node {
  std::unique_ptr<transport::Device> device;
  std::unique_ptr<transport::ProtectionDomain> pd;
  std::unique_ptr<transport::CompletionQueue> cq;
};

Node OpenNode(const std::string& fabric) {
  transport::DeviceOptions options;
  options.fabric = fabric;
  Node node;
  auto device = transport::OpenDevice(options);
  CHECK(device.ok()) << device.status();
  node.device = *std::move(device);
  auto pd = node.device->AllocatePd();
  CHECK(pd.ok()) << pd.status();
  node.pd = *std::move(pd);
  auto cq = node.device->CreateCq(8192);
  CHECK(cq.ok()) << cq.status();
  node.cq = *std::move(cq);
  return node;
}

mica::PartitionConfig ConfigFromFlags() {
  mica::PartitionConfig config;
  auto mode = mica::ParseStoreMode(FLAGS_mode);
  CHECK(mode.ok()) << mode.status();
  config.mode = *mode;
  config.expected_items = FLAGS_keys;
  config.max_value_bytes = FLAGS_value_bytes;
  config.checksum_from_value_bytes = 0;  // replicated items carry checksums (backup readers)
  const uint64_t item = mica::ItemBytes(FLAGS_key_bytes, FLAGS_value_bytes, true);
  config.log_bytes = static_cast<uint64_t>(kRoomSlack * FLAGS_keys * item) + (1 << 20);
  config.pool_bytes = static_cast<uint64_t>(kRoomSlack * FLAGS_keys * 2 * item) + (1 << 20);
  config.try_hugepages = false;
  return config;
}

struct Result {
  double mops = 0;
  herd::ReplicationCounters gate;
  uint64_t link_doorbells = 0, link_wrs = 0, link_bytes = 0;  // all links
};

Result RunCase(uint32_t backups, const std::string& fabric_prefix) {
  const mica::PartitionConfig config = ConfigFromFlags();
  auto primary = mica::Partition::Create(config);
  CHECK(primary.ok()) << primary.status();
  Node primary_node = OpenNode(absl::StrCat(fabric_prefix, "-", backups));
  struct Backup {
    Node node;
    std::unique_ptr<mica::Partition> partition;
    std::unique_ptr<transport::MemoryRegion> mr, redo_mr;
    std::unique_ptr<transport::SharedMemory> redo;
    std::unique_ptr<transport::QueuePair> link, qp;
  };
  std::vector<Backup> nodes(backups);
  std::vector<herd::BackupLink> links;
  herd::ReplicationOptions options;
  options.drops_need_consent = FLAGS_drops_need_consent;
  for (Backup& b : nodes) {
    b.node = OpenNode(absl::StrCat(fabric_prefix, "-", backups));
    auto partition = mica::Partition::Create(config);
    CHECK(partition.ok()) << partition.status();
    b.partition = *std::move(partition);
    auto mr = b.node.pd->RegisterMemory(b.partition->region().base(),
                                        b.partition->region().mapped_bytes(),
                                        transport::kLocalWrite | transport::kRemoteWrite);
    CHECK(mr.ok()) << mr.status();
    b.mr = *std::move(mr);
    auto redo = transport::SharedMemory::Allocate(herd::RedoAreaBytes(options.staging_bytes));
    CHECK(redo.ok()) << redo.status();
    b.redo = std::make_unique<transport::SharedMemory>(*std::move(redo));
    auto redo_mr = b.node.pd->RegisterMemory(b.redo->data(), b.redo->size(),
                                             transport::kLocalWrite | transport::kRemoteWrite);
    CHECK(redo_mr.ok()) << redo_mr.status();
    b.redo_mr = *std::move(redo_mr);
    transport::QpConfig qp_config;
    qp_config.type = transport::QpType::kRc;
    qp_config.send_cq = primary_node.cq.get();
    qp_config.recv_cq = primary_node.cq.get();
    qp_config.max_send_wr = static_cast<uint32_t>(herd::LinkSendQueueDepth(options));
    auto link = primary_node.pd->CreateQp(qp_config);
    CHECK(link.ok()) << link.status();
    b.link = *std::move(link);
    qp_config.send_cq = b.node.cq.get();
    qp_config.recv_cq = b.node.cq.get();
    auto qp = b.node.pd->CreateQp(qp_config);
    CHECK(qp.ok()) << qp.status();
    b.qp = *std::move(qp);
    transport::ConnectConfig to_backup, to_primary;
    to_backup.remote = b.qp->endpoint();
    to_primary.remote = b.link->endpoint();
    CHECK(b.link->Connect(to_backup).ok());
    CHECK(b.qp->Connect(to_primary).ok());
    links.push_back(herd::BackupLink{
        b.link.get(), reinterpret_cast<uint64_t>(b.partition->region().base()), b.mr->rkey(),
        reinterpret_cast<uint64_t>(b.redo->data()), b.redo_mr->rkey()});
  }
  std::unique_ptr<herd::ReplicationGate> gate;
  if (backups > 0) {
    auto created = herd::ReplicationGate::Create(primary->get(), primary_node.pd.get(),
                                                 primary_node.cq.get(), links, options);
    CHECK(created.ok()) << created.status();
    gate = *std::move(created);
  }
  // Keys and ranks before timing; values cycle through a few patterns.
  std::vector<char> keys(FLAGS_keys * FLAGS_key_bytes);
  for (uint64_t i = 0; i < FLAGS_keys; ++i) {
    bench::MakeKey(i, FLAGS_key_bytes, keys.data() + i * FLAGS_key_bytes);
  }
  std::mt19937_64 rng(1);
  std::vector<uint64_t> ranks(FLAGS_ops);
  for (uint64_t& r : ranks) r = rng() % FLAGS_keys;
  const std::string value(FLAGS_value_bytes, 'v');
  std::vector<mica::Request> requests(FLAGS_batch);
  std::vector<mica::Response> responses(FLAGS_batch);
  std::vector<herd::HeldId> released(4 * FLAGS_batch);
  uint64_t held = 0, freed = 0, seq = 0;
  const auto start = Clock::now();
  for (uint64_t done = 0; done < FLAGS_ops; done += FLAGS_batch) {
    const size_t n = std::min<uint64_t>(FLAGS_batch, FLAGS_ops - done);
    for (size_t i = 0; i < n; ++i) {
      mica::Request& r = requests[i];
      r.op = mica::OpCode::kPut;
      r.key = std::string_view(keys.data() + ranks[done + i] * FLAGS_key_bytes, FLAGS_key_bytes);
      r.keyhash = mica::KeyHash(r.key);
      r.value = value;
    }
    (*primary)->ExecuteBatch(absl::MakeConstSpan(requests.data(), n),
                             absl::MakeSpan(responses.data(), n));
    if (gate == nullptr) continue;
    for (size_t i = 0; i < n; ++i) {
      gate->Hold(herd::ExecutedMutation{herd::HeldId{0, static_cast<uint32_t>(i), 1, ++seq},
                                        herd::Op::kPut, requests[i].keyhash, herd::Status::kOk,
                                        responses[i].version});
      ++held;
    }
    gate->EndBatch();
    freed += gate->Release(absl::MakeSpan(released));  // as the worker does, once per loop
  }
  const auto give_up = Clock::now() + kReleaseDeadline;
  while (gate != nullptr && freed < held) {
    freed += gate->Release(absl::MakeSpan(released));
    CHECK(Clock::now() < give_up) << "the backups never completed";
  }
  Result result;
  result.mops = static_cast<double>(FLAGS_ops) /
                std::chrono::duration<double>(Clock::now() - start).count() / 1e6;
  if (gate != nullptr) {
    result.gate = gate->counters();
    CHECK_EQ(gate->live_backups(), backups) << "a backup was dropped";
  }
  for (const Backup& b : nodes) {
    result.link_doorbells += b.link->counters().doorbells.Get();
    result.link_wrs += b.link->counters().wrs.Get();
    result.link_bytes += b.link->counters().bytes.Get();
  }
  gate.reset();  // before the partition and the links
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("replication's cost to the primary: 0..2 backups, one run");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (FLAGS_batch == 0 || FLAGS_keys == 0 || FLAGS_key_bytes == 0 ||
      FLAGS_key_bytes > mica::kMaxKeyBytes) {
    LOG(ERROR) << "--batch and --keys must be positive, --key_bytes in 1.." << mica::kMaxKeyBytes;
    return 2;
  }
  const std::string prefix = absl::StrCat("replication-bench-", getpid());
  std::vector<double> mops;
  for (uint32_t backups = 0; backups <= FLAGS_max_backups; ++backups) {
    const Result r = RunCase(backups, prefix);
    mops.push_back(r.mops);
    const double puts = static_cast<double>(FLAGS_ops);
    const double per_backup = backups == 0 ? 0 : 1.0 / backups;
    std::printf(
        "{\"backups\":%u,\"mode\":\"%s\",\"drops_need_consent\":%s,\"value_bytes\":%u,\"batch\":%u,"
        "\"mops\":%.3f,"
        "\"batches_posted\":%lu,\"wrs_per_put_per_backup\":%.3f,"
        "\"doorbells_per_batch_per_backup\":%.3f,\"bytes_per_put_per_backup\":%.1f,"
        "\"deferred\":%lu,\"overflowed\":%lu}\n",
        backups, FLAGS_mode.c_str(), FLAGS_drops_need_consent ? "true" : "false", FLAGS_value_bytes,
        FLAGS_batch, r.mops, r.gate.batches_posted, r.link_wrs / puts * per_backup,
        r.gate.batches_posted == 0
            ? 0.0
            : static_cast<double>(r.link_doorbells) / r.gate.batches_posted * per_backup,
        r.link_bytes / puts * per_backup, r.gate.deferred, r.gate.overflowed);
    std::fflush(stdout);
  }
  std::printf("{\"case\":\"replication\",\"mode\":\"%s\"", FLAGS_mode.c_str());
  for (size_t b = 1; b < mops.size(); ++b) std::printf(",\"ratio_%zu\":%.3f", b, mops[b] / mops[0]);
  std::printf("}\n");
  return 0;
}
