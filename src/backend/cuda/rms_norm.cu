// RMSNorm, optionally fused with the residual add: one block per row, f32 sum of squares. For few
// rows (decode) the block is as wide as the row (up to 1024 threads, float4 per thread when
// d % 4 == 0 and the rows are 16-byte aligned), so a row's loads are all in flight at once
// instead of a chain of strided iterations. From kRowsKernelMinRows rows (prefill) a 256-thread
// block emulates that block's reduction (RmsNormRowsKernel), so that 8 rows rather than 1 are in
// flight per SM, with the same bits (a faster prefill, docs/perf.md). The output is f32, or bf16 rounded RN from the
// same f32 values (a GEMM input: the bits a separate f32 -> bf16 conversion would give). The
// residual's delta is f32, or bf16 (a cuBLAS output, AllocMatMulOutput), widened exactly.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/out_store.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int64_t kRowsKernelMinRows = 64;  // RmsNormRowsKernel from this many rows

// The one-row kernel's block for a row of nv vectors: enough threads for <= 4 vectors each, a
// multiple of 32, at most 1,024; one vector per thread up to 1,024 vectors.
__host__ __device__ inline int64_t RmsNormThreads(int64_t nv) {
  if (nv <= kMaxThreads) return nv < 32 ? 32 : (nv + 31) / 32 * 32;
  const int64_t threads = ((nv + 3) / 4 + 31) / 32 * 32;
  return threads < kMaxThreads ? threads : kMaxThreads;
}

// The arithmetic both kernels share, with pinned rounding (no FMA contraction, which the compiler
// may apply differently in each kernel): a float4's sum of squares, and the scaled output.
__device__ __forceinline__ float SumSq4(const float4& v) {
  return __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(v.x, v.x), __fmul_rn(v.y, v.y)),
                             __fmul_rn(v.z, v.z)),
                   __fmul_rn(v.w, v.w));
}
__device__ __forceinline__ float InvRms(float sum_sq, int64_t d, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(sum_sq, static_cast<float>(d)), eps));
}
__device__ __forceinline__ float Scaled(float v, float inv_rms, float w, bool one_plus) {
  return __fmul_rn(v, __fmul_rn(inv_rms, one_plus ? __fadd_rn(1.f, w) : w));
}
__device__ __forceinline__ float4 Scaled(float4 v, float inv_rms, float4 w, bool one_plus) {
  return make_float4(Scaled(v.x, inv_rms, w.x, one_plus), Scaled(v.y, inv_rms, w.y, one_plus),
                     Scaled(v.z, inv_rms, w.z, one_plus), Scaled(v.w, inv_rms, w.w, one_plus));
}
// The residual add (one rounding per element either way).
__device__ __forceinline__ float Added(float a, float b) { return a + b; }
__device__ __forceinline__ float4 Added(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__device__ float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += scratch[w];
  return total;
}

// src: the row to normalise; when residual != null, src = residual += delta first.
// VEC: elements per thread access (4: float4, rows 16-byte aligned, d % 4 == 0). DeltaT, OutT:
// float or __nv_bfloat16. kPerThread: vectors kept in registers between the two passes, 1 when the
// block has a thread per vector (decode rows up to 4,096 wide): 30 registers instead of 57, so the
// block takes at most half an SM's register file and fits beside a ring GEMV block (gemv.cu).
// Alone this is neutral; with the key-split decode attention it makes decode faster
// (docs/perf.md).
template <int VEC, typename DeltaT, typename OutT, int kPerThread>
__global__ void __launch_bounds__(kMaxThreads, kPerThread == 1 ? 2 : 1)
    RmsNormKernel(const float* x, float* residual, const DeltaT* delta, const float* weight,
                  float eps, bool one_plus, int64_t d, OutT* out) {
  using Vec = typename std::conditional<VEC == 4, float4, float>::type;
  __shared__ float scratch[kMaxThreads / 32];
  const int64_t base = blockIdx.x * d;
  const int64_t nv = d / VEC;
  // The weights are no kernel's output: loaded while the previous kernel finishes.
  Vec wv[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c < nv) wv[i] = reinterpret_cast<const Vec*>(weight)[c];
  }
  // Dependents first (the ring GEMV after this kernel starts its weight copies while this one
  // waits; pdl.cuh), then the previous kernel's outputs, visible after PdlWait.
  PdlTrigger();
  PdlWait();
  Vec vals[kPerThread];
  float sum_sq = 0.f;
  const float* src = residual != nullptr ? residual : x;
  auto sq = [](const Vec& v) {
    if constexpr (VEC == 4) return SumSq4(v);
    else return __fmul_rn(v, v);
  };
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c >= nv) break;
    Vec v = reinterpret_cast<const Vec*>(src + base)[c];
    if (residual != nullptr) {
      v = Added(v, LoadVec<Vec>(delta + base, c));
      reinterpret_cast<Vec*>(residual + base)[c] = v;
    }
    vals[i] = v;
    sum_sq = __fadd_rn(sum_sq, sq(v));
  }
  // Rows wider than kPerThread * blockDim vectors (not used by the launcher) would need more.
  const float inv_rms = InvRms(BlockSum(sum_sq, scratch), d, eps);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c >= nv) break;
    StoreVec(out + base, c, Scaled(vals[i], inv_rms, wv[i], one_plus));
  }
}

// Many rows (prefill, >= kRowsKernelMinRows): a 256-thread block per row whose threads each stand
// for J threads of RmsNormKernel<4>'s block (RmsNormThreads(nv) of them, nv <= 1,024 vectors:
// one vector each), so more rows are in flight per SM: the one-row kernel's 1,024-thread blocks
// fit 2 per SM. Thread t, warp w is virtual thread t + 256 j of virtual warp w + 8 j; each
// virtual warp's butterfly and the sum over virtual warps in order are RmsNormKernel's, so the
// bits are the same (test RmsNormManyRowsEqualSolo). Every load of the row is issued before the
// first reduction; the weights (the same for every row, L1/L2 hits) are read after it.
constexpr int kRowsThreads = 256;
constexpr int kRowsWarps = kRowsThreads / 32;
template <int J, typename DeltaT, typename OutT>
__global__ void __launch_bounds__(kRowsThreads)
    RmsNormRowsKernel(const float* x, float* residual, const DeltaT* delta, const float* weight,
                      float eps, bool one_plus, int64_t d, OutT* out) {
  __shared__ float scratch[kMaxThreads / 32];
  const int64_t nv = d / 4;
  const int virt = static_cast<int>(RmsNormThreads(nv));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t base = blockIdx.x * d;
  const float4* src = reinterpret_cast<const float4*>((residual != nullptr ? residual : x) + base);
  // Dependents first (the ring GEMV after this kernel starts its weight copies while this one
  // waits; pdl.cuh), then the previous kernel's outputs, visible after PdlWait.
  PdlTrigger();
  PdlWait();
  float4 v[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int c = threadIdx.x + j * kRowsThreads;
    if (c < nv) v[j] = src[c];
  }
  if (residual != nullptr) {
    float4* res = reinterpret_cast<float4*>(residual + base);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = threadIdx.x + j * kRowsThreads;
      if (c < nv) {
        v[j] = Added(v[j], LoadVec<float4>(delta + base, c));
        res[c] = v[j];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int c = threadIdx.x + j * kRowsThreads;
    const int virt_warp = warp + kRowsWarps * j;
    if (virt_warp >= virt / 32) break;  // warp-uniform: past the emulated block
    float sum_sq = 0.f;
    if (c < nv) sum_sq = __fadd_rn(sum_sq, SumSq4(v[j]));
    sum_sq = WarpSum(sum_sq);
    if (lane == 0) scratch[virt_warp] = sum_sq;
  }
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < virt / 32; ++w) total += scratch[w];
  const float inv_rms = InvRms(total, d, eps);
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int c = threadIdx.x + j * kRowsThreads;
    if (c >= nv) break;
    StoreVec(out + base, c,
             Scaled(v[j], inv_rms, reinterpret_cast<const float4*>(weight)[c], one_plus));
  }
}

template <typename DeltaT>
void LaunchRmsNormOf(const float* x, float* residual, const DeltaT* delta, const float* weight,
                     float eps, bool one_plus_weight, int64_t rows, int64_t d, void* out,
                     bool out_bf16, cudaStream_t stream) {
  if (rows == 0) return;
  CHECK_LE(d, 4 * 4 * kMaxThreads) << "RMSNorm row width";
  const bool vec4 = d % 4 == 0 && Aligned16(x) && Aligned16(residual) && Aligned16(delta) &&
                    Aligned16(weight) && Aligned16(out);
  const int64_t nv = vec4 ? d / 4 : d;
  const int64_t threads = RmsNormThreads(nv);
  CHECK_LE(nv, 4 * threads);
  const dim3 grid(static_cast<unsigned>(rows)), block(static_cast<unsigned>(threads));
  if (vec4 && nv <= kMaxThreads && rows >= kRowsKernelMinRows) {
    const int j = static_cast<int>((threads + kRowsThreads - 1) / kRowsThreads);
    DispatchOut(out, out_bf16, vec4, [&](auto, auto* typed_out) {
      using OutT = std::remove_pointer_t<decltype(typed_out)>;
      auto kernel = j == 1   ? RmsNormRowsKernel<1, DeltaT, OutT>
                    : j == 2 ? RmsNormRowsKernel<2, DeltaT, OutT>
                    : j == 3 ? RmsNormRowsKernel<3, DeltaT, OutT>
                             : RmsNormRowsKernel<4, DeltaT, OutT>;
      LaunchPdl(kernel, grid, dim3(kRowsThreads), 0, stream, x, residual, delta, weight, eps,
                one_plus_weight, d, typed_out);
    });
    return;
  }
  const bool one = nv <= threads;
  DispatchOut(out, out_bf16, vec4, [&](auto vec_tag, auto* typed_out) {
    constexpr int kVec = decltype(vec_tag)::value;
    using OutT = std::remove_pointer_t<decltype(typed_out)>;
    LaunchPdl(one ? RmsNormKernel<kVec, DeltaT, OutT, 1> : RmsNormKernel<kVec, DeltaT, OutT, 4>,
              grid, block, 0, stream, x, residual, delta, weight, eps, one_plus_weight, d,
              typed_out);
  });
}

}  // namespace

void LaunchRmsNorm(const float* x, float* residual, const void* delta, bool delta_bf16,
                   const float* weight, float eps, bool one_plus_weight, int64_t rows, int64_t d,
                   void* out, bool out_bf16, cudaStream_t stream) {
  DispatchIn(delta, delta_bf16, [&](auto* typed_delta) {
    LaunchRmsNormOf(x, residual, typed_delta, weight, eps, one_plus_weight, rows, d, out, out_bf16,
                    stream);
  });
}

}  // namespace ember::cuda
