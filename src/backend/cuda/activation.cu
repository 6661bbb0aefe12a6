// Gated activations of the MLP: silu(gate) * up and gelu_tanh(gate) * up, from f32 or bf16 gate
// and up (AllocMatMulOutput), into f32 or into bf16 rounded RN from the same f32 values (a GEMM
// input: the bits a separate f32 -> bf16 conversion would give). Four elements per thread access
// when the buffers allow it.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gated.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/out_store.cuh"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

// VEC 4: n % 4 == 0 and every buffer 16-byte aligned (gate/up read 4 elements at a time).
template <int VEC, typename InT, typename OutT>
__global__ void GatedActivationKernel(const InT* gate, const InT* up, OutT* out, int64_t n,
                                      bool gelu) {
  // Dependents first (the ring GEMV after this kernel starts its weight copies while this one
  // waits; pdl.cuh), then the previous kernel's outputs, visible after PdlWait.
  PdlTrigger();
  PdlWait();
  const int64_t nv = n / VEC;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nv;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (VEC == 4) {
      const float4 g = LoadVec<float4>(gate, i);
      const float4 u = LoadVec<float4>(up, i);
      const float4 r = make_float4(Gated(g.x, u.x, gelu), Gated(g.y, u.y, gelu),
                                   Gated(g.z, u.z, gelu), Gated(g.w, u.w, gelu));
      StoreVec(out, i, r);
    } else {
      StoreVec(out, i, Gated(LoadVec<float>(gate, i), LoadVec<float>(up, i), gelu));
    }
  }
}

}  // namespace

void LaunchGatedActivation(const void* gate, const void* up, bool in_bf16, void* out, bool out_bf16,
                           int64_t n, bool gelu, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec4 = n % 4 == 0 && Aligned16(gate) && Aligned16(up) && Aligned16(out);
  int64_t blocks = (n / (vec4 ? 4 : 1) + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  DispatchIn(gate, in_bf16, [&](auto* typed_gate) {
    using InT = std::remove_const_t<std::remove_pointer_t<decltype(typed_gate)>>;
    const InT* typed_up = static_cast<const InT*>(up);
    DispatchOut(out, out_bf16, vec4, [&](auto vec_tag, auto* typed_out) {
      constexpr int kVec = decltype(vec_tag)::value;
      LaunchPdl(GatedActivationKernel<kVec, InT, std::remove_pointer_t<decltype(typed_out)>>,
                dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream, typed_gate, typed_up,
                typed_out, n, gelu);
    });
  });
}

}  // namespace ember::cuda
