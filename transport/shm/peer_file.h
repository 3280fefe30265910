// Opening a file a peer names by descriptor (its segment, a registered region's backing file)
// without letting the peer choose what the open does. The name is the peer's input: a file on a
// FUSE mount would hold our open() (in a worker's data path, or the join thread) for as long as
// its daemon likes, a terminal would become our controlling terminal (and its hangup our
// SIGHUP), and the peer can dup2 another file onto the descriptor between any check and the
// open. So the path is resolved with O_PATH (no file system's open runs), the file identified
// with statx(AT_STATX_DONT_SYNC) (no file server is asked), and only a memfd (or, where the
// caller trusts the peer, any regular file) is then opened, through our own O_PATH descriptor:
// the file checked is the file opened.
#ifndef HERD_TRANSPORT_SHM_PEER_FILE_H_
#define HERD_TRANSPORT_SHM_PEER_FILE_H_

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace transport::shm {

// The devices (st_dev) memfds live on in this kernel: shmem's internal mount, and hugetlbfs's
// for each huge page size memfd_create accepts here. A file on none of them is no memfd.
class MemfdDevices {
 public:
  // Creates (and closes) an empty memfd of each kind to learn its device. Control path.
  static MemfdDevices Probe();
  bool Contains(dev_t device) const;

 private:
  static constexpr size_t kMaxKinds = 3;  // small pages, 2 MiB and 1 GiB huge pages
  std::array<dev_t, kMaxKinds> devices_{};
  size_t count_ = 0;
};

// Opens read-write (close-on-exec, never as a controlling terminal) the file that process
// `pid`'s descriptor `fd` names, if it is a memfd (a regular file on one of `memfds`), or any
// regular file when `any_regular_file`. FailedPrecondition naming why when it is neither,
// Unavailable when the peer is gone or the descriptor closed.
absl::StatusOr<int> OpenPeerFile(int32_t pid, int32_t fd, const MemfdDevices& memfds,
                                 bool any_regular_file);

}  // namespace transport::shm

#endif  // HERD_TRANSPORT_SHM_PEER_FILE_H_
