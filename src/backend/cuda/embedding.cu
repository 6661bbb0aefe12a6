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
  if (table_type == ElemType::kBF16 && d % 8 == 0 &&
      reinterpret_cast<uintptr_t>(table) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    // 8 elements a thread per 16-byte load, a row's loads all issued at once (a decode step's
    // row of 2,048-4,096 is one or two loads per thread rather than a chain of strided ones).
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(table) +
                                                      base);
    float4* dst = reinterpret_cast<float4*>(out + row * d);
    for (int64_t c = threadIdx.x; c < d / 8; c += blockDim.x) {
      const uint4 raw = src[c];
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
      float v[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(pairs[i]);
        v[2 * i] = f.x * scale;
        v[2 * i + 1] = f.y * scale;
      }
      dst[2 * c] = make_float4(v[0], v[1], v[2], v[3]);
      dst[2 * c + 1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    return;
  }
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
