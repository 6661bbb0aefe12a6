// Embedding gather: one block per token row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

__global__ void EmbeddingKernel(const void* table, ElemType table_type, int64_t vocab, int64_t d,
                                float scale, const int32_t* token_ids, const int32_t* fed_ids,
                                float* out) {
  TraceStamp();  // (the step's first kernel: no PdlWait to stamp)
  const int64_t row = blockIdx.x;
  int64_t token = token_ids[row];
  if (token < 0) token = fed_ids[-1 - token];  // the previous step's id of that logits row
  if (token < 0 || token >= vocab) __trap();  // the engine validated ids; a bad one is a bug
  const int64_t base = token * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float v;
    if (table_type == ElemType::kBF16) {
      v = __bfloat162float(static_cast<const __nv_bfloat16*>(table)[base + c]);
    } else if (table_type == ElemType::kF16) {
      v = __half2float(static_cast<const __half*>(table)[base + c]);
    } else {
      v = static_cast<const float*>(table)[base + c];
    }
    out[row * d + c] = v * scale;
  }
}

}  // namespace

void LaunchEmbedding(const void* table, ElemType table_type, int64_t vocab, int64_t d, float scale,
                     const PlanView& plan, float* out, cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  PreferMaxShared(reinterpret_cast<const void*>(EmbeddingKernel));
  EmbeddingKernel<<<plan.num_tokens, 256, 0, stream>>>(table, table_type, vocab, d, scale,
                                                       plan.token_ids, plan.fed_ids, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
