// Kernels whose output is f32 or bf16 (a GEMM input, AllocMatMulInput): one store helper that
// rounds RN from the f32 value (the bits an f32 -> bf16 conversion gives), and the launcher-side
// dispatch over (output type, float4 or scalar access). Likewise for inputs that are f32 or bf16
// (a GEMM output, AllocMatMulOutput): a load helper that widens exactly, and its dispatch.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

namespace ember::cuda {

// Stores Vec (float4 or float) at element c * (4 or 1) of `out`, an f32 or bf16 buffer.
template <typename OutT, typename Vec>
__device__ __forceinline__ void StoreVec(OutT* out, int64_t c, const Vec& v) {
  if constexpr (std::is_same_v<OutT, float>) {
    reinterpret_cast<Vec*>(out)[c] = v;
  } else if constexpr (std::is_same_v<Vec, float4>) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    reinterpret_cast<uint2*>(out)[c] = packed;
  } else {
    out[c] = __float2bfloat16_rn(v);
  }
}

// Loads element c * (4 or 1) of `in`, an f32 or bf16 buffer, as Vec (float4 or float).
template <typename Vec, typename InT>
__device__ __forceinline__ Vec LoadVec(const InT* in, int64_t c) {
  if constexpr (std::is_same_v<InT, float>) {
    return reinterpret_cast<const Vec*>(in)[c];
  } else if constexpr (std::is_same_v<Vec, float4>) {
    const uint2 packed = reinterpret_cast<const uint2*>(in)[c];
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  } else {
    return __bfloat162float(in[c]);
  }
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls launch(typed_in): `in` as const __nv_bfloat16* (in_bf16) or const float*.
template <typename Launch>
void DispatchIn(const void* in, bool in_bf16, Launch&& launch) {
  if (in_bf16)
    launch(static_cast<const __nv_bfloat16*>(in));
  else
    launch(static_cast<const float*>(in));
}

// Calls launch(vec, typed_out): vec an std::integral_constant<int, 4 or 1>, typed_out `out` as
// __nv_bfloat16* (out_bf16) or float*.
template <typename Launch>
void DispatchOut(void* out, bool out_bf16, bool vec4, Launch&& launch) {
  auto by_access = [&](auto* typed_out) {
    if (vec4) launch(std::integral_constant<int, 4>{}, typed_out);
    else launch(std::integral_constant<int, 1>{}, typed_out);
  };
  if (out_bf16) by_access(static_cast<__nv_bfloat16*>(out));
  else by_access(static_cast<float*>(out));
}

}  // namespace ember::cuda
