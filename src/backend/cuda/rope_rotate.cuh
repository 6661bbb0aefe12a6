// HF rotate-half of one pair (x1 = x[i], x2 = x[i + rotary_dim / 2]) by the angle with cosine c
// and sine s, rounding pinned (no FMA contraction): rope.cu and the fused Rope + WriteKv
// (write_kv.cu) give the same bits.
#pragma once

#include <cuda_runtime.h>

namespace ember::cuda {

__device__ __forceinline__ float2 RotatePair(float x1, float x2, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)),
                     __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

}  // namespace ember::cuda
