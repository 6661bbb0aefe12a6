#include "util/worker_pool.h"

namespace ember {

WorkerPool::WorkerPool(size_t num_threads) {
  for (size_t t = 1; t < num_threads; ++t) workers_.emplace_back([this] { WorkerLoop(); });
}

WorkerPool::~WorkerPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.NotifyAll();
  for (std::thread& worker : workers_) worker.join();
}

void WorkerPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(size_t)>* fn = nullptr;
    size_t n = 0;
    {
      MutexLock lock(&mu_);
      wake_.Wait(&mu_, [&]() REQUIRES(mu_) { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (fn_ == nullptr) continue;  // that job closed before this worker woke
      fn = fn_;
      n = num_items_;
      ++busy_;
    }
    for (size_t i; (i = next_item_.fetch_add(1, std::memory_order_relaxed)) < n;) (*fn)(i);
    MutexLock lock(&mu_);
    if (--busy_ == 0) idle_.NotifyOne();
  }
}

void WorkerPool::ForEach(size_t n, const std::function<void(size_t)>& fn) {
  if (workers_.empty() || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    MutexLock lock(&mu_);
    fn_ = &fn;
    num_items_ = n;
    next_item_.store(0, std::memory_order_relaxed);  // (no worker is inside a job now)
    ++generation_;
  }
  wake_.NotifyAll();
  for (size_t i; (i = next_item_.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  // Every item is claimed: wait for the workers that joined, then close the job (a worker that
  // wakes later finds it closed).
  MutexLock lock(&mu_);
  idle_.Wait(&mu_, [&]() REQUIRES(mu_) { return busy_ == 0; });
  fn_ = nullptr;
}

}  // namespace ember
