// Skinny MatMul for decode (n <= 8 rows): out[n, m] = x[n, k] W[m, k]^T (+ bias), bf16 W read
// once with 16-byte loads, f32 x, f32 accumulation; one warp per output column m. Memory-bound:
// the aim is W at full bandwidth. Each output element's summation order depends only on k (not
// on n), so rows are batch-invariant within this path.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <int N>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    GemvBf16Kernel(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                   const float* __restrict__ bias, float* __restrict__ out, int64_t m,
                   int64_t k) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (col >= m) return;
  const __nv_bfloat16* w_row = w + col * k;
  float acc[N];
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = 0.f;
#pragma unroll 4
  for (int64_t c = lane * 8; c < k; c += 32 * 8) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w_row + c));
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
    float wf[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(pairs[i]);
      wf[2 * i] = f.x;
      wf[2 * i + 1] = f.y;
    }
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float4 x0 = *reinterpret_cast<const float4*>(x + j * k + c);
      const float4 x1 = *reinterpret_cast<const float4*>(x + j * k + c + 4);
      acc[j] += wf[0] * x0.x + wf[1] * x0.y + wf[2] * x0.z + wf[3] * x0.w + wf[4] * x1.x +
                wf[5] * x1.y + wf[6] * x1.z + wf[7] * x1.w;
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float v = WarpSum(acc[j]);
    if (lane == 0) out[j * m + col] = v + (bias != nullptr ? bias[col] : 0.f);
  }
}

template <int N>
void Launch(const float* x, const void* w, const float* bias, float* out, int64_t m, int64_t k,
            cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((m + kWarpsPerBlock - 1) / kWarpsPerBlock);
  GemvBf16Kernel<N><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
      x, static_cast<const __nv_bfloat16*>(w), bias, out, m, k);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool GemvBf16Supported(const void* x, const void* w, int64_t n, int64_t k) {
  return n >= 1 && n <= kGemvMaxRows && k % 8 == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0 &&
         (reinterpret_cast<uintptr_t>(w) % 16) == 0;
}

void LaunchGemvBf16(const float* x, const void* w, const float* bias, float* out, int64_t n,
                    int64_t m, int64_t k, cudaStream_t stream) {
  switch (n) {
    case 1: return Launch<1>(x, w, bias, out, m, k, stream);
    case 2: return Launch<2>(x, w, bias, out, m, k, stream);
    case 3: return Launch<3>(x, w, bias, out, m, k, stream);
    case 4: return Launch<4>(x, w, bias, out, m, k, stream);
    case 5: return Launch<5>(x, w, bias, out, m, k, stream);
    case 6: return Launch<6>(x, w, bias, out, m, k, stream);
    case 7: return Launch<7>(x, w, bias, out, m, k, stream);
    case 8: return Launch<8>(x, w, bias, out, m, k, stream);
    default: CHECK(false) << "GEMV with " << n << " rows";
  }
}

}  // namespace ember::cuda
