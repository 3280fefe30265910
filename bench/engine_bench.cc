// engine_bench: one worker's whole path (scan the slots, parse and check each request, dedupe,
// execute in MICA, encode the response, build and post the WR chain) on one core, against a
// transport that only records what is posted. No fabric runs: what this measures is the part of
// a request's cost that is the engine's, the number a NIC would see, and it does not move with
// the shm fabric or the client processes (run to run on a 2-core VM it holds to a few percent).
//
//   bazel run -c opt //bench:engine_bench [-- --phases=get,put,mixed --keys=100000]
//
// The bench plays every client inside the transport stand-in: requests are pre-placed in every
// slot of --clients logical clients, and when the worker posts a response for (client, seq), the
// stand-in lands that client's request seq + window in the same slot (a new key from a uniform
// stream), as a client does when its answer arrives. The stand-in's own time (recording the WR
// and encoding the next request) is clocked per post and subtracted: "engine_ns" is the worker
// thread's CPU time less the stand-in's, per request. Every response's status is checked: a phase
// with any answer not OK fails, but for the mixed phase's GETs of keys the cache dropped as its
// PUTs wrapped the log (counted in "not_found").
//
// Each phase (get: every request a GET of a present key; put: every request a PUT; mixed: each
// request a PUT with probability --mixed_put_percent, else a GET, YCSB A's mix by default) prints
// one JSON line: engine_ns per request, its Mops on one core, the verb economy the worker asked of
// the transport (doorbells, WRs, signalled WRs and bytes per request) and, measured in the same
// run on the same keys, what each stage costs ALONE in a tight loop (parse: ParseRequest with
// its checksum and key hash; store: MICA's batch of postlist; encode: the response header) and
// its share of engine_ns; "rest" is what the worker adds around them (slot scan, admission and
// dedupe, batching, WR building, completion reaping). The store is on 2 MiB pages when the
// kernel's pool has them free (store_pages_kib says which; MICA is meant for them).
#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/keys.h"
#include "bench/machine.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "herd/config.h"
#include "herd/flags.h"
#include "herd/pinning.h"
#include "herd/protocol.h"
#include "herd/worker.h"
#include "mica/flags.h"
#include "mica/keyhash.h"
#include "mica/partition.h"
#include "transport/fabric.h"
#include "util/counter.h"
#include "util/memfd.h"
#include "util/round_up.h"

DEFINE_string(phases, "get,put",
              "Phases to run, in order: get (every request a GET of a present "
              "key), put (every request a PUT of a present key), mixed (GETs and PUTs of present "
              "keys, --mixed_put_percent of them PUTs).");
DEFINE_uint32(mixed_put_percent, 50,
              "The mixed phase's share of PUTs, 0..100 (YCSB A: 50, B: 5); each request's op is "
              "drawn at random, so a batch holds both.");
DEFINE_uint32(clients, 32, "Logical clients whose slots the worker scans (--window each).");
DEFINE_uint64(keys, 100000, "Keys stored before the first phase; requests draw them uniformly.");
DEFINE_uint32(key_bytes, 16, "Key size (at most --max_key_bytes).");
DEFINE_uint32(value_bytes, 32, "Value size (each key's value; PUTs write the same size).");
DEFINE_double(duration_s, 2.0, "Seconds each phase is measured.");
DEFINE_double(warmup_s, 0.5, "Seconds each phase runs before it is measured.");
DEFINE_int32(core, 0, "Core the worker thread is pinned to (-1: not pinned).");
DEFINE_uint64(stage_ops, 2000000, "Requests each isolated stage is timed over.");
DEFINE_uint64(seed, 1, "Seed of the key stream.");

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kSecret = 0x5eed5eed5eed5eedULL;
constexpr uint32_t kGeneration = 1;
// Precomputed uniform key indices the stand-in cycles through (a power of two: a mask).
constexpr int kKeyStreamBits = 20;
constexpr uint64_t kKeyStreamLength = uint64_t{1} << kKeyStreamBits;

enum class Phase { kGet, kPut, kMixed };

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kGet:
      return "get";
    case Phase::kPut:
      return "put";
    case Phase::kMixed:
      return "mixed";
  }
  return "?";
}

// The keys and the request stream every phase and stage draws from: the n-th request's key, and
// whether it is a PUT in the mixed phase.
class Keys {
 public:
  Keys(uint64_t count, uint32_t key_bytes, uint32_t mixed_put_percent, uint64_t seed)
      : key_bytes_(key_bytes),
        mixed_put_percent_(mixed_put_percent),
        bytes_(count * key_bytes),
        stream_(kKeyStreamLength),
        mixed_put_(kKeyStreamLength) {
    for (uint64_t i = 0; i < count; ++i) bench::MakeKey(i, key_bytes, &bytes_[i * key_bytes]);
    std::mt19937_64 random(seed);
    std::uniform_int_distribution<uint64_t> pick(0, count - 1);
    for (uint64_t& index : stream_) index = pick(random);
    std::uniform_int_distribution<uint32_t> percent(0, 99);
    for (uint8_t& put : mixed_put_) put = percent(random) < mixed_put_percent ? 1 : 0;
  }
  // Whether the n-th request of `phase` is a PUT. The ops' stream moves one place against the
  // keys' each lap of the keys': aligned, each key's ops repeated every lap, and a key drawn
  // only as a GET in the lap (about 0.5% of them at 50%) was never written again, so the log's
  // first wrap dropped it for good and its GETs all missed.
  bool IsPut(Phase phase, uint64_t n) const {
    return phase == Phase::kPut ||
           (phase == Phase::kMixed &&
            mixed_put_[(n + (n >> kKeyStreamBits)) & (kKeyStreamLength - 1)] != 0);
  }
  uint32_t mixed_put_percent() const { return mixed_put_percent_; }
  std::string_view Key(uint64_t index) const {
    return std::string_view(&bytes_[index * key_bytes_], key_bytes_);
  }
  // The n-th key of the uniform stream.
  std::string_view Next(uint64_t n) const { return Key(stream_[n & (kKeyStreamLength - 1)]); }

 private:
  const uint32_t key_bytes_;
  const uint32_t mixed_put_percent_;
  std::vector<char> bytes_;
  std::vector<uint64_t> stream_;
  std::vector<uint8_t> mixed_put_;
};

// Completions of the stand-in's signalled WRs, polled by the worker's Reap. Single thread.
class StandInCq : public transport::CompletionQueue {
 public:
  explicit StandInCq(uint32_t depth) : ring_(depth) {}
  size_t Poll(absl::Span<transport::Completion> out) override {
    size_t n = 0;
    while (n < out.size() && head_ != tail_) out[n++] = ring_[head_++ % ring_.size()];
    return n;
  }
  void Push(const transport::Completion& completion) {
    CHECK_LT(tail_ - head_, ring_.size()) << "the stand-in's CQ overflowed";
    ring_[tail_++ % ring_.size()] = completion;
  }

 private:
  std::vector<transport::Completion> ring_;
  uint64_t head_ = 0, tail_ = 0;
};

// What the worker asked of the transport (written by the worker's thread, read after it stops
// or relaxed while it runs).
struct Economy {
  util::Counter doorbells;
  util::Counter wrs;
  util::Counter signalled;
  util::Counter bytes;
  util::Counter not_ok;       // answers whose status is neither OK nor NOT_FOUND
  util::Counter not_found;    // GETs of a key a cache-mode log dropped (the mixed phase's PUTs)
  util::Counter stand_in_ns;  // time inside PostSend (recording and refilling)
};

// The worker's response UD QP: records each chain, completes its signalled WRs, and lands each
// answered client's next request in the slot the answer freed.
class StandInQp : public transport::QueuePair {
 public:
  StandInQp(const herd::Config& config, StandInCq* cq, uint8_t* region, const Keys* keys,
            Economy* economy)
      : QueuePair(QpConfigFor(config, cq)),
        herd_config_(config),
        cq_(cq),
        region_(region),
        keys_(keys),
        economy_(economy),
        value_(FLAGS_value_bytes, 'v') {}

  void set_phase(Phase phase) { phase_ = phase; }
  // The highest sequence number landed so far (any client): a new phase starts above it.
  uint64_t max_seq() const { return max_seq_; }

  // Lands request `seq` of `client` in its slot: everything, the marker last (one thread).
  void Land(uint32_t client, uint64_t seq) {
    herd::RequestHeader h{};
    h.seq = seq;
    max_seq_ = std::max(max_seq_, seq);
    const uint64_t n = drawn_++;
    const std::string_view key = keys_->Next(n);
    h.key_bytes = static_cast<uint16_t>(key.size());
    const bool put = keys_->IsPut(phase_, n);
    h.op = static_cast<uint8_t>(put ? herd::Op::kPut : herd::Op::kGet);
    const std::string_view value = put ? std::string_view(value_) : std::string_view();
    h.value_bytes = static_cast<uint32_t>(value.size());
    const uint32_t length =
        herd::RequestBytes(static_cast<herd::Op>(h.op), h.key_bytes, h.value_bytes);
    uint8_t* slot_end = region_ + herd_config_.SlotOffset(0, client, seq % herd_config_.window) +
                        herd_config_.slot_bytes;
    herd::EncodeRequest(h, key, value, kSecret, slot_end - length);
  }

  absl::Status PostSend(transport::SendWr* chain, transport::SendWr** /*bad*/) override {
    const Clock::time_point start = Clock::now();
    uint64_t wrs = 0, signalled = 0, bytes = 0, not_ok = 0, not_found = 0;
    for (const transport::SendWr* wr = chain; wr != nullptr; wr = wr->next) {
      ++wrs;
      const transport::Sge& sge = wr->sg_list[0];
      bytes += sge.length;
      herd::ResponseTrailer trailer;
      std::memcpy(&trailer,
                  reinterpret_cast<const uint8_t*>(sge.addr) + sge.length - sizeof(trailer),
                  sizeof(trailer));
      if (trailer.status == static_cast<uint8_t>(herd::Status::kNotFound)) {
        ++not_found;
      } else if (trailer.status != 0) {
        ++not_ok;
      }
      if ((wr->flags & transport::kSignaled) != 0) {
        ++signalled;
        transport::Completion c;
        c.wr_id = wr->wr_id;
        c.opcode = transport::CompletionOpcode::kSend;
        cq_->Push(c);
      }
      Land(wr->imm_data, herd::SeqOfMarker(trailer.marker) + herd_config_.window);
    }
    economy_->doorbells.Add(1);
    economy_->wrs.Add(wrs);
    economy_->signalled.Add(signalled);
    economy_->bytes.Add(bytes);
    economy_->not_ok.Add(not_ok);
    economy_->not_found.Add(not_found);
    economy_->stand_in_ns.Add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    return absl::OkStatus();
  }
  absl::Status PostRecv(transport::RecvWr*, transport::RecvWr**) override {
    return absl::UnimplementedError("the stand-in takes no receives (requests land in slots)");
  }
  absl::Status Connect(const transport::ConnectConfig&) override { return absl::OkStatus(); }
  void SetError() override {}
  transport::QpState state() const override { return transport::QpState::kRts; }
  transport::QpEndpoint endpoint() const override { return {}; }

 private:
  static transport::QpConfig QpConfigFor(const herd::Config& config, StandInCq* cq) {
    transport::QpConfig qc;
    qc.type = transport::QpType::kUd;
    qc.send_cq = cq;
    qc.recv_cq = cq;
    qc.max_send_wr = config.sq_depth;
    qc.max_inline_data = config.max_inline;
    return qc;
  }
  const herd::Config herd_config_;
  StandInCq* const cq_;
  uint8_t* const region_;
  const Keys* const keys_;
  Economy* const economy_;
  const std::string value_;
  Phase phase_ = Phase::kGet;
  uint64_t drawn_ = 0;
  uint64_t max_seq_ = 0;
};

struct Measured {
  uint64_t requests = 0;
  int64_t cpu_ns = 0;
  uint64_t stand_in_ns = 0, doorbells = 0, wrs = 0, signalled = 0, bytes = 0, not_ok = 0,
           not_found = 0;
  uint64_t batches = 0;
};

// Each stage alone, ns per request, on the phase's requests.
struct Stages {
  double parse_ns = 0;
  double store_ns = 0;
  double encode_ns = 0;
};

double NsPer(Clock::duration elapsed, uint64_t ops) {
  return std::chrono::duration<double, std::nano>(elapsed).count() / static_cast<double>(ops);
}

Stages MeasureStages(const herd::Config& config, Phase phase, const Keys& keys,
                     mica::Partition& store) {
  Stages stages;
  const uint64_t ops = FLAGS_stage_ops;
  const std::string value(FLAGS_value_bytes, 'w');
  // Parse: a ring of encoded requests, each at the end of its own slot-sized buffer.
  constexpr uint32_t kRing = 4096;
  std::vector<uint8_t> slots(uint64_t{kRing} * config.slot_bytes);
  for (uint32_t i = 0; i < kRing; ++i) {
    herd::RequestHeader h{};
    h.seq = i + 1;
    const std::string_view key = keys.Next(i);
    const bool put = keys.IsPut(phase, i);
    h.key_bytes = static_cast<uint16_t>(key.size());
    h.op = static_cast<uint8_t>(put ? herd::Op::kPut : herd::Op::kGet);
    h.value_bytes = put ? FLAGS_value_bytes : 0;
    const uint32_t length =
        herd::RequestBytes(static_cast<herd::Op>(h.op), h.key_bytes, h.value_bytes);
    herd::EncodeRequest(h, key, put ? std::string_view(value) : std::string_view(), kSecret,
                        slots.data() + uint64_t{i + 1} * config.slot_bytes - length);
  }
  const herd::RequestLimits limits{config.max_key_bytes, config.value_limit(), 0};
  herd::ParsedRequest parsed;
  herd::Status status;
  uint64_t sink = 0;
  Clock::time_point start = Clock::now();
  for (uint64_t i = 0; i < ops; ++i) {
    const uint8_t* slot = slots.data() + (i % kRing) * config.slot_bytes;
    CHECK(herd::ParseRequest(slot, config.slot_bytes, limits, kSecret, &parsed, &status) ==
          herd::Parse::kRequest);
    sink += parsed.header.keyhash;
  }
  stages.parse_ns = NsPer(Clock::now() - start, ops);

  // Store: batches of postlist, keys hashed beforehand (parse hashed them).
  const uint32_t batch = config.postlist;
  std::vector<mica::Request> requests(batch);
  std::vector<mica::Response> responses(batch);
  std::vector<uint64_t> hashes(kKeyStreamLength);
  for (uint64_t i = 0; i < kKeyStreamLength; ++i) hashes[i] = mica::KeyHash(keys.Next(i));
  std::vector<char> out(uint64_t{batch} * config.slot_value_bytes());
  // Twice, the first untimed: a PUT's first pass over the log takes its page faults.
  uint64_t done = 0;
  for (int pass = 0; pass < 2; ++pass) {
    start = Clock::now();
    done = 0;
    for (uint64_t n = 0; done < ops; done += batch) {
      for (uint32_t j = 0; j < batch; ++j, ++n) {
        mica::Request& r = requests[j];
        const bool put = keys.IsPut(phase, n);
        r.op = put ? mica::OpCode::kPut : mica::OpCode::kGet;
        r.keyhash = hashes[n & (kKeyStreamLength - 1)];
        r.key = keys.Next(n);
        r.value = put ? std::string_view(value) : std::string_view();
        r.value_out = out.data() + uint64_t{j} * config.slot_value_bytes();
        r.value_out_bytes = config.slot_value_bytes();
      }
      store.ExecuteBatch(requests, absl::MakeSpan(responses));
      for (uint32_t j = 0; j < batch; ++j) {
        // A mixed phase's GET may find its key dropped by the log's wrap (cache mode).
        CHECK(responses[j].result == mica::Result::kOk ||
              (phase == Phase::kMixed && requests[j].op == mica::OpCode::kGet &&
               responses[j].result == mica::Result::kNotFound));
      }
    }
  }
  stages.store_ns = NsPer(Clock::now() - start, done);

  // Encode: a UD response's header (no checksum), the value already in place.
  std::vector<uint8_t> response(herd::ResponseBytes(config.slot_value_bytes()));
  herd::ResponseHeader header{};
  start = Clock::now();
  for (uint64_t i = 0; i < ops; ++i) {
    header.value_bytes = keys.IsPut(phase, i) ? 0 : FLAGS_value_bytes;
    header.seq = i + 1;
    header.version = i;
    herd::EncodeResponseHeader(header, 0, response.data());
    sink += response[response.size() - 1];
  }
  stages.encode_ns = NsPer(Clock::now() - start, ops);
  if (sink == 42) std::puts("");  // keeps the loops' results alive
  return stages;
}

// Every key must still be there before a GET phase: a cache-mode store sized too small for
// --keys (its log overwrote, or its buckets dropped, some of them, at the preload or in a PUT
// phase before) answers misses the phase counts as failures. Said up front, with what to change.
absl::Status CheckEveryKeyHeld(mica::Partition& store, const Keys& keys, const char* when) {
  std::vector<char> out(FLAGS_value_bytes);
  uint64_t missing = 0;
  for (uint64_t i = 0; i < FLAGS_keys; ++i) {
    const std::string_view key = keys.Key(i);
    if (store.Get(key, mica::KeyHash(key), out.data(), FLAGS_value_bytes).result !=
        mica::Result::kOk) {
      ++missing;
    }
  }
  if (missing == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(missing, " of the ", FLAGS_keys, " keys are not held ", when, " (",
                   store.layout().Describe(FLAGS_key_bytes, FLAGS_value_bytes),
                   "): a cache-mode store drops keys once its log or a bucket is full; raise "
                   "--mica_log_bytes or --mica_items, or run --store_mode=store"));
}

absl::Status Run() {
  absl::StatusOr<herd::Config> parsed_config = herd::ConfigFromFlags();
  if (!parsed_config.ok()) return parsed_config.status();
  herd::Config config = *parsed_config;
  if (!config.request_uses_slots() || config.response_uses_slots()) {
    return absl::InvalidArgumentError(
        "engine_bench measures slot requests (--request_verb=uc_write or rc_write) answered by "
        "UD SENDs (--response_verb=ud_send)");
  }
  if (FLAGS_clients == 0 || FLAGS_keys == 0 || FLAGS_key_bytes == 0 ||
      FLAGS_key_bytes > config.max_key_bytes) {
    return absl::InvalidArgumentError(
        "--clients and --keys must be positive, --key_bytes 1..--max_key_bytes");
  }
  if (herd::RequestBytes(herd::Op::kPut, FLAGS_key_bytes, FLAGS_value_bytes) > config.slot_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a PUT of --key_bytes=%u and --value_bytes=%u does not fit --slot_bytes=%u",
                        FLAGS_key_bytes, FLAGS_value_bytes, config.slot_bytes));
  }
  std::vector<Phase> phases;
  for (absl::string_view name : absl::StrSplit(FLAGS_phases, ',', absl::SkipEmpty())) {
    if (name == "get") {
      phases.push_back(Phase::kGet);
    } else if (name == "put") {
      phases.push_back(Phase::kPut);
    } else if (name == "mixed") {
      phases.push_back(Phase::kMixed);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown phase '", name, "' (get, put, mixed)"));
    }
  }
  if (FLAGS_mixed_put_percent > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mixed_put_percent=", FLAGS_mixed_put_percent, ": not 0..100"));
  }
  config.workers = 1;
  config.ud_qps_per_worker = 1;
  config.max_clients = FLAGS_clients;
  if (absl::Status s = herd::Validate(config, /*mtu=*/4096); !s.ok()) return s;

  absl::StatusOr<mica::PartitionConfig> store_config = mica::PartitionConfigFromFlags();
  if (!store_config.ok()) return store_config.status();
  store_config->max_value_bytes = std::min(store_config->max_value_bytes, config.value_limit());
  store_config->expected_items = std::max<uint64_t>(store_config->expected_items, FLAGS_keys);
  const Keys keys(FLAGS_keys, FLAGS_key_bytes, FLAGS_mixed_put_percent, FLAGS_seed);

  // Two partitions of the same config: the worker's, and the isolated store stage's.
  absl::StatusOr<std::unique_ptr<mica::Partition>> partition =
      mica::Partition::Create(*store_config);
  if (!partition.ok()) return partition.status();
  absl::StatusOr<std::unique_ptr<mica::Partition>> stage_store =
      mica::Partition::Create(*store_config);
  if (!stage_store.ok()) return stage_store.status();
  const std::string initial(FLAGS_value_bytes, 'i');
  for (uint64_t i = 0; i < FLAGS_keys; ++i) {
    mica::Request r;
    r.op = mica::OpCode::kPut;
    r.key = keys.Key(i);
    r.keyhash = mica::KeyHash(r.key);
    r.value = initial;
    for (mica::Partition* p : {partition->get(), stage_store->get()}) {
      const mica::Response response = p->Execute(r);
      if (response.result != mica::Result::kOk) {
        return absl::InternalError(
            absl::StrCat("storing key ", i, ": ", std::string(mica::ResultName(response.result))));
      }
    }
  }

  std::vector<uint8_t> region(config.region_bytes());
  const uint32_t response_bytes = herd::ResponseBytes(config.slot_value_bytes());
  std::vector<uint8_t> staging(uint64_t{config.sq_depth} * response_bytes);
  Economy economy;
  StandInCq cq(config.sq_depth + config.postlist + config.unsig_batch);
  StandInQp qp(config, &cq, region.data(), &keys, &economy);
  herd::WorkerMemory memory;
  memory.region = region.data();
  memory.staging = staging.data();
  herd::Worker worker(0, config, *std::move(partition), {&qp}, &cq, &cq, memory);
  std::vector<herd::ClientRoute> routes(FLAGS_clients);
  for (uint32_t c = 0; c < FLAGS_clients; ++c) {
    routes[c].ud_qpn = c + 1;
    routes[c].secret = kSecret;
    routes[c].generation = kGeneration;
    worker.PublishRoute(c, &routes[c]);
  }

  // MICA is meant for 2 MiB pages: on 4 KiB ones nearly every random bucket and item access
  // also misses the TLB (in a VM a two-level page walk), and that, not the engine, is what the
  // store stage then measures. Said up front, and in every line ("store_pages_kib": 4 when
  // either partition, the worker's or the store stage's, is on small pages).
  const mica::PartitionLayout& layout = worker.partition().layout();
  const bool huge = layout.hugepages && (*stage_store)->layout().hugepages;
  const uint64_t store_kib = huge ? 2048 : 4;
  // (Tried only for a ring of a hugepage or more: mica/mirrored_region.h.)
  const bool tried =
      store_config->try_hugepages && layout.log_bytes + layout.pool_bytes >= util::kHugePageBytes;
  if (!huge && tried) {
    const uint64_t per_partition =
        util::RoundUp(layout.index_bytes + layout.log_bytes + layout.pool_bytes,
                      util::kHugePageBytes) /
        util::kHugePageBytes;
    std::fprintf(stderr,
                 "engine_bench: the store is on 4 KiB pages (too few free 2 MiB hugepages), so its "
                 "lookups pay TLB misses too; its two partitions need %lu free ones (as root: "
                 "echo N > /proc/sys/vm/nr_hugepages, N = those in use + %lu)\n",
                 2 * per_partition, 2 * per_partition);
  }

  for (Phase phase : phases) {
    if (phase == Phase::kGet) {  // every GET must hit
      const char* when = phase == phases.front() ? "after the preload" : "after the phases before";
      for (mica::Partition* p : {worker.mutable_partition(), stage_store->get()}) {
        if (absl::Status s = CheckEveryKeyHeld(*p, keys, when); !s.ok()) return s;
      }
    }
    const Stages stages = MeasureStages(config, phase, keys, **stage_store);
    const uint64_t not_ok_before = economy.not_ok.Get();
    const uint64_t not_found_before = economy.not_found.Get();
    qp.set_phase(phase);
    // Every slot of every client holds its first request of the phase, numbered above every
    // request of the phases before (the worker takes a slot's sequence numbers only upward).
    const uint64_t first = (qp.max_seq() / config.window + 1) * config.window;
    for (uint32_t c = 0; c < FLAGS_clients; ++c) {
      for (uint32_t s = 0; s < config.window; ++s) qp.Land(c, first + s);
    }
    std::atomic<bool> stop{false};
    std::atomic<clockid_t> worker_clock{0};
    std::atomic<bool> clock_set{false};
    std::thread thread([&] {
      if (FLAGS_core >= 0) {
        if (absl::Status s = herd::PinCallingThreadTo(FLAGS_core); !s.ok()) {
          LOG(WARNING) << "not pinned: " << s;
        }
      }
      clockid_t clock;
      CHECK_EQ(pthread_getcpuclockid(pthread_self(), &clock), 0);
      worker_clock.store(clock);
      clock_set.store(true, std::memory_order_release);
      worker.Run(stop);
    });
    while (!clock_set.load(std::memory_order_acquire)) std::this_thread::yield();
    const clockid_t clock = worker_clock.load();
    std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_warmup_s));
    auto snapshot = [&] {
      Measured m;
      m.requests = worker.counters().requests.Get();
      m.batches = worker.counters().batches.Get();
      m.cpu_ns = bench::ThreadCpuNs(clock);
      m.stand_in_ns = economy.stand_in_ns.Get();
      m.doorbells = economy.doorbells.Get();
      m.wrs = economy.wrs.Get();
      m.signalled = economy.signalled.Get();
      m.bytes = economy.bytes.Get();
      m.not_ok = economy.not_ok.Get();
      m.not_found = economy.not_found.Get();
      return m;
    };
    const Measured a = snapshot();
    std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_duration_s));
    const Measured b = snapshot();
    stop.store(true);
    thread.join();
    const uint64_t requests = b.requests - a.requests;
    if (requests == 0) return absl::InternalError("the worker answered nothing");
    // Only a mixed phase may miss: in cache mode its PUTs wrap the log, which drops a key not
    // written for a lap (counted in "not_found").
    const uint64_t failed =
        (economy.not_ok.Get() - not_ok_before) +
        (phase == Phase::kMixed ? 0 : economy.not_found.Get() - not_found_before);
    if (failed != 0) {
      return absl::InternalError(
          absl::StrCat(PhaseName(phase), ": ", failed, " answers were not OK"));
    }
    const double n = static_cast<double>(requests);
    const double engine_ns =
        static_cast<double>((b.cpu_ns - a.cpu_ns) -
                            static_cast<int64_t>(b.stand_in_ns - a.stand_in_ns)) /
        n;
    const double rest_ns = engine_ns - stages.parse_ns - stages.store_ns - stages.encode_ns;
    std::printf(
        "{\"bench\":\"engine\",\"phase\":\"%s\",\"put_percent\":%u,\"mode\":\"%s\",\"keys\":%lu,"
        "\"key_bytes\":%u,"
        "\"value_bytes\":%u,\"clients\":%u,\"window\":%u,\"postlist\":%u,\"unsig_batch\":%u,"
        "\"store_pages_kib\":%lu,\"requests\":%lu,\"engine_ns\":%.1f,\"mops_per_core\":%.2f,"
        "\"stand_in_ns\":%.1f,\"not_found\":%lu,"
        "\"requests_per_batch\":%.2f,\"doorbells_per_request\":%.4f,\"wrs_per_request\":%.3f,"
        "\"signalled_per_request\":%.4f,\"bytes_per_request\":%.1f,"
        "\"alone_ns\":{\"parse\":%.1f,\"store\":%.1f,\"encode\":%.1f,\"rest\":%.1f},"
        "\"share\":{\"parse\":%.3f,\"store\":%.3f,\"encode\":%.3f,\"rest\":%.3f}}\n",
        PhaseName(phase),
        phase == Phase::kGet   ? 0
        : phase == Phase::kPut ? 100
                               : keys.mixed_put_percent(),
        mica::StoreModeName(store_config->mode).data(), FLAGS_keys, FLAGS_key_bytes,
        FLAGS_value_bytes, FLAGS_clients, config.window, config.postlist, config.unsig_batch,
        store_kib, requests, engine_ns, 1e3 / engine_ns,
        static_cast<double>(b.stand_in_ns - a.stand_in_ns) / n, b.not_found - a.not_found,
        n / static_cast<double>(b.batches - a.batches), (b.doorbells - a.doorbells) / n,
        (b.wrs - a.wrs) / n, (b.signalled - a.signalled) / n, (b.bytes - a.bytes) / n,
        stages.parse_ns, stages.store_ns, stages.encode_ns, rest_ns, stages.parse_ns / engine_ns,
        stages.store_ns / engine_ns, stages.encode_ns / engine_ns, rest_ns / engine_ns);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("one worker's path on one core against a recording transport");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
