// Rotary embedding (HF rotate-half) over q and k in one launch: one thread per rotated pair
// (token, head, i), flat over the whole step, so a decode row is one wave of independent loads.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope_rotate.cuh"

namespace ember::cuda {
namespace {

__global__ void RopeKernel(float* q, float* k, int32_t num_heads, int32_t num_kv_heads,
                           int32_t head_dim, int32_t rotary_dim, const float* cos_table,
                           const float* sin_table, int32_t max_positions,
                           const int32_t* positions, int64_t total) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  PdlWait();  // launched with LaunchPdl: the previous kernel's outputs are visible after this
  PdlTrigger();
  if (idx >= total) return;
  const int32_t half = rotary_dim / 2;
  const int32_t total_heads = num_heads + num_kv_heads;
  const int64_t token = idx / (static_cast<int64_t>(total_heads) * half);
  const int32_t rem = static_cast<int32_t>(idx % (static_cast<int64_t>(total_heads) * half));
  const int32_t head = rem / half, i = rem % half;
  const int32_t pos = positions[token];
  if (pos < 0 || pos >= max_positions) __trap();  // CHECKed on the host side too
  float* x = head < num_heads ? q + (token * num_heads + head) * head_dim
                              : k + (token * num_kv_heads + (head - num_heads)) * head_dim;
  const float x1 = x[i], x2 = x[i + half];
  const float c = cos_table[static_cast<int64_t>(pos) * half + i];
  const float s = sin_table[static_cast<int64_t>(pos) * half + i];
  const float2 y = RotatePair(x1, x2, c, s);
  x[i] = y.x;
  x[i + half] = y.y;
}

}  // namespace

void LaunchRope(float* q, float* k, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                int32_t rotary_dim, const float* cos_table, const float* sin_table,
                int32_t max_positions, const PlanView& plan, cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  const int64_t total =
      static_cast<int64_t>(plan.num_tokens) * (num_heads + num_kv_heads) * (rotary_dim / 2);
  if (total == 0) return;
  const unsigned blocks = static_cast<unsigned>((total + 255) / 256);
  LaunchPdl(RopeKernel, dim3(blocks), dim3(256), 0, stream, q, k, num_heads, num_kv_heads,
            head_dim, rotary_dim, cos_table, sin_table, max_positions, plan.positions, total);
}

}  // namespace ember::cuda
