// WriteKv: scatters this step's k/v rows into the paged pool at their slots (one block per row).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

__global__ void WriteKvKernel(const float* k, const float* v, float* k_pool, float* v_pool,
                              int64_t row_width, const int32_t* slot_mapping) {
  const int64_t token = blockIdx.x;
  PdlWait();  // launched with LaunchPdl: the previous kernel's outputs are visible after this
  PdlTrigger();
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;  // padding rows carry no K/V
  for (int64_t c = threadIdx.x; c < row_width; c += blockDim.x) {
    k_pool[slot * row_width + c] = k[token * row_width + c];
    v_pool[slot * row_width + c] = v[token * row_width + c];
  }
}

}  // namespace

void LaunchWriteKv(const float* k, const float* v, const KvLayerView& kv, const PlanView& plan,
                   cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  const int64_t row_width = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  LaunchPdl(WriteKvKernel, dim3(plan.num_tokens), dim3(256), 0, stream, k, v, kv.k, kv.v,
            row_width, plan.slot_mapping);
}

}  // namespace ember::cuda
