// The gated activations of the MLP, act(gate) * up: silu (gelu = false) and gelu_tanh. Shared by
// the activation kernel and the batch-1 GEMV that computes gate and up itself (gemv.cu), so both
// give the same bits for the same gate and up.
#pragma once

namespace ember::cuda {

__device__ __forceinline__ float Gated(float g, float u, bool gelu) {
  float a;
  if (gelu) {
    const float kSqrt2OverPi = 0.7978845608028654f;
    a = 0.5f * g * (1.f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
  } else {
    a = g / (1.f + expf(-g));
  }
  return a * u;
}

}  // namespace ember::cuda
