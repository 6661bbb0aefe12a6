// A small fork/join pool for the CPU kernels: num_threads - 1 persistent workers plus the calling
// thread run ParallelFor's items, each item claimed dynamically from an atomic counter. The caller
// waits only for workers that joined the job, so a worker the OS has descheduled (an
// oversubscribed machine) delays an op by at most the item it holds, and not at all if it never
// woke up in time. Idle workers spin briefly (ops follow each other within
// microseconds during a forward pass), then sleep on a futex (std::atomic::wait), so an idle or
// oversubscribed process does not burn the cores its neighbours need. Which thread runs an item
// never changes what the item computes, so kernels stay bitwise identical for any thread count.
// Not reentrant: one thread (the backend's driving thread) calls ParallelFor at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace ember::cpu {

class ThreadPool {
 public:
  // num_threads <= 1: no workers, ParallelFor runs inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(item, thread_idx) for every item in [0, num_items) exactly once; thread_idx in
  // [0, num_threads) identifies the running thread (for per-thread scratch). max_threads caps how
  // many threads take part (1: the caller alone). Returns when every item has finished.
  void ParallelFor(int64_t num_items, const std::function<void(int64_t, int)>& fn,
                   int max_threads = 1 << 30);

 private:
  void WorkerLoop(int thread_idx);
  void RunItems(int thread_idx);

  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int)>* fn_ = nullptr;  // valid while a job is open
  int64_t num_items_ = 0;
  int job_threads_ = 1;                   // threads taking part in the current job
  // Odd: a job is open (workers may join); even: closed. Workers wait on it.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_item_{0};     // next unclaimed item of the open job
  std::atomic<int> active_workers_{0};    // workers inside the open job (the caller waits for 0)
  std::atomic<bool> stop_{false};
};

}  // namespace ember::cpu
