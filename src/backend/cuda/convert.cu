// Element type conversion (weights at upload; f32 activations -> bf16 GEMM operands).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace ember::cuda {
namespace {

__device__ __forceinline__ float LoadAsF32(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case ElemType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__global__ void ConvertKernel(const void* src, ElemType src_type, void* dst, ElemType dst_type,
                              int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = LoadAsF32(src, src_type, i);
    if (dst_type == ElemType::kBF16) {
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(v);
    } else if (dst_type == ElemType::kF16) {
      static_cast<__half*>(dst)[i] = __float2half_rn(v);
    } else {
      static_cast<float*>(dst)[i] = v;
    }
  }
}

}  // namespace

void LaunchConvert(const void* src, ElemType src_type, void* dst, ElemType dst_type, int64_t n,
                   cudaStream_t stream) {
  if (n == 0) return;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  ConvertKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, src_type, dst, dst_type, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
