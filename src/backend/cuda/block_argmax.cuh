// BlockArgmax: the largest value of x[0, n) and the first index holding it, NaN skipped (an
// all-NaN row answers index 0), computed by one thread block of kThreads threads — the host
// sampler's greedy rule (sampling/processors.h Argmax). Every thread gets the result. Shared by
// the ArgmaxRows and SampleRows kernels.
#pragma once

#include <climits>
#include <cstdint>

#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {

template <int kThreads>
__device__ void BlockArgmax(const float* __restrict__ x, int64_t n, float* max_out,
                            int* index_out) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float warp_max[kWarps];
  __shared__ int warp_index[kWarps];
  __shared__ float block_max;
  __shared__ int block_index;
  // (value, index) beats (best, best_i) when larger, or equal at a lower index; an empty lane
  // (-inf, INT_MAX) loses every tie against a real index.
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float v = x[j];
    if (v != v) continue;  // NaN
    if (best_i == INT_MAX || v > best) {
      best = v;
      best_i = static_cast<int>(j);
    }
  }
  WarpArgmax(best, best_i);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_max[warp] = best;
    warp_index[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      if (warp_max[w] > best || (warp_max[w] == best && warp_index[w] < best_i)) {
        best = warp_max[w];
        best_i = warp_index[w];
      }
    }
    block_max = best;
    block_index = best_i == INT_MAX ? 0 : best_i;
  }
  __syncthreads();
  *max_out = block_max;
  *index_out = block_index;
  __syncthreads();  // the shared slots may be reused by the caller's next reduction
}

}  // namespace ember::cuda
