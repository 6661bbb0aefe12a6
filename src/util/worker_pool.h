// WorkerPool: a fork/join pool for the engine thread's per-step helper work (a step's constraint
// masks, its jump-forward chains): num_threads - 1 persistent workers plus the calling thread run
// ForEach's items, each claimed from a shared counter. Started once instead of per call
// (ForEachOnThreads, util/parallel.h, starts and joins its helpers every call: tens of
// microseconds a thread, every step); idle workers sleep on a condition variable, so they never
// spin beside the CPU backend's workers. Which thread runs an item never changes what it
// computes. One thread calls ForEach at a time (the engine thread); not reentrant.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace ember {

class WorkerPool {
 public:
  // num_threads <= 1: no workers, ForEach runs inline.
  explicit WorkerPool(size_t num_threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  size_t num_threads() const { return workers_.size() + 1; }

  // Calls fn(i) for every i in [0, n) exactly once, on the calling thread and the workers that
  // wake in time; returns when every item has finished. fn must be safe to run concurrently
  // for distinct i.
  void ForEach(size_t n, const std::function<void(size_t)>& fn);

 private:
  void WorkerLoop();

  Mutex mu_;
  CondVar wake_;  // a job opened, or stop
  CondVar idle_;  // the last worker left the job
  // The open job: fn_ non-null from ForEach's start until every worker that joined has left.
  const std::function<void(size_t)>* fn_ GUARDED_BY(mu_) = nullptr;
  size_t num_items_ GUARDED_BY(mu_) = 0;
  uint64_t generation_ GUARDED_BY(mu_) = 0;  // jobs opened
  size_t busy_ GUARDED_BY(mu_) = 0;          // workers inside the open job
  bool stop_ GUARDED_BY(mu_) = false;
  std::atomic<size_t> next_item_{0};  // the open job's next unclaimed item
  std::vector<std::thread> workers_;
};

}  // namespace ember
