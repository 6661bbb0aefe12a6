// ForEachOnThreads: runs fn(i) for every i in [0, n): items are claimed from a shared counter by
// the calling thread and up to max_threads - 1 short-lived helpers, started per call (no idle
// pool spinning next to the CPU backend's workers). fn must be safe to run concurrently for
// distinct i. Returns when every item is done.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace ember {

template <typename Fn>
void ForEachOnThreads(size_t n, size_t max_threads, const Fn& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  const size_t num_threads = std::min(n, std::max<size_t>(1, max_threads));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < num_threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
}

}  // namespace ember
