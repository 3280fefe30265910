// Moving a StatusOr's value out, or passing its error on: the step every setup sequence of
// fallible creations repeats (a device, a PD, a CQ, a QP ...).
#ifndef HERD_UTIL_TAKE_H_
#define HERD_UTIL_TAKE_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace util {

// OK after moving the value into *out; the error otherwise (*out untouched).
template <typename T>
absl::Status Take(absl::StatusOr<T> value, T* out) {
  if (!value.ok()) return value.status();
  *out = *std::move(value);
  return absl::OkStatus();
}

}  // namespace util

#endif  // HERD_UTIL_TAKE_H_
