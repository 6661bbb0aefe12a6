// Rotary embedding (HF rotate-half) over q and k in one launch: one block per token.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace ember::cuda {
namespace {

__global__ void RopeKernel(float* q, float* k, int32_t num_heads, int32_t num_kv_heads,
                           int32_t head_dim, int32_t rotary_dim, const float* cos_table,
                           const float* sin_table, int32_t max_positions,
                           const int32_t* positions) {
  const int64_t token = blockIdx.x;
  const int32_t pos = positions[token];
  if (pos < 0 || pos >= max_positions) __trap();  // CHECKed on the host side too
  const int32_t half = rotary_dim / 2;
  const float* cos_row = cos_table + static_cast<int64_t>(pos) * half;
  const float* sin_row = sin_table + static_cast<int64_t>(pos) * half;
  const int32_t total_heads = num_heads + num_kv_heads;
  for (int32_t idx = threadIdx.x; idx < total_heads * half; idx += blockDim.x) {
    const int32_t head = idx / half, i = idx % half;
    float* x = head < num_heads
                   ? q + (token * num_heads + head) * head_dim
                   : k + (token * num_kv_heads + (head - num_heads)) * head_dim;
    const float x1 = x[i], x2 = x[i + half];
    const float c = cos_row[i], s = sin_row[i];
    x[i] = x1 * c - x2 * s;
    x[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace

void LaunchRope(float* q, float* k, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                int32_t rotary_dim, const float* cos_table, const float* sin_table,
                int32_t max_positions, const PlanView& plan, cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  RopeKernel<<<plan.num_tokens, 128, 0, stream>>>(q, k, num_heads, num_kv_heads, head_dim,
                                                  rotary_dim, cos_table, sin_table, max_positions,
                                                  plan.positions);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
