// The online softmax's pinned-rounding steps in base 2, shared by the attention kernels
// (attention_invariant.cu, mla_attention.cu): scores in "logit units" u, a key's weight
// 2^(u c - m c) with c the softmax scale times log2 e, states (m, l, o) rescaled and folded with
// explicit _rn operations (no FMA contraction), so every path that runs the same steps gives the
// same bits.
#pragma once

#include <cmath>

namespace ember::cuda {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float Exp2(float x) {  // 2^x; ex2(-inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// m c for the weights' exponents; 0 for an empty state (all its scores are -inf, so the weights
// stay 0 rather than NaN).
__device__ __forceinline__ float MaxTimesScale(float m, float c) {
  return m == -INFINITY ? 0.f : __fmul_rn(m, c);
}

// The weight of a state with max m after the max moves to new_m (exactly 1 when it did not move,
// 0 for an empty state). m, new_m in logit units. The exponential is computed whichever case
// holds, so the choice is two selects rather than branches.
__device__ __forceinline__ float Rescale(float m, float new_m, float c) {
  const float e = Exp2(__fmul_rn(__fsub_rn(m, new_m), c));
  return m == new_m ? 1.f : (m == -INFINITY ? 0.f : e);
}

// Folds a split state (m, l) into the running (M, L); a, b weigh the running and the split O.
__device__ __forceinline__ void FoldScalars(float& M, float& L, float m, float l, float c,
                                            float& a, float& b) {
  const float new_m = fmaxf(M, m);
  a = Rescale(M, new_m, c);
  b = Rescale(m, new_m, c);
  L = __fadd_rn(__fmul_rn(L, a), __fmul_rn(l, b));
  M = new_m;
}

__device__ __forceinline__ float FoldValue(float O, float o, float a, float b) {
  return __fadd_rn(__fmul_rn(O, a), __fmul_rn(o, b));
}

}  // namespace ember::cuda
