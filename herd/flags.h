// The engine's knobs as gflags (see README's knob table); validated into one Config.
#ifndef HERD_HERD_FLAGS_H_
#define HERD_HERD_FLAGS_H_

#include "absl/status/statusor.h"
#include "herd/config.h"

namespace herd {

// The Config the flags describe; contradictions are checked by Validate at server start.
absl::StatusOr<Config> ConfigFromFlags();

}  // namespace herd

#endif  // HERD_HERD_FLAGS_H_
