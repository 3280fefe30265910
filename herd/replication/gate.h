// Issue 16's write path on a primary worker: a ResponseGate (response_gate.h) that mirrors the
// worker's partition to its backups and holds each mutation's answer until every live backup
// holds the mutation.
//
// How: the partition records the region ranges each operation changes
// (mica::Partition::set_change_recorder, into the gate's recorder). EndBatch copies those ranges
// into a registered staging ring (a snapshot of the batch's end: the worker goes on changing the
// live region while the NIC reads, so the WRITEs must not read it) and posts, to each live
// backup, ONE chain of RDMA WRITEs from the snapshot to the same offsets of the backup's
// partition region (one doorbell per backup per batch; only the last WR signaled). The chain
// first WRITEs the whole snapshot as a redo record into the backup's redo area, then a commit
// word naming it (with the batch number, "begun"), then the ranges in place (highest offset
// first: every item lands before the bucket line that names it), then the batch
// number again ("done"): a backup whose primary dies mid-chain replays the last committed record
// and is whole, and a backup reader tells a quiet moment from a landing one by the two batch
// numbers (herd/replication/log.h). The batch's mutations are
// released once every live backup's chain completed (an RC completion in order: everything
// before it completed too). Release() polls the links' CQ without blocking; the
// worker never waits for a backup.
//
// Contract (tests/herd/replication_gate_test.cc):
// - A released mutation's bytes, as they were at the end of its batch, and everything the
//   partition changed before them, have been placed in every backup that is still live. Later
//   batches' chains may be landing meanwhile; a backup cut off anywhere in a chain replays its
//   last committed record at promotion and holds the state after a whole batch, at least the
//   last one released (tests: a chain cut after every one of its WRs).
// - A mutation executed in a batch that changed nothing (CAS_FAILED, NOT_FOUND) is released
//   only after every batch before it completed (its answer may name a version still in flight).
// - A GET (ReadMustWait, when options.hold_unreplicated_reads) that read a version newer than every
//   released batch's, or that missed while an unreleased DELETE may have removed its key (one
//   of the keys sharing its DELETE slot: kDeleteSlots), is released
//   with the batch that holds that write: no reader sees a write that a failover could take
//   back. Reads of released writes are never held.
// - A backup whose WRITE completes in error (dead, QP broken) is dropped for good; the gate goes
//   on with the others (live_backups() says how many) and, with none left, releases at once.
// - At most max_batches_in_flight batches are posted per backup, and their snapshots fit the
//   staging ring; beyond that the next batch's ranges keep accumulating and are posted once one
//   completes. A batch whose record would take more than a third of the ring (values too large
//   for it, or ranges merged past the recorder's capacity) cannot be replicated: every backup is
//   dropped, loudly (counted, logged), never truncated and never left waiting.
// - Worker thread only (like every ResponseGate call); no locks; posting allocates nothing. The
//   list of held answers grows past its initial reservation only when more are held at once
//   than ever before.
// - A backup is also dropped when asked (RequestDrop: its control connection closed) or when
//   its oldest posted chain has not completed within stall_timeout (checked every
//   kStallCheckEvery Release calls).
#ifndef HERD_HERD_REPLICATION_GATE_H_
#define HERD_HERD_REPLICATION_GATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "herd/config.h"
#include "herd/response_gate.h"
#include "mica/partition.h"
#include "transport/fabric.h"
#include "transport/shared_memory.h"
#include "util/counter.h"

namespace herd {

// One backup partition, as the primary worker reaches it.
struct BackupLink {
  transport::QueuePair* qp = nullptr;  // RC, connected to the backup; its send CQ is the gate's
  uint64_t region_addr = 0;            // the backup's partition region base (its address space)
  uint32_t rkey = 0;                   // the backup region's MR (remote write)
  // The backup's redo area (herd/replication/log.h): RedoAreaBytes(staging_bytes) bytes.
  uint64_t redo_addr = 0;
  uint32_t redo_rkey = 0;
};

// WRs of a chain besides its ranges: the redo record, the commit words, the done word.
inline constexpr uint32_t kChainFrameWrs = 3;
// What one mutation's record takes besides its item's bytes: up to about 12 ranges (bucket
// lines, the header, store mode's allocator words, its outcome), each a 16 B table entry, up to
// a 64 B line and 8 B of padding. The worker's per-batch budget for large writes counts it.
inline constexpr uint64_t kRecordBytesPerWrite = 12 * (16 + 64 + 8);
// The most bytes one batch's record may take: a third of the staging ring, less the record's
// header and the commit words (gate.cc: kMaxRecordShare).
uint64_t MaxRecordBytes(uint64_t staging_bytes);
// The most a batch of small requests adds to a replication record (each a slot's worth of item
// and kRecordBytesPerWrite), and what one large write adds (a landing buffer's worth).
inline uint64_t SmallBatchRecordBytes(const Config& c) {
  return uint64_t{c.postlist} * (c.slot_bytes + kRecordBytesPerWrite);
}
inline uint64_t LargeWriteRecordBytes(const Config& c) {
  return c.landing_bytes() + kRecordBytesPerWrite;
}

// State transfer to a joining backup (OfferLink): the partition region is copied in WRITEs of
// this many bytes, at most kTransferChunksInFlight of them posted at once per joining link
// (between two of the worker's batches, on the link's QP, so every chain posted later lands
// after them).
inline constexpr uint64_t kTransferChunkBytes = uint64_t{256} << 10;
inline constexpr uint32_t kTransferChunksInFlight = 4;
// The WRITE of the "deletes" word before a transfer's first chunk (PostChunks).
inline constexpr uint32_t kTransferFrameWrs = 1;
// Idle watermark WRITEs (ReplicationGate::PostWatermarks) in flight per link at most.
inline constexpr uint32_t kWatermarkWrsInFlight = 1;
// WRs a recorded range may take: one, or two when it spans the index's end and the ring's start
// (split so that the ring's part lands first).
inline constexpr uint32_t kWrsPerRange = 2;

struct ReplicationOptions {
  // WRITEs (ranges) one batch posts per backup; more ranges merge into supersets. A mutation
  // records up to about 10 (a store-mode move: bucket, item, old block, span descriptors,
  // header): size it for a batch of the worker's postlist.
  uint32_t max_ranges_per_batch = 256;
  // The snapshot ring the WRITEs read from (and the size of each backup's redo ring): a batch's
  // record (its changed bytes, 16 B per range, 72 B) may take at most a third of it; size it at
  // (max_batches_in_flight + 1) times the largest batch, and at least three times that batch.
  uint64_t staging_bytes = uint64_t{8} << 20;
  // Batches in flight per backup: the link's send queue needs LinkSendQueueDepth.
  uint32_t max_batches_in_flight = 4;
  // Held answers reserved up front.
  uint32_t held_reserve = 1024;
  // Hold a GET that read a write not yet at every live backup (HoldRead) until it is. Off: such
  // a GET answers at once, and a read may see a write that a failover then takes back.
  bool hold_unreplicated_reads = true;
  // A backup whose oldest posted chain has not completed for this long is dropped (a stalled
  // or unreachable backup whose QP reports no error: the answers it holds up wait at most
  // this long). Zero: never.
  absl::Duration stall_timeout = absl::Milliseconds(500);
  // Coordinated replication (issue 35): a live backup the gate drops keeps holding releases at
  // what it completed until ConsentToDrop (the control plane first waits out its read lease and
  // commits a configuration without it): no answer goes out that it lacks while it may still
  // serve reads or be promoted. Off (uncoordinated): a drop releases at once.
  bool drops_need_consent = false;
};

// The send queue depth a backup link's QP needs: a full window of full chains.
inline uint64_t LinkSendQueueDepth(const ReplicationOptions& options) {
  return (uint64_t{options.max_ranges_per_batch} * kWrsPerRange + kChainFrameWrs) *
             options.max_batches_in_flight +
         kTransferChunksInFlight + kTransferFrameWrs + kWatermarkWrsInFlight;
}

// A snapshot of a gate's counters (any thread may take one: counters()).
struct ReplicationCounters {
  uint64_t batches_posted = 0;  // batches whose ranges went to the backups
  uint64_t writes_posted = 0;   // WRITE WRs, all backups
  uint64_t bytes_posted = 0;    // their bytes, all backups
  uint64_t deferred = 0;        // batches that found a backup's window or the ring full
  uint64_t overflowed = 0;      // batches whose ranges outgrew the recorder (merged: more bytes)
  uint64_t links_dropped = 0;
  uint64_t stalls = 0;  // ... of them for a chain not completed within stall_timeout
  uint64_t released = 0;
  uint64_t reads_held = 0;         // GETs that read a write not yet released (HoldRead)
  uint64_t watermarks_posted = 0;  // idle watermark WRITEs (no chain carried a new watermark)
  uint64_t live_backups = 0;       // a level, not a count
  uint64_t joined = 0;             // backups brought up to date by state transfer
  uint64_t transfer_bytes = 0;     // ... the bytes their transfers copied
};

class ReplicationGate : public ResponseGate {
 public:
  // `partition` (the worker's, which must outlive the gate) records into the gate from now on;
  // `pd`: where the staging ring is registered (the links' QPs' PD); `cq`: the send CQ of every
  // link's QP, polled only by this gate, deep enough for every WR of a full window of every link
  // (a broken QP flushes them all). Each link's send queue must hold LinkSendQueueDepth.
  static absl::StatusOr<std::unique_ptr<ReplicationGate>> Create(mica::Partition* partition,
                                                                 transport::ProtectionDomain* pd,
                                                                 transport::CompletionQueue* cq,
                                                                 std::vector<BackupLink> links,
                                                                 const ReplicationOptions& options);
  ~ReplicationGate() override;  // the partition stops recording

  bool Hold(const ExecutedMutation& mutation) override;
  bool HoldsReads() const override { return options_.hold_unreplicated_reads; }
  bool ReadMustWait(bool found, uint64_t version, uint64_t keyhash) const override;
  bool ReadsCaughtUp() const override;
  void HoldRead(const HeldId& id) override;
  void EndBatch() override;
  uint32_t Release(absl::Span<HeldId> released) override;
  // What MaxRecordBytes leaves after a batch of small requests (SmallBatchRecordBytes), in
  // LargeWriteRecordBytes each; 0 while a deferred batch's changes wait to be posted (more
  // would pile up past what one record may take and drop every backup).
  uint32_t LargeWritesAllowed(const Config& config) const override;

  uint32_t live_backups() const { return live_; }
  // Any thread (the control thread, when a backup's control connection closes): the gate drops
  // backup `link` (its index in Create's list) within kStallCheckEvery Release calls.
  void RequestDrop(size_t link);
  // Any thread: whether the gate dropped backup `link` (for any reason) and goes on without it.
  // A dropped link with a new one offered (OfferLink) and not yet adopted counts as not dropped.
  bool dropped(size_t link) const {
    // offered first: adoption clears dropped before offered, so this order never sees an adopted
    // link as dropped.
    return link < links_.size() && !links_[link].offered->load(std::memory_order_acquire) &&
           links_[link].dropped->load(std::memory_order_acquire);
  }
  // Any thread: the control plane committed a configuration without dropped backup `link` (and
  // its read lease ran out): releases go on without it (ReplicationOptions::drops_need_consent).
  // (A consent to a link that was not live when dropped holds nothing, and is cleared too.)
  void ConsentToDrop(size_t link) {
    if (link >= links_.size()) return;
    links_[link].consented->store(true, std::memory_order_release);
    consents_given_.store(true, std::memory_order_release);
  }
  // Any thread: a consent given to `link`'s drop that the worker has not seen yet (OfferLink
  // refuses meanwhile).
  bool drop_unsettled(size_t link) const {
    return link < links_.size() && links_[link].consented->load(std::memory_order_acquire);
  }
  // Any thread (the control thread, once a restarted backup attached again): hands the gate a
  // new link for dropped backup `index`, on the gate's CQ, its send queue LinkSendQueueDepth
  // deep, to a backup whose partition region is fresh. At its next Release the worker adopts it
  // and starts a state transfer: every later batch's chain goes to it, and the partition region
  // is copied to it in kTransferChunkBytes WRITEs between batches. Its answers are not waited
  // for meanwhile. Once the copy and every chain that could have seen the region change under
  // the copy completed, the backup is live again (synced()). False (nothing taken) if `index`
  // is not dropped, its drop awaits consent, or an offer is still pending. Create's links may
  // include vacant ones (a null qp): dropped from the start, for backups that join later.
  bool OfferLink(size_t index, const BackupLink& link);
  // Any thread: whether backup `index` holds every released batch and counts for releases.
  bool synced(size_t index) const {
    return index < links_.size() && links_[index].synced->load(std::memory_order_acquire);
  }
  // Nothing held, in flight or waiting to be posted (Release() frees what completed).
  bool quiescent() const {
    return held_count_ == 0 && snapshots_count_ == 0 && changes_.ranges().empty();
  }
  ReplicationCounters counters() const;  // any thread

 private:
  struct Link {
    BackupLink backup;
    bool live = true;      // synced: counts for releases
    bool joining = false;  // receives chains and the transfer; counts for nothing yet
    std::unique_ptr<std::atomic<bool>> drop_requested = std::make_unique<std::atomic<bool>>(false);
    std::unique_ptr<std::atomic<bool>> dropped = std::make_unique<std::atomic<bool>>(false);
    std::unique_ptr<std::atomic<bool>> synced = std::make_unique<std::atomic<bool>>(true);
    // Dropped while live with drops_need_consent: holds releases at completed_through until the
    // control thread's ConsentToDrop.
    bool awaiting_consent = false;
    std::unique_ptr<std::atomic<bool>> consented = std::make_unique<std::atomic<bool>>(false);
    // OfferLink's mailbox (the control thread fills it, the worker adopts it).
    std::unique_ptr<std::atomic<bool>> offered = std::make_unique<std::atomic<bool>>(false);
    BackupLink offer;
    uint64_t epoch = 0;              // adoptions so far: completions of an older QP name another
    uint64_t posted_through = 0;     // the last batch posted to it
    uint64_t completed_through = 0;  // the last batch whose chain completed
    // A joining link's transfer: the next region byte to copy, chunks posted and not completed,
    // and (once every chunk completed) the batch whose completion makes it live.
    uint64_t copy_next = 0;
    uint32_t chunks_in_flight = 0;
    bool copied = false;
    uint64_t sync_through = 0;
    // The watermark its backup readers were last sent (a chain's or an idle WRITE's), and
    // whether an idle watermark WRITE is in flight (at most kWatermarkWrsInFlight).
    uint64_t published = 0;
    bool watermark_in_flight = false;
    bool sends() const { return live || joining; }
  };
  struct Held {
    HeldId id;
    uint64_t batch;  // the batch whose completion releases it (kUnposted until posted)
  };
  // A posted batch's snapshot (its redo record and commit word) in the staging ring, by running
  // offset.
  struct Snapshot {
    uint64_t batch = 0;
    uint64_t start = 0;
    uint64_t end = 0;
    int64_t posted_ns = 0;  // when its chains were posted (stall_timeout)
    uint64_t clock = 0;     // the partition's version clock then: the batch holds every write
                            // of a version up to it
  };
  // Release checks for stalled backups once in this many calls (a clock read).
  static constexpr uint32_t kStallCheckEvery = 1024;
  static constexpr uint64_t kUnposted = UINT64_MAX;

  ReplicationGate(mica::Partition* partition, transport::ProtectionDomain* pd,
                  transport::SharedMemory staging,
                  std::unique_ptr<transport::MemoryRegion> staging_mr,
                  transport::CompletionQueue* cq, std::vector<BackupLink> links,
                  const ReplicationOptions& options);
  // Posts the accumulated ranges as the next batch to every live link, if every live link has
  // room and the ring has room for the snapshot; gives the unposted held answers that batch.
  // False when deferred.
  bool PostPending();
  // Gives the held answers not yet tied to a batch this one.
  void AssignUnposted(uint64_t batch);
  void DropLink(Link& link);
  uint64_t ReleasableThrough() const;
  // Fills ordered_ with the recorded ranges in the order the chain places them.
  void OrderRanges();
  // Ends the holds of drops the control thread consented to.
  void SettleConsents();
  // Drops requested links, and links whose oldest uncompleted chain is past stall_timeout.
  void DropStalledOrRequested();
  // Gives back the staging bytes of batches every live link completed.
  void FreeSnapshots(uint64_t through);
  // Appends a held answer for the next batch posted.
  void HoldUnposted(const HeldId& id);
  // The watermark words a chain carries to backup readers (herd/replication/log.h: "released",
  // "deletes"); with hold_unreplicated_reads off, everything is released.
  uint64_t PublishedWatermark() const;
  uint64_t PublishedDeletes() const;
  // Sends the watermark alone to each live link that was last sent an older one (the worker is
  // idle: no chain will carry it), unless its previous one is still in flight.
  void PostWatermarks();
  // The last batch every link that is sent to (live or joining) completed.
  uint64_t CompletedByEveryLink() const;
  // Adopts offered links; posts transfer chunks; makes joining links whose transfer is done
  // live.
  void AdvanceJoins();
  void PostChunks(size_t index, Link& link);

  mica::Partition* const partition_;
  const uint8_t* const region_base_;
  const uint64_t ring_offset_;  // where the ring (log or pool) starts in the region
  transport::SharedMemory staging_;
  std::unique_ptr<transport::MemoryRegion> staging_mr_;
  // The partition region's bytes (head and ring, not the mirror's alias) as a WRITE source for
  // state transfers; registered at the first offer.
  transport::ProtectionDomain* const pd_;
  std::unique_ptr<transport::MemoryRegion> region_mr_;
  const uint64_t region_copy_bytes_;
  std::atomic<bool> joins_offered_{false};  // some link has an offer to adopt
  bool joining_ = false;                    // some link is joining
  // Running offsets into the staging ring: bytes handed out, and where the bytes not free start:
  // the newest record every live backup completed stays (its commit word may be a backup's
  // last), everything before it is free. Snapshots of posted batches, oldest first.
  uint64_t staged_ = 0, staging_freed_ = 0;
  std::vector<Snapshot> snapshots_;  // a ring of max_batches_in_flight
  size_t snapshots_head_ = 0, snapshots_count_ = 0;
  transport::CompletionQueue* const cq_;
  const ReplicationOptions options_;
  std::vector<Link> links_;
  uint32_t live_ = 0;
  uint32_t awaiting_consent_ = 0;            // links whose drop awaits ConsentToDrop
  std::atomic<bool> consents_given_{false};  // a ConsentToDrop the worker has not settled
  // Slots [0, in_use_) ever held a link; the vacant ones after them (a coordinated primary's
  // room for backups that join later) cost the worker's loops nothing.
  size_t in_use_ = 0;
  absl::Span<Link> UsedLinks() { return absl::MakeSpan(links_.data(), in_use_); }
  absl::Span<const Link> UsedLinks() const { return absl::MakeConstSpan(links_.data(), in_use_); }
  mica::DirtyRanges changes_;
  std::vector<mica::ByteRange> ordered_;  // OrderRanges' (capacity reserved once)
  std::vector<transport::SendWr> wrs_;    // one chain, prepared once; filled per batch
  std::vector<transport::Sge> sges_;
  std::vector<transport::Completion> completions_;
  // Held answers in batch order: a ring over held_ring_ (grows only past its high-water mark).
  std::vector<Held> held_ring_;
  size_t held_head_ = 0, held_count_ = 0;
  Held& HeldAt(size_t i) { return held_ring_[(held_head_ + i) % held_ring_.size()]; }
  uint64_t last_posted_ = 0;  // the last batch posted (to every live link)
  // Every write of a version up to this is at every live backup (HoldRead's watermark), and
  // the newest version a DELETE took: of any key (what backups are told), and per DELETE slot
  // (what a miss at the primary waits for).
  uint64_t released_clock_ = 0;
  uint64_t newest_delete_ = 0;
  // A miss waits only for an unreleased DELETE of a key sharing its slot, not for every DELETE
  // of the partition: 4,096 slots (32 KiB per worker) make a false wait rare at the DELETE
  // rates a batch window holds. Slots are the keyhash's low bits (one key's DELETE and GETs
  // share its keyhash, so they always meet; a partition is chosen by the high bits, so these
  // spread; a client that forges keys into one slot only makes its own misses wait longer).
  static constexpr uint32_t kDeleteSlotBits = 12;
  static constexpr uint64_t kDeleteSlots = uint64_t{1} << kDeleteSlotBits;
  static uint64_t DeleteSlotOf(uint64_t keyhash) { return keyhash & (kDeleteSlots - 1); }
  std::vector<uint64_t> newest_delete_in_slot_ = std::vector<uint64_t>(kDeleteSlots, 0);
  bool posted_since_release_ = false;  // a chain went out since the last Release
  bool unposted_held_ = false;         // held answers wait for the next posting
  uint32_t releases_ = 0;              // Release calls, for kStallCheckEvery
  struct Counters {
    util::Counter batches_posted, writes_posted, bytes_posted, deferred, overflowed, links_dropped,
        stalls, released, reads_held, watermarks_posted, joined, transfer_bytes;
    util::Gauge live_backups;
  } counters_;
};

}  // namespace herd

#endif  // HERD_HERD_REPLICATION_GATE_H_
