// Not compiled into any target: the thread_safety_analysis_canary test feeds it to clang++
// -Wthread-safety, which must refuse it (each function below breaks a rule). If it is ever
// accepted, the annotations have stopped expanding and thread_safety_analysis proves nothing.
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace ember {

class Canary {
 public:
  int ReadWithoutLock() const { return value_; }  // GUARDED_BY member, no lock held
  void CallWithoutLock() { BumpLocked(); }        // REQUIRES function, no lock held
  void UnlockedAfterScope() {
    MutexLock lock(&mu_);
    lock.Unlock();
    value_ = 2;  // written after the early Unlock
  }

 private:
  void BumpLocked() REQUIRES(mu_) { ++value_; }

  mutable Mutex mu_;
  int value_ GUARDED_BY(mu_) = 0;
};

}  // namespace ember
