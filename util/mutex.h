// util::Mutex and util::MutexLock: absl::Mutex and absl::MutexLock, as ThreadSanitizer can see
// them. Debian's Abseil is built without TSan, so its lock and unlock are invisible to it and
// every access a Mutex guards would be reported as a race; under TSan the lock is a std::mutex
// (pthread, which TSan intercepts), otherwise absl::Mutex. Exclusive locking only; the thread
// safety annotations work as on absl::Mutex.
#ifndef HERD_UTIL_MUTEX_H_
#define HERD_UTIL_MUTEX_H_

#if defined(__SANITIZE_THREAD__)
#include <mutex>
#else
#include "absl/synchronization/mutex.h"
#endif
#include "absl/base/thread_annotations.h"

namespace util {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
#if defined(__SANITIZE_THREAD__)
  std::mutex mu_;
#else
  // absl::Mutex spelled as std::mutex's lock/unlock.
  struct Absl {
    void lock() { m.Lock(); }
    void unlock() { m.Unlock(); }
    absl::Mutex m;
  } mu_;
#endif
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace util

#endif  // HERD_UTIL_MUTEX_H_
