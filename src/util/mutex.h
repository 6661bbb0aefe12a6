// ember::Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with Clang's
// capability annotations (util/thread_annotations.h), so members marked GUARDED_BY(mu_) are
// checked by `clang++ -Wthread-safety` (the thread_safety_analysis test). Everything is inline
// and forwards to the std types: no cost over them. Thread-safe like the std types they wrap.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "util/thread_annotations.h"

namespace ember {

// A std::mutex the analysis knows about. BasicLockable (lock/unlock), so std::lock_guard and
// std::condition_variable_any accept it, though MutexLock and CondVar are what the analysis sees.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction (or to an early Unlock()).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() RELEASE() {
    if (locked_) mu_->unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Releases the lock before the scope ends (e.g. to notify or call out without it).
  void Unlock() RELEASE() {
    mu_->unlock();
    locked_ = false;
  }

 private:
  Mutex* const mu_;
  bool locked_ = true;
};

// A condition variable waited on with a held ember::Mutex. Wait* release the mutex while
// blocked and hold it again when they return, so to the analysis the lock is held throughout.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Blocks until `ready()` is true; `ready` runs with `mu` held.
  template <typename Predicate>
  void Wait(Mutex* mu, Predicate ready) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock, ready);
    lock.release();  // the caller's MutexLock still owns it
  }
  // Blocks until `ready()` is true or `timeout` passed; returns ready() (as wait_for does).
  template <typename Rep, typename Period, typename Predicate>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout, Predicate ready)
      REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool result = cv_.wait_for(lock, timeout, ready);
    lock.release();
    return result;
  }
  // Blocks until notified (spurious wake-ups included) or `timeout` passed.
  template <typename Rep, typename Period>
  void WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait_for(lock, timeout);
    lock.release();
  }

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace ember
