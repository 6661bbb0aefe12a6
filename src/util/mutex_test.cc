#include "util/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "util/thread_annotations.h"

namespace ember {
namespace {

// A counter shared between threads, annotated the way production classes are: the
// thread_safety_analysis test also runs clang -Wthread-safety over this file.
class SharedCounter {
 public:
  void Add(int n) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    AddLocked(n);
    cv_.NotifyAll();
  }
  // Waits until the count reaches `target`.
  int WaitFor(int target) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return count_ >= target; });
    return count_;
  }
  // Waits at most `timeout`; false when the count never reached `target`.
  bool WaitFor(int target, std::chrono::milliseconds timeout) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return cv_.WaitFor(&mu_, timeout, [&]() REQUIRES(mu_) { return count_ >= target; });
  }
  // Reads the count, then releases the lock early; the copy stays valid.
  int ReadThenUnlock() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const int value = count_;
    lock.Unlock();
    return value;
  }
  // True when the mutex is free (try_lock-free check: a second MutexLock would deadlock if not).
  bool Free() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return true;
  }

 private:
  void AddLocked(int n) REQUIRES(mu_) { count_ += n; }

  Mutex mu_;
  CondVar cv_;
  int count_ GUARDED_BY(mu_) = 0;
};

TEST(MutexTest, MutexLockSerialisesWriters) {
  SharedCounter counter;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&counter] {
      for (int i = 0; i < 10000; ++i) counter.Add(1);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter.ReadThenUnlock(), 40000);
}

TEST(MutexTest, EarlyUnlockReleasesOnce) {
  SharedCounter counter;
  counter.Add(3);
  EXPECT_EQ(counter.ReadThenUnlock(), 3);
  EXPECT_TRUE(counter.Free());  // the early Unlock left the mutex free, the destructor did not
  counter.Add(1);               // and did not unlock it a second time
  EXPECT_EQ(counter.ReadThenUnlock(), 4);
}

TEST(MutexTest, CondVarWaitWakesOnNotify) {
  SharedCounter counter;
  std::thread producer([&counter] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    counter.Add(5);
  });
  EXPECT_EQ(counter.WaitFor(5), 5);
  producer.join();
}

TEST(MutexTest, CondVarWaitForTimesOutWithoutNotify) {
  SharedCounter counter;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(counter.WaitFor(1, std::chrono::milliseconds(30)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
  counter.Add(1);
  EXPECT_TRUE(counter.WaitFor(1, std::chrono::milliseconds(0)));
}

TEST(MutexTest, MutexIsBasicLockable) {
  Mutex mu;
  {
    std::lock_guard<Mutex> guard(mu);  // std lock types accept it (unchecked by the analysis)
  }
  MutexLock lock(&mu);  // free again after the guard's scope
  SUCCEED();
}

}  // namespace
}  // namespace ember
