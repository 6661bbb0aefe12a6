// RMSNorm, optionally fused with the residual add: one block per row, f32 sum of squares.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace ember::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  return total;
}

// src: the row to normalise; when residual != null, src = residual += delta first.
__global__ void RmsNormKernel(const float* x, float* residual, const float* delta,
                              const float* weight, float eps, bool one_plus, int64_t d,
                              float* out) {
  __shared__ float scratch[kThreads / 32];
  const int64_t base = blockIdx.x * d;
  float sum_sq = 0.f;
  if (residual != nullptr) {
    for (int64_t c = threadIdx.x; c < d; c += kThreads) {
      float v = residual[base + c] + delta[base + c];
      residual[base + c] = v;
      sum_sq += v * v;
    }
    x = residual;
  } else {
    for (int64_t c = threadIdx.x; c < d; c += kThreads) {
      float v = x[base + c];
      sum_sq += v * v;
    }
  }
  const float inv_rms = rsqrtf(BlockSum(sum_sq, scratch) / static_cast<float>(d) + eps);
  for (int64_t c = threadIdx.x; c < d; c += kThreads) {
    float w = one_plus ? 1.f + weight[c] : weight[c];
    out[base + c] = x[base + c] * inv_rms * w;
  }
}

}  // namespace

void LaunchRmsNorm(const float* x, float* residual, const float* delta, const float* weight,
                   float eps, bool one_plus_weight, int64_t rows, int64_t d, float* out,
                   cudaStream_t stream) {
  if (rows == 0) return;
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, residual, delta, weight, eps, one_plus_weight, d, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
