// WriteKv: scatters this step's k/v rows into the paged pool at their slots (one block per row).
// A bf16 pool stores each element rounded once, to nearest even (__float2bfloat16_rn): the same
// rounding attention_invariant.cu applies when it stages an f32 pool's K/V, so both pools give
// the same attention bits.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

__device__ __forceinline__ void Store(float* dst, float x) { *dst = x; }
__device__ __forceinline__ void Store(__nv_bfloat16* dst, float x) {
  *dst = __float2bfloat16_rn(x);
}

template <typename T>
__global__ void WriteKvKernel(const float* k, const float* v, T* k_pool, T* v_pool,
                              int64_t row_width, const int32_t* slot_mapping) {
  const int64_t token = blockIdx.x;
  PdlWait();  // launched with LaunchPdl: the previous kernel's outputs are visible after this
  PdlTrigger();
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;  // padding rows carry no K/V
  for (int64_t c = threadIdx.x; c < row_width; c += blockDim.x) {
    Store(k_pool + slot * row_width + c, k[token * row_width + c]);
    Store(v_pool + slot * row_width + c, v[token * row_width + c]);
  }
}

}  // namespace

void LaunchWriteKv(const float* k, const float* v, const KvLayerView& kv, const PlanView& plan,
                   cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  const int64_t row_width = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  if (kv.bf16) {
    LaunchPdl(WriteKvKernel<__nv_bfloat16>, dim3(plan.num_tokens), dim3(256), 0, stream, k, v,
              reinterpret_cast<__nv_bfloat16*>(kv.k), reinterpret_cast<__nv_bfloat16*>(kv.v),
              row_width, plan.slot_mapping);
  } else {
    LaunchPdl(WriteKvKernel<float>, dim3(plan.num_tokens), dim3(256), 0, stream, k, v, kv.k, kv.v,
              row_width, plan.slot_mapping);
  }
}

}  // namespace ember::cuda
