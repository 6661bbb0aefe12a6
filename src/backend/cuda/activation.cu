// Gated activations of the MLP: silu(gate) * up and gelu_tanh(gate) * up, over f32 or (the fused
// prefill MLP) bf16 operands; the math is f32 either way.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

__device__ __forceinline__ float Activate(float g, bool gelu) {
  if (gelu) {
    const float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * g * (1.f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
  }
  return g / (1.f + expf(-g));
}

__global__ void GatedActivationKernel(const float* gate, const float* up, float* out, int64_t n,
                                      bool gelu) {
  PdlWait();  // launched with LaunchPdl: the previous kernel's outputs are visible after this
  PdlTrigger();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = Activate(gate[i], gelu) * up[i];
  }
}

// Eight elements per thread and iteration (16-byte loads); the n % 8 tail one by one.
__global__ void GatedActivationBf16Kernel(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                          __nv_bfloat16* out, int64_t n, bool gelu) {
  PdlWait();
  PdlTrigger();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t vecs = n / 8;
  for (int64_t v = first; v < vecs; v += stride) {
    const uint4 g = reinterpret_cast<const uint4*>(gate)[v];
    const uint4 u = reinterpret_cast<const uint4*>(up)[v];
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
    const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&u);
    uint4 r;
    __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 gf = __bfloat1622float2(g2[i]), uf = __bfloat1622float2(u2[i]);
      r2[i] = __floats2bfloat162_rn(Activate(gf.x, gelu) * uf.x, Activate(gf.y, gelu) * uf.y);
    }
    reinterpret_cast<uint4*>(out)[v] = r;
  }
  for (int64_t i = vecs * 8 + first; i < n; i += stride) {
    out[i] = __float2bfloat16_rn(Activate(__bfloat162float(gate[i]), gelu) *
                                 __bfloat162float(up[i]));
  }
}

}  // namespace

void LaunchGatedActivation(const float* gate, const float* up, float* out, int64_t n, bool gelu,
                           cudaStream_t stream) {
  if (n == 0) return;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  LaunchPdl(GatedActivationKernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream,
            gate, up, out, n, gelu);
}

void LaunchGatedActivationBf16(const void* gate, const void* up, void* out, int64_t n, bool gelu,
                               cudaStream_t stream) {
  if (n == 0) return;
  CHECK(reinterpret_cast<uintptr_t>(gate) % 16 == 0 && reinterpret_cast<uintptr_t>(up) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(out) % 16 == 0);
  int64_t blocks = (n / 8 + 255) / 256;
  if (blocks < 1) blocks = 1;
  if (blocks > 65536) blocks = 65536;
  LaunchPdl(GatedActivationBf16Kernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream,
            static_cast<const __nv_bfloat16*>(gate), static_cast<const __nv_bfloat16*>(up),
            static_cast<__nv_bfloat16*>(out), n, gelu);
}

}  // namespace ember::cuda
