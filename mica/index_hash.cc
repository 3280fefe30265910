#include "mica/index_hash.h"

#include <sys/random.h>

#include <cerrno>

#include "glog/logging.h"

namespace mica {

IndexKey RandomIndexKey() {
  IndexKey key;
  uint64_t words[2];
  // 16 bytes from the kernel's pool (ready once the system booted): never fails but for EINTR.
  ssize_t got = 0;
  do {
    got = getrandom(words, sizeof(words), 0);
  } while (got < 0 && errno == EINTR);
  CHECK_EQ(got, static_cast<ssize_t>(sizeof(words))) << "getrandom failed";
  key.k0 = words[0];
  key.k1 = words[1];
  return key;
}

}  // namespace mica
