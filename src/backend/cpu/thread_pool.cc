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
  generation_.fetch_add(2, std::memory_order_release);
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
    const uint64_t gen = WaitWhileEqual(generation_, seen);
    seen = gen;
    if (stop_.load(std::memory_order_relaxed)) return;
    if ((gen & 1) == 0) continue;  // closed before this worker got to it
    // Dekker hand-shake with ParallelFor's close: either the caller sees this worker active and
    // waits for it, or this worker sees the job closed and keeps out of its (reused) fields.
    active_workers_.fetch_add(1, std::memory_order_seq_cst);
    if (generation_.load(std::memory_order_seq_cst) == gen && thread_idx < job_threads_)
      RunItems(thread_idx);
    if (active_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) active_workers_.notify_one();
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
  // No worker is inside a job here (the last close waited for them), so the fields are ours.
  fn_ = &fn;
  num_items_ = num_items;
  job_threads_ = threads;
  next_item_.store(0, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);  // open (odd): publishes the fields
  generation_.notify_all();
  RunItems(0);
  // Every item is claimed; close the job and wait for the workers that joined it.
  generation_.fetch_add(1, std::memory_order_seq_cst);
  for (int active = active_workers_.load(std::memory_order_seq_cst); active != 0;)
    active = WaitWhileEqual(active_workers_, active);
  fn_ = nullptr;
}

}  // namespace ember::cpu
