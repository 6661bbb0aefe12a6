// Gated activations of the MLP: silu(gate) * up and gelu_tanh(gate) * up.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

__global__ void GatedActivationKernel(const float* gate, const float* up, float* out, int64_t n,
                                      bool gelu) {
  PdlWait();  // launched with LaunchPdl: the previous kernel's outputs are visible after this
  PdlTrigger();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    float a;
    if (gelu) {
      const float kSqrt2OverPi = 0.7978845608028654f;
      a = 0.5f * g * (1.f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
    } else {
      a = g / (1.f + expf(-g));
    }
    out[i] = a * up[i];
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

}  // namespace ember::cuda
