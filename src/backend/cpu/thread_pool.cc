#include "backend/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace ember::cpu {
namespace {

// How long a waiting thread spins before it sleeps: longer than the gap between two ops of a
// forward pass (a few microseconds), far shorter than a scheduler time slice.
constexpr auto kSpin = std::chrono::microseconds(50);

// Waits until `value` differs from `old`; returns the new value.
template <typename T>
T WaitWhileEqual(const std::atomic<T>& value, T old) {
  T now = value.load(std::memory_order_acquire);
  if (now != old) return now;
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  while (true) {
    for (int i = 0; i < 16; ++i) {
      _mm_pause();
      now = value.load(std::memory_order_acquire);
      if (now != old) return now;
    }
    if (std::chrono::steady_clock::now() > deadline) break;
  }
  while ((now = value.load(std::memory_order_acquire)) == old) value.wait(old, std::memory_order_acquire);
  return now;
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::RunItems(int thread_idx) {
  for (int64_t item = next_item_.fetch_add(1, std::memory_order_relaxed); item < num_items_;
       item = next_item_.fetch_add(1, std::memory_order_relaxed))
    (*fn_)(item, thread_idx);
}

void ThreadPool::WorkerLoop(int thread_idx) {
  uint64_t seen = 0;
  while (true) {
    seen = WaitWhileEqual(generation_, seen);
    if (stop_.load(std::memory_order_relaxed)) return;
    if (thread_idx < job_threads_) RunItems(thread_idx);
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_one();
  }
}

void ThreadPool::ParallelFor(int64_t num_items, const std::function<void(int64_t, int)>& fn,
                             int max_threads) {
  if (num_items <= 0) return;
  const int threads = static_cast<int>(
      std::min<int64_t>({num_threads(), std::max(max_threads, 1), num_items}));
  if (threads == 1) {
    for (int64_t item = 0; item < num_items; ++item) fn(item, 0);
    return;
  }
  fn_ = &fn;
  num_items_ = num_items;
  job_threads_ = threads;
  next_item_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);  // publishes the job's fields
  generation_.notify_all();
  RunItems(0);
  for (int busy = busy_workers_.load(std::memory_order_acquire); busy != 0;)
    busy = WaitWhileEqual(busy_workers_, busy);
  fn_ = nullptr;
}

}  // namespace ember::cpu
