// The types the rmem pool, its server, its wire format and its client all speak of: a region, a
// transaction's operations, a client's credential. Plain structs: a client includes this header
// (and format.h's constants) without linking the pool.
#ifndef HERD_RMEM_TYPES_H_
#define HERD_RMEM_TYPES_H_

#include <cstdint>
#include <vector>

#include "rmem/format.h"

namespace rmem {

struct Region {
  uint32_t id = 0;  // its record's index: stable while it lives
  uint64_t tag = 0;
  uint64_t offset = 0;  // in the data area
  uint64_t bytes = 0;
};

struct TxnOp {
  OpKind kind = OpKind::kCopy;
  uint64_t src = 0, dst = 0, bytes = 0;  // copy: data-area offsets
  uint32_t region = 0;                   // free: the region's id
  uint64_t tag = 0;                      // free: the tag it must still be tied to
};

struct Txn {
  uint64_t client_id = 0;  // non-zero
  uint64_t txn_id = 0;     // increasing per client; non-zero
  std::vector<TxnOp> ops;
};

// Who a client is across connections and restarts of either side: the id names its record (the
// last transaction answered), the secret proves the caller is that client. Both random.
struct ClientCredential {
  uint64_t id = 0;
  uint64_t secret = 0;
};

}  // namespace rmem

#endif  // HERD_RMEM_TYPES_H_
