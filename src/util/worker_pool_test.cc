#include "util/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "util/mutex.h"

namespace ember {
namespace {

// Every item of every job runs exactly once and its result is visible when ForEach returns:
// many jobs back to back (workers that wake late find a closed or a newer job), of sizes from
// 0 to more items than threads, on pools of 1 (inline), 2 and 8 threads.
TEST(WorkerPoolTest, EachItemRunsOnceAndItsResultIsVisible) {
  for (size_t threads : {size_t{1}, size_t{2}, size_t{8}}) {
    WorkerPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (size_t job = 0; job < 300; ++job) {
      const size_t n = job % 37;
      std::vector<int> runs(n, 0);  // each written by one item only
      std::atomic<int> total{0};
      pool.ForEach(n, [&](size_t i) {
        ++runs[i];
        total.fetch_add(1, std::memory_order_relaxed);
      });
      ASSERT_EQ(total.load(), static_cast<int>(n)) << threads << " threads, job " << job;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(runs[i], 1) << "item " << i << " of job " << job;
    }
  }
}

// Items run on more than one thread when they take a while (the workers do join), and a pool
// of one thread runs them all on the caller.
TEST(WorkerPoolTest, WorkersTakePart) {
  auto threads_used = [](WorkerPool& pool) {
    Mutex mu;
    std::set<std::thread::id> ids;
    pool.ForEach(64, [&](size_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      MutexLock lock(&mu);
      ids.insert(std::this_thread::get_id());
    });
    return ids;
  };
  WorkerPool four(4);
  EXPECT_GT(threads_used(four).size(), 1u);
  WorkerPool one(1);
  const std::set<std::thread::id> inline_ids = threads_used(one);
  ASSERT_EQ(inline_ids.size(), 1u);
  EXPECT_EQ(*inline_ids.begin(), std::this_thread::get_id());
}

}  // namespace
}  // namespace ember
