// Event timing shared by the CUDA benchmark programs (gemm_bench, gemv_bench, cuda_sample_bench).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace ember::bench {

// Median milliseconds of `reps` calls of fn, each timed alone with events on `st`, after 3
// untimed warm-up calls.
template <typename Fn>
double MedianMs(cudaStream_t st, int64_t reps, Fn fn) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> ms;
  for (int64_t i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, st));
    fn();
    CUDA_CHECK(cudaEventRecord(b, st));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace ember::bench
