// ThreadPool: every item of every job runs exactly once, on a valid thread index, across many
// back-to-back jobs (the spin/sleep hand-over between jobs), and max_threads = 1 keeps a job on
// the calling thread.
#include "backend/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace ember::cpu {
namespace {

TEST(ThreadPoolTest, RunsEveryItemOnceAcrossManyJobs) {
  ThreadPool pool(3);
  ASSERT_EQ(pool.num_threads(), 3);
  for (int job = 0; job < 2000; ++job) {
    const int64_t items = job % 7 == 0 ? 1 : job % 50;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(items));
    std::atomic<bool> bad_thread{false};
    pool.ParallelFor(items, [&](int64_t item, int thread_idx) {
      if (thread_idx < 0 || thread_idx >= 3) bad_thread = true;
      hits[static_cast<size_t>(item)].fetch_add(1);
    });
    ASSERT_FALSE(bad_thread) << "job " << job;
    for (int64_t i = 0; i < items; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "job " << job;
    // Now and then let the workers fall asleep so the futex wake-up path runs too.
    if (job % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TEST(ThreadPoolTest, MaxThreadsOneStaysOnTheCaller) {
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<int> threads_seen;
  pool.ParallelFor(
      64,
      [&](int64_t, int thread_idx) {
        EXPECT_EQ(std::this_thread::get_id(), caller);
        threads_seen.push_back(thread_idx);
      },
      1);
  EXPECT_EQ(threads_seen, std::vector<int>(64, 0));
}

}  // namespace
}  // namespace ember::cpu
