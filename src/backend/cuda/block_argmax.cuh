// BlockArgmax: the largest value of x[0, n) and the first index holding it, NaN skipped (an
// all-NaN row answers index 0), computed by one thread block of kThreads threads — the host
// sampler's greedy rule (sampling/processors.h Argmax). Every thread gets the result. Shared by
// the ArgmaxRows and SampleRows kernels.
#pragma once

#include <climits>
#include <cstdint>

#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {

// (v, i) beats (best, best_i) when larger, or equal at a lower index; an empty slot (-inf,
// INT_MAX) loses every tie against a real index.
__device__ __forceinline__ void ArgmaxTake(float v, int i, float& best, int& best_i) {
  if (v > best || (v == best && i < best_i)) {
    best = v;
    best_i = i;
  }
}

// Folds every thread's (best, best_i) over the block: thread 0 ends with the block's, folded in
// warp order. warp_max / warp_index: kThreads / 32 shared slots each.
template <int kThreads>
__device__ void BlockArgmaxFold(float& best, int& best_i, float* warp_max, int* warp_index) {
  WarpArgmax(best, best_i);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_max[warp] = best;
    warp_index[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) ArgmaxTake(warp_max[w], warp_index[w], best, best_i);
  }
}

template <int kThreads>
__device__ void BlockArgmax(const float* __restrict__ x, int64_t n, float* max_out,
                            int* index_out) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float warp_max[kWarps];
  __shared__ int warp_index[kWarps];
  __shared__ float block_max;
  __shared__ int block_index;
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
  BlockArgmaxFold<kThreads>(best, best_i, warp_max, warp_index);
  if (threadIdx.x == 0) {
    block_max = best;
    block_index = best_i == INT_MAX ? 0 : best_i;
  }
  __syncthreads();
  *max_out = block_max;
  *index_out = block_index;
  __syncthreads();  // the shared slots may be reused by the caller's next reduction
}

}  // namespace ember::cuda
