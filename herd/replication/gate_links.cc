// The replication gate: a link's life. A backup offered to a running gate joins (its partition
// copied in chunks under a snapshot while batches keep flowing), consents, and is dropped when
// it stalls or fails or the server asks.
#include <algorithm>

#include "glog/logging.h"
#include "herd/replication/gate.h"
#include "herd/replication/gate_wr_id.h"
#include "herd/replication/log.h"

namespace herd {

using gate_wr_id::kChunkFlag;
using gate_wr_id::WrIdOf;

void ReplicationGate::DropLink(Link& link) {
  if (!link.sends()) return;
  if (link.live && options_.drops_need_consent) {
    // It may serve reads (its lease) or be promoted (the configuration) until the control plane
    // says otherwise: what it lacks is not released meanwhile.
    link.awaiting_consent = true;
    ++awaiting_consent_;
  }
  if (link.live) --live_;
  link.live = false;
  link.joining = false;
  link.synced->store(false, std::memory_order_release);
  link.dropped->store(true, std::memory_order_release);
  link.backup.qp->SetError();  // fenced: nothing of a later chain reaches a dropped backup
  counters_.live_backups.Set(live_);
  counters_.links_dropped.Add();
}

bool ReplicationGate::OfferLink(size_t index, const BackupLink& backup) {
  if (index >= links_.size() || backup.qp == nullptr || backup.qp->config().send_cq != cq_ ||
      backup.qp->config().max_send_wr < LinkSendQueueDepth(options_)) {
    return false;
  }
  Link& link = links_[index];
  if (!link.dropped->load(std::memory_order_acquire) ||
      link.offered->load(std::memory_order_acquire)) {
    return false;
  }
  // A drop that awaits consent is the worker's to settle first (Release), and a consent given
  // since must have been seen: otherwise adoption would forget the hold.
  if (options_.drops_need_consent && link.consented->load(std::memory_order_acquire)) {
    return false;
  }
  if (region_mr_ == nullptr) {
    // The transfer's WRITEs read the live region (the worker is between batches when it posts
    // them; a later change reaches the backup in a later chain, after them).
    absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> mr = pd_->RegisterMemory(
        const_cast<uint8_t*>(region_base_), region_copy_bytes_, transport::kLocalWrite);
    if (!mr.ok()) {
      LOG(ERROR) << "replication: the partition region cannot be a transfer source: "
                 << mr.status();
      return false;
    }
    region_mr_ = *std::move(mr);
  }
  link.offer = backup;
  // A drop asked for after this offer (the backup died again) must stand: cleared here, never
  // at adoption.
  link.drop_requested->store(false, std::memory_order_release);
  link.offered->store(true, std::memory_order_release);
  joins_offered_.store(true, std::memory_order_release);
  return true;
}

void ReplicationGate::AdvanceJoins() {
  if (joins_offered_.exchange(false, std::memory_order_acq_rel)) {
    for (Link& link : links_) {
      if (!link.offered->load(std::memory_order_acquire)) continue;
      link.backup = link.offer;
      ++link.epoch;
      link.live = false;
      link.joining = true;
      link.posted_through = link.completed_through = last_posted_;
      link.copy_next = 0;
      link.chunks_in_flight = 0;
      link.copied = false;
      link.published = 0;
      link.watermark_in_flight = false;
      if (link.awaiting_consent) {
        // The control thread offers a slot's new link only after it consented to the old
        // one's drop; should it not have, the new link's backup is not the old one's member.
        link.awaiting_consent = false;
        --awaiting_consent_;
      }
      link.dropped->store(false, std::memory_order_release);
      link.offered->store(false, std::memory_order_release);
      in_use_ = std::max(in_use_, static_cast<size_t>(&link - links_.data()) + 1);
      joining_ = true;
      LOG(INFO) << "replication: a backup joins; transferring " << region_copy_bytes_
                << " bytes of the partition";
    }
  }
  if (!joining_) return;
  joining_ = false;
  for (size_t l = 0; l < in_use_; ++l) {
    Link& link = links_[l];
    if (!link.joining) continue;
    PostChunks(l, link);
    if (!link.joining) continue;  // dropped by a failed post
    if (!link.copied && link.copy_next == region_copy_bytes_ && link.chunks_in_flight == 0) {
      // The NIC read the region at some moment before the last chunk completed, maybe in the
      // middle of a batch: every batch executed by now must land after it (the one whose
      // changes are still accumulating included) before the copy is whole.
      link.copied = true;
      link.sync_through = last_posted_ + (changes_.ranges().empty() ? 0 : 1);
    }
    // Live only once it also holds every batch already released (the other live links may have
    // completed batches past sync_through; with none live, everything posted is released).
    if (link.copied && link.completed_through >= std::max(link.sync_through, ReleasableThrough())) {
      link.joining = false;
      link.live = true;
      ++live_;
      link.synced->store(true, std::memory_order_release);
      counters_.live_backups.Set(live_);
      counters_.joined.Add();
      LOG(INFO) << "replication: backup " << l << " is up to date and live again";
      continue;
    }
    joining_ = true;
  }
}

void ReplicationGate::PostChunks(size_t index, Link& link) {
  if (link.copy_next == 0 && link.chunks_in_flight == 0) {
    // Before the copy: the newest DELETE already executed ("deletes" otherwise arrives only with
    // the next chain, and a joiner can go live without one: it would confirm a miss behind a
    // DELETE no other backup holds yet). Unsignaled: the first chunk's completion covers it.
    uint64_t* const source =
        reinterpret_cast<uint64_t*>(staging_.data() + options_.staging_bytes) + 1;
    std::atomic_ref<uint64_t>(*source).store(PublishedDeletes(), std::memory_order_relaxed);
    transport::Sge sge{reinterpret_cast<uint64_t>(source), sizeof(uint64_t), staging_mr_->lkey()};
    transport::SendWr wr;
    wr.opcode = transport::Opcode::kWrite;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.flags = 0;
    wr.remote_addr = link.backup.redo_addr + kRedoDeletesWordOffset;
    wr.rkey = link.backup.redo_rkey;
    wr.wr_id = WrIdOf(index, link.epoch, kChunkFlag);
    transport::SendWr* bad = nullptr;
    if (absl::Status s = link.backup.qp->PostSend(&wr, &bad); !s.ok()) {
      LOG(WARNING) << "replication: dropping joining backup " << index << ": " << s;
      DropLink(link);
      return;
    }
  }
  while (link.chunks_in_flight < kTransferChunksInFlight && link.copy_next < region_copy_bytes_) {
    const uint64_t bytes = std::min(kTransferChunkBytes, region_copy_bytes_ - link.copy_next);
    transport::Sge sge{reinterpret_cast<uint64_t>(region_base_ + link.copy_next),
                       static_cast<uint32_t>(bytes), region_mr_->lkey()};
    transport::SendWr wr;
    wr.opcode = transport::Opcode::kWrite;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.flags = transport::kSignaled;
    wr.remote_addr = link.backup.region_addr + link.copy_next;
    wr.rkey = link.backup.rkey;
    wr.wr_id = WrIdOf(index, link.epoch, kChunkFlag | (link.copy_next / kTransferChunkBytes));
    transport::SendWr* bad = nullptr;
    if (absl::Status s = link.backup.qp->PostSend(&wr, &bad); !s.ok()) {
      LOG(WARNING) << "replication: dropping joining backup " << index << ": " << s;
      DropLink(link);
      return;
    }
    link.copy_next += bytes;
    ++link.chunks_in_flight;
    counters_.transfer_bytes.Add(bytes);
  }
}

void ReplicationGate::SettleConsents() {
  // An exchange: a consent given after it reads the flag raises it again (never lost).
  consents_given_.exchange(false, std::memory_order_acq_rel);
  for (Link& link : links_) {  // all: a consent may name a slot past the ones in use
    if (!link.consented->load(std::memory_order_acquire)) continue;
    if (link.awaiting_consent) {
      link.awaiting_consent = false;
      --awaiting_consent_;
    }
    link.consented->store(false, std::memory_order_release);  // OfferLink may take it now
  }
}

void ReplicationGate::FreeSnapshots(uint64_t through) {
  while (snapshots_count_ > 0 && snapshots_[snapshots_head_].batch <= through) {
    // Completed by every link: released.
    released_clock_ = std::max(released_clock_, snapshots_[snapshots_head_].clock);
    // Up to this record, not past it: it may be the one a backup's commit word names.
    staging_freed_ = snapshots_[snapshots_head_].start;
    snapshots_head_ = (snapshots_head_ + 1) % snapshots_.size();
    --snapshots_count_;
  }
}

void ReplicationGate::RequestDrop(size_t link) {
  if (link < links_.size()) links_[link].drop_requested->store(true, std::memory_order_release);
}

void ReplicationGate::DropStalledOrRequested() {
  const bool check_stalls = options_.stall_timeout > absl::ZeroDuration() && snapshots_count_ > 0;
  const int64_t now = check_stalls ? absl::GetCurrentTimeNanos() : 0;
  const int64_t timeout_ns = absl::ToInt64Nanoseconds(options_.stall_timeout);
  for (size_t l = 0; l < in_use_; ++l) {
    Link& link = links_[l];
    if (!link.sends()) continue;
    if (link.drop_requested->load(std::memory_order_acquire)) {
      LOG(WARNING) << "replication: dropping backup " << l << ": its control connection closed";
      DropLink(link);
      continue;
    }
    if (!check_stalls || link.completed_through >= link.posted_through) continue;
    // The oldest chain this link has not completed: the first snapshot past completed_through.
    for (size_t i = 0; i < snapshots_count_; ++i) {
      const Snapshot& s = snapshots_[(snapshots_head_ + i) % snapshots_.size()];
      if (s.batch <= link.completed_through) continue;
      if (now - s.posted_ns > timeout_ns) {
        LOG(WARNING) << "replication: dropping backup " << l << ": batch " << s.batch
                     << " not completed within " << options_.stall_timeout;
        counters_.stalls.Add();
        DropLink(link);
      }
      break;
    }
  }
}

}  // namespace herd
