// RMSNorm, optionally fused with the residual add: one block per row, f32 sum of squares. The
// block is as wide as the row (up to 1024 threads, float4 per thread when d % 4 == 0 and the
// rows are 16-byte aligned), so a decode row's loads are all in flight at once instead of a
// chain of strided iterations. The output is f32, or bf16 rounded RN from the same f32 values (a
// GEMM input: the bits a separate f32 -> bf16 conversion would give).
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/out_store.cuh"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

constexpr int kMaxThreads = 1024;

__device__ float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += scratch[w];
  return total;
}

// src: the row to normalise; when residual != null, src = residual += delta first.
// VEC: elements per thread access (4: float4, rows 16-byte aligned, d % 4 == 0). OutT: float or
// __nv_bfloat16.
template <int VEC, typename OutT>
__global__ void __launch_bounds__(kMaxThreads)
    RmsNormKernel(const float* x, float* residual, const float* delta, const float* weight,
                  float eps, bool one_plus, int64_t d, OutT* out) {
  using Vec = typename std::conditional<VEC == 4, float4, float>::type;
  __shared__ float scratch[kMaxThreads / 32];
  const int64_t base = blockIdx.x * d;
  const int64_t nv = d / VEC;
  constexpr int kPerThread = 4;  // vectors kept in registers between the two passes
  // The weights are no kernel's output: loaded while the previous kernel finishes.
  Vec wv[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c < nv) wv[i] = reinterpret_cast<const Vec*>(weight)[c];
  }
  PdlWait();  // launched with LaunchPdl: the previous kernel's outputs are visible after this
  PdlTrigger();
  Vec vals[kPerThread];
  float sum_sq = 0.f;
  const float* src = residual != nullptr ? residual : x;
  auto sq = [](const Vec& v) {
    if constexpr (VEC == 4) return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    else return v * v;
  };
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c >= nv) break;
    Vec v = reinterpret_cast<const Vec*>(src + base)[c];
    if (residual != nullptr) {
      const Vec dv = reinterpret_cast<const Vec*>(delta + base)[c];
      if constexpr (VEC == 4) {
        v.x += dv.x; v.y += dv.y; v.z += dv.z; v.w += dv.w;
      } else {
        v += dv;
      }
      reinterpret_cast<Vec*>(residual + base)[c] = v;
    }
    vals[i] = v;
    sum_sq += sq(v);
  }
  // Rows wider than kPerThread * blockDim vectors (not used by the launcher) would need more.
  const float inv_rms = rsqrtf(BlockSum(sum_sq, scratch) / static_cast<float>(d) + eps);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c >= nv) break;
    const Vec w = wv[i];
    Vec v = vals[i];
    if constexpr (VEC == 4) {
      v.x *= inv_rms * (one_plus ? 1.f + w.x : w.x);
      v.y *= inv_rms * (one_plus ? 1.f + w.y : w.y);
      v.z *= inv_rms * (one_plus ? 1.f + w.z : w.z);
      v.w *= inv_rms * (one_plus ? 1.f + w.w : w.w);
    } else {
      v *= inv_rms * (one_plus ? 1.f + w : w);
    }
    StoreVec(out + base, c, v);
  }
}

}  // namespace

void LaunchRmsNorm(const float* x, float* residual, const float* delta, const float* weight,
                   float eps, bool one_plus_weight, int64_t rows, int64_t d, void* out,
                   bool out_bf16, cudaStream_t stream) {
  if (rows == 0) return;
  CHECK_LE(d, 4 * 4 * kMaxThreads) << "RMSNorm row width";
  const bool vec4 = d % 4 == 0 && Aligned16(x) && Aligned16(residual) && Aligned16(delta) &&
                    Aligned16(weight) && Aligned16(out);
  const int64_t nv = vec4 ? d / 4 : d;
  // Enough threads for <= 4 vectors each, a multiple of 32, at most 1024.
  int64_t threads = (nv + 3) / 4;
  threads = std::max<int64_t>(32, std::min<int64_t>(kMaxThreads, (threads + 31) / 32 * 32));
  if (nv <= kMaxThreads) threads = std::max<int64_t>(32, (nv + 31) / 32 * 32);
  CHECK_LE(nv, 4 * threads);
  const dim3 grid(static_cast<unsigned>(rows)), block(static_cast<unsigned>(threads));
  DispatchOut(out, out_bf16, vec4, [&](auto vec_tag, auto* typed_out) {
    constexpr int kVec = decltype(vec_tag)::value;
    LaunchPdl(RmsNormKernel<kVec, std::remove_pointer_t<decltype(typed_out)>>, grid, block, 0,
              stream, x, residual, delta, weight, eps, one_plus_weight, d, typed_out);
  });
}

}  // namespace ember::cuda
