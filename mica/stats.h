// Per-partition counters. One core writes them (EREW); any thread may read them.
#ifndef HERD_MICA_STATS_H_
#define HERD_MICA_STATS_H_

#include <cstdint>

#include "util/counter.h"

namespace mica {

// One writer (the partition's core), any reader: util/counter.h.
using Counter = util::Counter;

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
  Counter no_memory;  // writes refused: the item is longer than the whole log
  Counter corrupt;    // GETs refused: the item failed its own checksum (damaged memory)
  Counter log_wraps;  // times the log tail passed the ring's end
};

}  // namespace mica

#endif  // HERD_MICA_STATS_H_
