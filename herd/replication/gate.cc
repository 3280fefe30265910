// The replication gate: holding mutations' answers, posting each batch's redo chain to every
// link, idle watermarks, and releasing answers every link has. A link's life (join, transfer,
// consent, drop) is in gate_links.cc.
#include "herd/replication/gate.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "herd/replication/gate_wr_id.h"
#include "herd/replication/log.h"

namespace herd {

using gate_wr_id::kBatchMask;
using gate_wr_id::kChunkFlag;
using gate_wr_id::kEpochMask;
using gate_wr_id::kEpochShift;
using gate_wr_id::kLinkShift;
using gate_wr_id::kWatermarkFlag;
using gate_wr_id::WrIdOf;

namespace {

// Completions taken per poll.
constexpr size_t kPollBatch = 32;
// A chain's WRs: the redo record, the commit words, the ranges from kFirstRangeWr on, the done
// word last.
constexpr uint32_t kFirstRangeWr = 2;
// After each record in the staging ring, the sources of the commit line's words
// (herd/replication/log.h): the commit word, the begun batch and the deletes word (one WRITE), then
// the done batch and the released watermark (the chain's last WRITE).
constexpr uint64_t kCommitWriteBytes = kRedoDoneWordOffset;
constexpr uint64_t kDoneWriteBytes =
    kRedoReleasedWordOffset + sizeof(uint64_t) - kRedoDoneWordOffset;
constexpr uint64_t kCommitSourceBytes = kCommitWriteBytes + kDoneWriteBytes;
static_assert(kRedoDeletesWordOffset + sizeof(uint64_t) == kCommitWriteBytes &&
                  kRedoReleasedWordOffset == kRedoDoneWordOffset + sizeof(uint64_t),
              "each of the chain's two commit-line WRITEs covers adjacent words");
// After the staging ring: the idle watermark WRITE's source word.
constexpr uint64_t kWatermarkSourceBytes = 64;
// A record takes at most 1/kMaxRecordShare of the staging ring. With nothing in flight the ring
// protects one record (a backup's commit may name it), and the larger of the two free pieces
// beside it, at least (ring - record) / 2, then holds any record: no batch waits forever.
constexpr uint64_t kMaxRecordShare = 3;

}  // namespace

uint64_t MaxRecordBytes(uint64_t staging_bytes) {
  const uint64_t share = staging_bytes / kMaxRecordShare;
  const uint64_t frame = sizeof(RedoHeader) + kCommitSourceBytes;
  return share > frame ? share - frame : 0;
}

absl::StatusOr<std::unique_ptr<ReplicationGate>> ReplicationGate::Create(
    mica::Partition* partition, transport::ProtectionDomain* pd, transport::CompletionQueue* cq,
    std::vector<BackupLink> links, const ReplicationOptions& options) {
  if (partition == nullptr || pd == nullptr || cq == nullptr) {
    return absl::InvalidArgumentError("a replication gate needs a partition, a PD and a CQ");
  }
  if (options.max_ranges_per_batch == 0 || options.max_ranges_per_batch > kMaxRedoRanges ||
      options.max_batches_in_flight == 0 || options.staging_bytes == 0 ||
      options.staging_bytes > UINT32_MAX) {
    return absl::InvalidArgumentError(
        "max_ranges_per_batch and max_batches_in_flight must be >= 1, staging_bytes in 1..2^32-1 "
        "(one WRITE's length)");
  }
  if (links.size() >= (size_t{1} << (64 - kLinkShift))) {
    return absl::InvalidArgumentError("too many backups for one gate");
  }
  const uint64_t needed = LinkSendQueueDepth(options);
  for (const BackupLink& link : links) {
    if (link.qp == nullptr) continue;  // vacant: a backup that joins later (OfferLink)
    if (link.qp->config().type != transport::QpType::kRc) {
      return absl::InvalidArgumentError("every backup link needs an RC QP");
    }
    if (link.qp->config().send_cq != cq) {
      return absl::InvalidArgumentError("every backup link's send CQ must be the gate's CQ");
    }
    if (link.qp->config().max_send_wr < needed) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a backup link's send queue holds %d WRs; (%d ranges + %d) x %d batches "
                          "in flight, a transfer and a watermark need %d",
                          link.qp->config().max_send_wr, options.max_ranges_per_batch,
                          kChainFrameWrs, options.max_batches_in_flight, needed));
    }
  }
  absl::StatusOr<transport::SharedMemory> staging = transport::SharedMemory::Allocate(
      options.staging_bytes + kWatermarkSourceBytes, "herd-replication-staging");
  if (!staging.ok()) return staging.status();
  absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> mr = pd->RegisterMemory(
      staging->data(), options.staging_bytes + kWatermarkSourceBytes, transport::kLocalWrite);
  if (!mr.ok()) return mr.status();
  return std::unique_ptr<ReplicationGate>(new ReplicationGate(
      partition, pd, *std::move(staging), *std::move(mr), cq, std::move(links), options));
}

ReplicationGate::ReplicationGate(mica::Partition* partition, transport::ProtectionDomain* pd,
                                 transport::SharedMemory staging,
                                 std::unique_ptr<transport::MemoryRegion> staging_mr,
                                 transport::CompletionQueue* cq, std::vector<BackupLink> links,
                                 const ReplicationOptions& options)
    : partition_(partition),
      region_base_(partition->region().base()),
      ring_offset_(partition->region().head_bytes()),
      staging_(std::move(staging)),
      staging_mr_(std::move(staging_mr)),
      pd_(pd),
      region_copy_bytes_(partition->region().head_bytes() + partition->region().ring_bytes()),
      snapshots_(options.max_batches_in_flight),
      cq_(cq),
      options_(options),
      changes_(options.max_ranges_per_batch),
      ordered_(uint64_t{options.max_ranges_per_batch} * kWrsPerRange),
      wrs_(uint64_t{options.max_ranges_per_batch} * kWrsPerRange + kChainFrameWrs),
      sges_(wrs_.size()),
      completions_(kPollBatch),
      held_ring_(std::max<uint32_t>(options.held_reserve, 1)) {
  for (BackupLink& backup : links) {
    Link link;
    link.backup = backup;
    if (backup.qp == nullptr) {  // vacant
      link.live = false;
      link.dropped->store(true, std::memory_order_relaxed);
      link.synced->store(false, std::memory_order_relaxed);
    } else {
      ++live_;
      in_use_ = links_.size() + 1;
    }
    links_.push_back(std::move(link));
  }
  counters_.live_backups.Set(live_);
  released_clock_ = partition_->version_clock();  // what the backups start from
  // The chain, prepared once: WRITEs from the staging ring, one SGE each, linked; per batch only
  // the addresses, lengths, the chain's end and its signaled WR change.
  for (size_t i = 0; i < wrs_.size(); ++i) {
    transport::SendWr& wr = wrs_[i];
    wr.opcode = transport::Opcode::kWrite;
    wr.sg_list = &sges_[i];
    wr.num_sge = 1;
    sges_[i].lkey = staging_mr_->lkey();
  }
  partition_->set_change_recorder(&changes_);
}

ReplicationGate::~ReplicationGate() { partition_->set_change_recorder(nullptr); }

bool ReplicationGate::Hold(const ExecutedMutation& mutation) {
  if (mutation.op == Op::kDelete && mutation.status == Status::kOk) {
    newest_delete_ = std::max(newest_delete_, mutation.version);
    uint64_t& in_slot = newest_delete_in_slot_[DeleteSlotOf(mutation.keyhash)];
    in_slot = std::max(in_slot, mutation.version);
  }
  HoldUnposted(mutation.id);
  return true;
}

bool ReplicationGate::ReadMustWait(bool found, uint64_t version, uint64_t keyhash) const {
  if (!options_.hold_unreplicated_reads || (live_ == 0 && awaiting_consent_ == 0)) return false;
  // A miss may be an unreleased DELETE's doing (an eviction by an unreleased PUT is a cache's
  // loss either way).
  return (found ? version : newest_delete_in_slot_[DeleteSlotOf(keyhash)]) > released_clock_;
}

bool ReplicationGate::ReadsCaughtUp() const {
  // Every version (DELETEs' included) is at most the clock: all of them released.
  return !options_.hold_unreplicated_reads || (live_ == 0 && awaiting_consent_ == 0) ||
         partition_->version_clock() <= released_clock_;
}

void ReplicationGate::HoldRead(const HeldId& id) {
  // Released with the next batch posted (this one's, if it wrote; the last one otherwise:
  // PostPending's empty case), which holds the write read.
  HoldUnposted(id);
  counters_.reads_held.Add();
}

void ReplicationGate::HoldUnposted(const HeldId& id) {
  if (held_count_ == held_ring_.size()) {
    // More held at once than ever: grow (the only allocation, past the high-water mark).
    std::vector<Held> bigger(held_ring_.size() * 2);
    for (size_t i = 0; i < held_count_; ++i) bigger[i] = HeldAt(i);
    held_ring_ = std::move(bigger);
    held_head_ = 0;
  }
  held_ring_[(held_head_ + held_count_) % held_ring_.size()] = Held{id, kUnposted};
  ++held_count_;
  unposted_held_ = true;
}

void ReplicationGate::EndBatch() {
  if (!PostPending()) counters_.deferred.Add();
}

void ReplicationGate::OrderRanges() {
  // Split at the ring's start (a range merged across it would land its index part first), then
  // sort by offset, highest first: the chain then places every item before any bucket line
  // (buckets and header lie below the ring), extra buckets before the main buckets that link
  // them, and the header last. A backup reader (replica_reader.h) relies on it: a slot it reads
  // names an item already as new as the slot.
  ordered_.clear();
  for (const mica::ByteRange& r : changes_.ranges()) {
    if (r.offset < ring_offset_ && r.offset + r.bytes > ring_offset_) {
      ordered_.push_back(mica::ByteRange{r.offset, ring_offset_ - r.offset});
      ordered_.push_back(mica::ByteRange{ring_offset_, r.offset + r.bytes - ring_offset_});
    } else {
      ordered_.push_back(r);
    }
  }
  std::sort(ordered_.begin(), ordered_.end(),
            [](const mica::ByteRange& a, const mica::ByteRange& b) { return a.offset > b.offset; });
}

bool ReplicationGate::PostPending() {
  const bool anyone = live_ > 0 || joining_;
  if (!anyone && awaiting_consent_ > 0 && !changes_.ranges().empty()) {
    // Every backup dropped, and a drop not consented to yet: a dropped backup may still serve
    // reads (its lease) or be promoted (the configuration), and these writes reach nobody. Their
    // answers wait, unposted, with the changes, until the consent (or for good, if this primary
    // is fenced first); posted to nobody now, they would be released with an older batch.
    return false;
  }
  if (!changes_.ranges().empty() && anyone) {
    // A full window first (cheap, and a deferred batch is retried on every worker loop): the
    // ranges are ordered and sized only when they can go.
    if (snapshots_count_ == snapshots_.size()) return false;
    for (const Link& link : UsedLinks()) {
      if (link.sends() &&
          link.posted_through - link.completed_through >= options_.max_batches_in_flight) {
        return false;  // that backup's window is full: keep accumulating
      }
    }
  }
  OrderRanges();
  const absl::Span<const mica::ByteRange> ranges = ordered_;
  const size_t n = ranges.size();
  uint64_t padded = 0;
  for (const mica::ByteRange& r : ranges) padded += RedoPadded(r.bytes);
  const uint64_t record_bytes = RedoRecordBytes(n, padded);
  const uint64_t bytes = record_bytes + kCommitSourceBytes;  // the staging the batch needs
  if (n > 0 && anyone && bytes > options_.staging_bytes / kMaxRecordShare) {
    // More than a record may take (merged past the recorder's capacity, or values too large
    // for the ring): it could wait for room forever beside the record the ring protects. Never
    // truncated, never sent from live memory, never left waiting: every backup is dropped.
    LOG(ERROR) << "replication: a batch of " << bytes << " bytes in " << n
               << " ranges is over a third of the " << options_.staging_bytes
               << "-byte staging ring; dropping every backup";
    counters_.overflowed.Add(changes_.overflowed());
    for (Link& link : UsedLinks()) DropLink(link);
  }
  if (n == 0 || !(live_ > 0 || joining_)) {
    // Nothing to write, or nobody to write to: what is held goes with the last batch posted
    // (its answer may name a version still in flight there).
    changes_.Clear();
    // With nobody to write to, nobody can lack these writes (a later joiner copies them): the
    // watermark moves past them, or it would stay behind every write made alone. Not while a
    // drop awaits consent: the dropped backup lacks what its last chains carried, and a read
    // of that must wait as long as their answers do.
    if (!(live_ > 0 || joining_) && awaiting_consent_ == 0) {
      released_clock_ = std::max(released_clock_, partition_->version_clock());
    }
    AssignUnposted(last_posted_);
    return true;
  }
  // Contiguous in the ring: a snapshot that would cross its end starts at its start.
  const uint64_t capacity = options_.staging_bytes;
  uint64_t start = staged_;
  if (start % capacity + bytes > capacity) start += capacity - start % capacity;
  if (start + bytes - staging_freed_ > capacity) return false;  // the ring is full
  const uint64_t batch = last_posted_ + 1;
  counters_.overflowed.Add(changes_.overflowed());
  // The snapshot, as a redo record: header, range table, the ranges' bytes as they are now
  // (later batches cannot change them), then the commit line's words that name the record. The
  // ranges go in place in OrderRanges' order.
  uint8_t* const record = staging_.data() + start % capacity;
  auto* header = reinterpret_cast<RedoHeader*>(record);
  *header = RedoHeader{};
  header->batch = batch;
  header->ranges = n;
  header->record_bytes = record_bytes;
  auto* table = reinterpret_cast<RedoRange*>(record + sizeof(RedoHeader));
  uint64_t data = sizeof(RedoHeader) + n * sizeof(RedoRange);
  for (size_t i = 0; i < n; ++i) {
    table[i] = RedoRange{ranges[i].offset, ranges[i].bytes};
    std::memcpy(record + data, region_base_ + ranges[i].offset, ranges[i].bytes);
    // The in-place WRITEs read the record's data.
    transport::Sge& sge = sges_[kFirstRangeWr + i];
    sge.addr = reinterpret_cast<uint64_t>(record + data);
    sge.length = static_cast<uint32_t>(ranges[i].bytes);
    data += RedoPadded(ranges[i].bytes);
  }
  SealRedoRecord(header);
  // ReplayLastBatch: the record's ring offset + 1; then the batch, as begun and as done; the
  // watermark words for backup readers.
  const uint64_t released = PublishedWatermark();
  const uint64_t words[] = {start % capacity + 1, batch, PublishedDeletes(), batch, released};
  static_assert(sizeof(words) == kCommitSourceBytes);
  std::memcpy(record + record_bytes, words, sizeof(words));
  sges_[0].addr = reinterpret_cast<uint64_t>(record);
  sges_[0].length = static_cast<uint32_t>(record_bytes);
  sges_[1].addr = reinterpret_cast<uint64_t>(record + record_bytes);
  sges_[1].length = static_cast<uint32_t>(kCommitWriteBytes);
  const size_t wrs = n + kChainFrameWrs;
  const size_t done_wr = wrs - 1;
  sges_[done_wr].addr = reinterpret_cast<uint64_t>(record + record_bytes + kCommitWriteBytes);
  sges_[done_wr].length = static_cast<uint32_t>(kDoneWriteBytes);
  for (size_t i = 0; i < wrs; ++i) {
    wrs_[i].next = i + 1 < wrs ? &wrs_[i + 1] : nullptr;
    wrs_[i].flags = i + 1 < wrs ? 0u : static_cast<uint32_t>(transport::kSignaled);
  }
  staged_ = start + bytes;
  snapshots_[(snapshots_head_ + snapshots_count_) % snapshots_.size()] =
      Snapshot{batch, start, staged_,
               options_.stall_timeout > absl::ZeroDuration() ? absl::GetCurrentTimeNanos() : 0,
               partition_->version_clock()};
  ++snapshots_count_;
  const uint64_t wire_bytes = record_bytes + kCommitSourceBytes + padded;
  for (size_t l = 0; l < in_use_; ++l) {
    Link& link = links_[l];
    if (!link.sends()) continue;
    // Every WR names its link: a failed QP flushes the unsignaled ones with error completions
    // too, and each must blame its own link.
    const uint64_t wr_id = WrIdOf(l, link.epoch, batch);
    wrs_[0].remote_addr = link.backup.redo_addr + kRedoCommitLineBytes + start % capacity;
    wrs_[0].rkey = link.backup.redo_rkey;
    wrs_[1].remote_addr = link.backup.redo_addr;
    wrs_[1].rkey = link.backup.redo_rkey;
    for (size_t i = 0; i < n; ++i) {
      transport::SendWr& wr = wrs_[kFirstRangeWr + i];
      wr.remote_addr = link.backup.region_addr + ranges[i].offset;
      wr.rkey = link.backup.rkey;
    }
    wrs_[done_wr].remote_addr = link.backup.redo_addr + kRedoDoneWordOffset;
    wrs_[done_wr].rkey = link.backup.redo_rkey;
    for (size_t i = 0; i < wrs; ++i) wrs_[i].wr_id = wr_id;
    transport::SendWr* bad = nullptr;
    if (absl::Status s = link.backup.qp->PostSend(wrs_.data(), &bad); !s.ok()) {
      LOG(WARNING) << "replication: dropping backup " << l << ": " << s;
      DropLink(link);
      continue;
    }
    link.posted_through = batch;
    link.published = released;
    counters_.writes_posted.Add(wrs);
    counters_.bytes_posted.Add(wire_bytes);
  }
  counters_.batches_posted.Add();
  changes_.Clear();
  last_posted_ = batch;
  posted_since_release_ = true;
  AssignUnposted(batch);
  return true;
}

uint64_t ReplicationGate::PublishedWatermark() const {
  // Off: backups answer everything they hold, as the primary does.
  return options_.hold_unreplicated_reads ? released_clock_ : UINT64_MAX;
}

uint64_t ReplicationGate::PublishedDeletes() const {
  return options_.hold_unreplicated_reads ? newest_delete_ : 0;
}

void ReplicationGate::PostWatermarks() {
  const uint64_t released = PublishedWatermark();
  uint64_t* const source = reinterpret_cast<uint64_t*>(staging_.data() + options_.staging_bytes);
  static_assert(2 * sizeof(uint64_t) <= kWatermarkSourceBytes);  // this word, PostChunks' next
  // A WRITE still reading an older value reads this one: newer, and as true.
  std::atomic_ref<uint64_t>(*source).store(released, std::memory_order_relaxed);
  for (size_t l = 0; l < in_use_; ++l) {
    Link& link = links_[l];
    if (!link.live || link.watermark_in_flight || link.published >= released) continue;
    transport::Sge sge{reinterpret_cast<uint64_t>(source), sizeof(uint64_t), staging_mr_->lkey()};
    transport::SendWr wr;
    wr.opcode = transport::Opcode::kWrite;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.flags = transport::kSignaled;
    wr.remote_addr = link.backup.redo_addr + kRedoReleasedWordOffset;
    wr.rkey = link.backup.redo_rkey;
    // Its completion also completes every chain posted before it (RC: in order).
    wr.wr_id = WrIdOf(l, link.epoch, kWatermarkFlag | link.posted_through);
    transport::SendWr* bad = nullptr;
    if (absl::Status s = link.backup.qp->PostSend(&wr, &bad); !s.ok()) {
      LOG(WARNING) << "replication: dropping backup " << l << ": " << s;
      DropLink(link);
      continue;
    }
    link.watermark_in_flight = true;
    link.published = released;
    counters_.watermarks_posted.Add();
  }
}

void ReplicationGate::AssignUnposted(uint64_t batch) {
  if (!unposted_held_) return;
  for (size_t i = held_count_; i-- > 0;) {
    Held& h = HeldAt(i);
    if (h.batch != kUnposted) break;
    h.batch = batch;
  }
  unposted_held_ = false;
}

uint64_t ReplicationGate::CompletedByEveryLink() const {
  uint64_t through = last_posted_;
  for (const Link& link : UsedLinks()) {
    if (link.sends()) through = std::min(through, link.completed_through);
  }
  return through;
}

uint64_t ReplicationGate::ReleasableThrough() const {
  uint64_t through = last_posted_;  // with no live backup, everything posted is safe
  for (const Link& link : UsedLinks()) {
    if (link.live || link.awaiting_consent) through = std::min(through, link.completed_through);
  }
  return through;
}

ReplicationCounters ReplicationGate::counters() const {
  ReplicationCounters c;
  c.batches_posted = counters_.batches_posted.Get();
  c.writes_posted = counters_.writes_posted.Get();
  c.bytes_posted = counters_.bytes_posted.Get();
  c.deferred = counters_.deferred.Get();
  c.overflowed = counters_.overflowed.Get();
  c.links_dropped = counters_.links_dropped.Get();
  c.stalls = counters_.stalls.Get();
  c.released = counters_.released.Get();
  c.reads_held = counters_.reads_held.Get();
  c.watermarks_posted = counters_.watermarks_posted.Get();
  c.live_backups = counters_.live_backups.Get();
  c.joined = counters_.joined.Get();
  c.transfer_bytes = counters_.transfer_bytes.Get();
  return c;
}

uint32_t ReplicationGate::Release(absl::Span<HeldId> released) {
  if (++releases_ % kStallCheckEvery == 0) DropStalledOrRequested();
  if (consents_given_.load(std::memory_order_acquire)) [[unlikely]]
    SettleConsents();
  for (;;) {
    const size_t got = cq_->Poll(absl::MakeSpan(completions_));
    for (size_t i = 0; i < got; ++i) {
      const transport::Completion& c = completions_[i];
      const uint64_t l = c.wr_id >> kLinkShift;
      if (l >= links_.size()) continue;
      Link& link = links_[l];
      // A flushed WR of the QP this link slot had before its last adoption: not this link's.
      if (((c.wr_id >> kEpochShift) & kEpochMask) != (link.epoch & kEpochMask)) continue;
      if ((c.wr_id & kChunkFlag) != 0 && c.status == transport::CompletionStatus::kSuccess) {
        if (link.chunks_in_flight > 0) --link.chunks_in_flight;
        continue;
      }
      if ((c.wr_id & kWatermarkFlag) != 0) link.watermark_in_flight = false;
      if (c.status != transport::CompletionStatus::kSuccess) {
        if (link.sends()) {
          LOG(WARNING) << "replication: dropping backup " << l << ": a WRITE completed with status "
                       << static_cast<int>(c.status);
        }
        DropLink(link);
        continue;
      }
      // RC completes in order: this batch's chain and every one before it are placed.
      link.completed_through = std::max(link.completed_through, c.wr_id & kBatchMask);
    }
    if (got < completions_.size()) break;
  }
  if (joining_ || joins_offered_.load(std::memory_order_relaxed)) AdvanceJoins();
  // Never past what a drop awaiting consent holds (ReleasableThrough): freeing moves the read
  // watermark too.
  FreeSnapshots(std::min(CompletedByEveryLink(), ReleasableThrough()));
  // A deferred batch goes as soon as there is room (counted once, by the EndBatch it missed).
  if (!changes_.ranges().empty()) PostPending();
  const uint64_t through = ReleasableThrough();
  FreeSnapshots(std::min(CompletedByEveryLink(), through));
  for (size_t i = 0; i < snapshots_count_; ++i) {  // released, kept for a joining link
    const Snapshot& s = snapshots_[(snapshots_head_ + i) % snapshots_.size()];
    if (s.batch > through) break;
    released_clock_ = std::max(released_clock_, s.clock);
  }
  // An idle worker posts no chain that would carry the moved watermark: it goes alone.
  if (!posted_since_release_ && changes_.ranges().empty()) PostWatermarks();
  posted_since_release_ = false;
  uint32_t n = 0;
  while (n < released.size() && held_count_ > 0) {
    const Held& h = held_ring_[held_head_];
    if (h.batch == kUnposted || h.batch > through) break;
    released[n++] = h.id;
    held_head_ = (held_head_ + 1) % held_ring_.size();
    --held_count_;
  }
  counters_.released.Add(n);
  return n;
}

uint32_t ReplicationGate::LargeWritesAllowed(const Config& config) const {
  if (!changes_.ranges().empty()) return 0;
  const uint64_t budget = MaxRecordBytes(options_.staging_bytes);
  const uint64_t reserve = SmallBatchRecordBytes(config);
  if (budget <= reserve) return 0;
  return static_cast<uint32_t>(
      std::min<uint64_t>(config.postlist, (budget - reserve) / LargeWriteRecordBytes(config)));
}

}  // namespace herd
