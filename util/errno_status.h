// A failed system call as an absl::Status: "what: strerror(errno)".
#ifndef HERD_UTIL_ERRNO_STATUS_H_
#define HERD_UTIL_ERRNO_STATUS_H_

#include <cerrno>
#include <cstring>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace util {

// Reads errno at the call, so call it right after the failing call. The code is the caller's:
// callers distinguish kUnavailable (a peer went away) from kInternal (this process's own setup).
inline absl::Status ErrnoStatus(absl::StatusCode code, std::string_view what) {
  const int error = errno;
  return absl::Status(code, absl::StrFormat("%s: %s", what, std::strerror(error)));
}

}  // namespace util

#endif  // HERD_UTIL_ERRNO_STATUS_H_
