// ArgmaxRows: one block per row finds the first index of the row's maximum (NaN never wins),
// the device half of greedy decoding: only the ids travel back to the host.
#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace ember::cuda {
namespace {

constexpr int kThreads = 512;

// (v, i) beats (bv, bi) when larger, or equal at a lower index. NaN compares false either way.
__device__ __forceinline__ void Better(float v, int i, float& bv, int& bi) {
  if (v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}

__global__ void ArgmaxRowsKernel(const float* __restrict__ x, int64_t cols,
                                 int32_t* __restrict__ ids) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float best = -FLT_MAX;
  int best_i = INT_MAX;
  // -inf entries must still be found (a row of all -inf answers 0, like the host): start below.
  bool any = false;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float v = row[j];
    if (v != v) continue;  // NaN
    if (!any || v > best || (v == best && j < best_i)) {
      best = v;
      best_i = static_cast<int>(j);
      any = true;
    }
  }
  if (!any) best = -INFINITY;  // best_i stays INT_MAX: loses every tie against a real index
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_down_sync(0xffffffffu, best, off);
    const int oi = __shfl_down_sync(0xffffffffu, best_i, off);
    Better(ov, oi, best, best_i);
  }
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < kThreads / 32 ? sv[lane] : -INFINITY;
    best_i = lane < kThreads / 32 ? si[lane] : INT_MAX;
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_down_sync(0xffffffffu, best, off);
      const int oi = __shfl_down_sync(0xffffffffu, best_i, off);
      Better(ov, oi, best, best_i);
    }
    if (lane == 0) ids[blockIdx.x] = best_i == INT_MAX ? 0 : best_i;
  }
}

}  // namespace

void LaunchArgmaxRows(const float* x, int64_t rows, int64_t cols, int32_t* ids,
                      cudaStream_t stream) {
  if (rows == 0) return;
  ArgmaxRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, ids);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda
