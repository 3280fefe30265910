// util::Mutex and util::MutexLock: absl::Mutex and absl::MutexLock, as ThreadSanitizer can see
// them. Debian's Abseil is built without TSan, so its lock and unlock are invisible to it and
// every access a Mutex guards would be reported as a race; under TSan the lock is a std::mutex
// (pthread, which TSan intercepts), otherwise absl::Mutex. Exclusive locking only; the thread
// safety annotations work as on absl::Mutex. util::CondVar waits on a util::Mutex the same way
// (std::condition_variable or absl::CondVar).
#ifndef HERD_UTIL_MUTEX_H_
#define HERD_UTIL_MUTEX_H_

#if defined(__SANITIZE_THREAD__)
#include <condition_variable>
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
  friend class CondVar;
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

// A condition variable for util::Mutex. Wait may return without a Signal (spuriously): callers
// loop on their condition, which they read and change under the mutex.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases `mu` (held by the caller), waits for a SignalAll, and takes `mu` again.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
#if defined(__SANITIZE_THREAD__)
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's MutexLock releases it
#else
    cv_.Wait(&mu->mu_.m);
#endif
  }
  void SignalAll() {
#if defined(__SANITIZE_THREAD__)
    cv_.notify_all();
#else
    cv_.SignalAll();
#endif
  }

 private:
#if defined(__SANITIZE_THREAD__)
  std::condition_variable cv_;
#else
  absl::CondVar cv_;
#endif
};

}  // namespace util

#endif  // HERD_UTIL_MUTEX_H_
