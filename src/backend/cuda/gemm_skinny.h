// The skinny GEMM of batched decode: out[t, m] = sum_k x[t, k] W[m, k] for 1..256 rows of x
// (tokens) against a weight matrix that is streamed once from DRAM (Hopper wgmma fed by TMA; the
// weights are wgmma's M side, the tokens its N side, padded to 16/32/64/128/256). bf16 x and W
// (row-major, W's rows contiguous along k), f32 out (row stride ldo), f32 accumulation.
// Deterministic: the same inputs give the same bits run to run. A launch whose k is split across
// the CTAs of a thread-block cluster adds the splits' partial sums in split order through
// distributed shared memory, so no float atomics and no global workspace are used.
// Host functions may be called from any thread; a launch is stream-ordered and graph-capturable
// (no allocation, no synchronization; tensor maps are encoded once per (pointer, shape) and
// cached).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ember::cuda {

// True when the kernel takes this call: 1 <= tokens <= 256, m % 64 == 0, k % 64 == 0, x and w
// 16-byte aligned (the caller falls back to cuBLAS otherwise).
bool SkinnyGemmSupported(int64_t tokens, int64_t m, int64_t k, const void* x, const void* w);

// Whether the backend's MatMul takes this kernel instead of cublasGemmEx (both supported): where
// it measured faster, the GEMMs of at most 1,024 weight rows and 8 MB (a Llama layer's k and v).
bool SkinnyGemmPreferred(int64_t tokens, int64_t m, int64_t k);

// Sets the kernels' shared-memory limits and reads their occupancy (otherwise done at the first
// launch): call before capturing a graph that may launch the kernel.
void SkinnyGemmWarmUp();

// How a call is cut: tokens padded to `n`, `block_m` weight rows per CTA (64 or 128), k split
// over `split` CTAs of one cluster (1..8), `grid` CTAs (persistent over the row tiles when
// split == 1). A pure function of (tokens' padded size, m, k).
struct SkinnyGemmPlan {
  int n = 0;
  int block_m = 0;
  int split = 0;
  int grid = 0;
};
SkinnyGemmPlan PlanSkinnyGemm(int64_t tokens, int64_t m, int64_t k);

// out[t * ldo + m_idx] for t < tokens, m_idx < m; x: [tokens, k], w: [m, k], ldo >= m.
// Requires SkinnyGemmSupported.
void LaunchSkinnyGemm(const __nv_bfloat16* x, const __nv_bfloat16* w, float* out, int64_t ldo,
                      int64_t tokens, int64_t m, int64_t k, cudaStream_t stream);

// The same with an explicit plan (bench/skinny_gemm_bench sweeps them): plan.n >= tokens from
// {16, 32, 64, 128, 256}, block_m 64 or 128, split 1..min(8, k / 64); grid is recomputed.
void LaunchSkinnyGemmWithPlan(const __nv_bfloat16* x, const __nv_bfloat16* w, float* out,
                              int64_t ldo, int64_t tokens, int64_t m, int64_t k,
                              const SkinnyGemmPlan& plan, cudaStream_t stream);

}  // namespace ember::cuda
