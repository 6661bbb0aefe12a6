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

}  // namespace ember::cuda
