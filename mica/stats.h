// Per-partition counters. One core writes them (EREW); any thread may read them.
#ifndef HERD_MICA_STATS_H_
#define HERD_MICA_STATS_H_

#include <array>
#include <cstdint>

#include "mica/slab_layout.h"
#include "util/counter.h"

namespace mica {

// One writer (the partition's core), any reader: util/counter.h.
using Counter = util::Counter;
using Gauge = util::Gauge;

// Store mode's levels, set by the partition's core after each write or delete that changed them
// (a few relaxed stores), so a progress line reads them without touching the allocator.
struct StoreGauges {
  Gauge extra_buckets_in_use;
  Gauge extra_buckets_capacity;
  Gauge pool_pages;  // pages of the slab pool (fixed)
  Gauge page_bytes;  // (fixed)
  Gauge free_pages;  // in no span and no large block
  Gauge large_blocks;
  Gauge large_pages;
  // Per size class (mica/slab.h): blocks in use, and spans (each of class_span_blocks blocks).
  std::array<Gauge, kSlabClassCount> class_used_blocks;
  std::array<Gauge, kSlabClassCount> class_spans;
  std::array<Gauge, kSlabClassCount> class_block_bytes;  // (fixed)
  std::array<Gauge, kSlabClassCount> class_span_blocks;  // (fixed)
};

struct PartitionStats {
  Counter get_hits;
  Counter get_misses;
  Counter inserts;        // PUT or INSERT of a key the index did not hold
  Counter insert_exists;  // INSERT of a key the index held (answered kExists)
  Counter overwrites;     // PUT of a key the index held
  Counter deletes;
  Counter delete_misses;
  Counter cas_ok;
  Counter cas_failed;  // version mismatch
  Counter cas_misses;
  Counter evictions;  // live index entries displaced from a full bucket
  Counter rejected;   // key or value out of bounds
  // Writes refused, nothing changed: the item is longer than the whole log (cache mode), or
  // the slab pool has no block for it or the index no slot (store mode: see the two below).
  Counter no_memory;
  Counter no_memory_pool;   // store mode: no block for the item
  Counter no_memory_index;  // store mode: a full chain and an empty extra-bucket pool
  Counter moves;            // store mode: overwrites whose item changed block size (moved)
  Counter corrupt;          // GETs refused: the item failed its own checksum (damaged memory)
  Counter log_wraps;        // times the log tail passed the ring's end
  StoreGauges store;        // store mode only (zero in cache mode)
};

}  // namespace mica

#endif  // HERD_MICA_STATS_H_
