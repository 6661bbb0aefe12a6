// Full-warp (32-lane) butterfly reductions shared by the CUDA kernels. Every lane of the warp
// must call them; every lane gets the result.
#pragma once

namespace ember::cuda {

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The warp's winning (value, index): the larger value, the lower index between equal values (a
// total order, so the butterfly's pairing does not change the winner).
__device__ __forceinline__ void WarpArgmax(float& value, int& index) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, value, o);
    const int oi = __shfl_xor_sync(0xffffffffu, index, o);
    if (ov > value || (ov == value && oi < index)) {
      value = ov;
      index = oi;
    }
  }
}

}  // namespace ember::cuda
