// Backend::LoraDelta's kernels, BGMV-style: every row gathers its own adapter through its entry
// index (LoraDeltaArgs::row_entry, -1: no adapter), so one launch pair serves any mix of adapters
// and a decode graph captured once replays for every mix, and the outputs of one input
// (LoraDeltaGroup's parts: q/k/v, gate/up) share it. Both kernels take the rows in the order of
// LoraDeltaArgs::row_order (rows grouped by adapter), so the rows of one tile mostly share their
// adapter and each weight chunk's load. A shrink t[row, j] = x[row] . a[j] (a block per tile of
// kShrinkRows rows and rank index j, k split over its 256 threads in chunks of 8 elements,
// 16-byte loads) and an expand
// out[row] += t[row] b^T (a thread per output column and tile of kExpandRows rows, rank summed in
// chunks of 8). Each output element is summed in one fixed order that depends only on its row
// (batch-invariant), in float32; the vector and scalar loads sum alike.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/lora.h"
#include "backend/cuda/out_store.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

constexpr int kChunk = 8;  // elements per load step (16 bytes of bf16)
constexpr int kShrinkRows = 4;
constexpr int kShrinkThreads = 256;
constexpr int kShrinkWarps = kShrinkThreads / 32;
constexpr int kExpandRows = 8;
constexpr int kExpandThreads = 256;

// v[0, cnt) = p[c, c + cnt) widened to float (cnt <= kChunk); 16-byte loads when vec and the
// chunk is whole (the caller guarantees the alignment).
template <typename T>
__device__ __forceinline__ void LoadChunk(const T* p, int64_t c, int cnt, bool vec,
                                          float (&v)[kChunk]) {
  if (vec && cnt == kChunk) {
    if constexpr (std::is_same_v<T, float>) {
      const float4 lo = *reinterpret_cast<const float4*>(p + c);
      const float4 hi = *reinterpret_cast<const float4*>(p + c + 4);
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
      v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    } else {
      const uint4 u = *reinterpret_cast<const uint4*>(p + c);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(h[q]);
        v[2 * q] = f.x;
        v[2 * q + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int q = 0; q < kChunk; ++q) v[q] = q < cnt ? LoadVec<float>(p, c + q) : 0.0f;
  }
}

// L2 prefetch of p[c, c + kChunk) (weights, before PdlWait).
template <typename T>
__device__ __forceinline__ void PrefetchChunk(const T* p, int64_t c) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p + c));
}

// t[row, part * rank_cap + j] for the rows row_order[r0, r0 + kShrinkRows) and (part, rank index j)
// = blockIdx.y's: each thread sums its chunks (c = 8 * thread + 2048 * i) in order, then the warp
// butterfly, then the warps' sums in warp order.
template <typename XT, typename WT>
__global__ void __launch_bounds__(kShrinkThreads)
    LoraShrinkKernel(const int32_t* row_entry, const int32_t* row_order, const LoraEntry* entries,
                     int32_t num_slots, int32_t rank_cap, int32_t n, const XT* x, int64_t k,
                     bool vec, float* t, int32_t t_stride) {
  __shared__ float partial[kShrinkWarps][kShrinkRows];
  const int32_t r0 = static_cast<int32_t>(blockIdx.x) * kShrinkRows;
  const int32_t part = static_cast<int32_t>(blockIdx.y) / rank_cap;
  const int32_t j = static_cast<int32_t>(blockIdx.y) % rank_cap;
  const LoraEntry* part_entries = entries + int64_t{part} * num_slots;
  // The tables and weights were uploaded before the step's kernels: read before PdlWait.
  const WT* a[kShrinkRows];
  int32_t rows[kShrinkRows];
  bool any = false;
#pragma unroll
  for (int i = 0; i < kShrinkRows; ++i) {
    rows[i] = r0 + i < n ? row_order[r0 + i] : -1;
    const int32_t e = rows[i] >= 0 ? row_entry[rows[i]] : -1;
    a[i] = nullptr;
    if (e >= 0) {
      const LoraEntry en = part_entries[e];
      if (j < en.rank) a[i] = static_cast<const WT*>(en.a) + int64_t{j} * k;
    }
    any |= a[i] != nullptr;
    if (a[i] != nullptr && (i == 0 || a[i] != a[i - 1])) {
      for (int64_t c = int64_t{threadIdx.x} * kChunk; c < k; c += kShrinkThreads * kChunk)
        PrefetchChunk(a[i], c);
    }
  }
  PdlTrigger();
  PdlWait();         // every block, so that completion stays ordered through the chain (pdl.cuh)
  if (!any) return;  // the same for every thread of the block
  const int32_t t_col = part * rank_cap + j;
  float acc[kShrinkRows] = {};
  for (int64_t c = int64_t{threadIdx.x} * kChunk; c < k; c += kShrinkThreads * kChunk) {
    const int cnt = k - c < kChunk ? static_cast<int>(k - c) : kChunk;
    float w[kChunk];
    const WT* loaded = nullptr;
#pragma unroll
    for (int i = 0; i < kShrinkRows; ++i) {
      if (a[i] == nullptr) continue;
      if (a[i] != loaded) {
        LoadChunk(a[i], c, cnt, vec, w);
        loaded = a[i];
      }
      float xv[kChunk];
      LoadChunk(x + int64_t{rows[i]} * k, c, cnt, vec, xv);
#pragma unroll
      for (int q = 0; q < kChunk; ++q)
        if (q < cnt) acc[i] = fmaf(xv[q], w[q], acc[i]);
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int i = 0; i < kShrinkRows; ++i) {
    const float sum = WarpSum(acc[i]);
    if (lane == 0) partial[warp][i] = sum;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kShrinkRows; ++i) {
    if (threadIdx.x != static_cast<unsigned>(i) || a[i] == nullptr) continue;
    float sum = 0.0f;
    for (int w = 0; w < kShrinkWarps; ++w) sum += partial[w][i];
    t[int64_t{rows[i]} * t_stride + t_col] = sum;
  }
}

// The expand's column blocks: part p's are [block_end[p - 1], block_end[p]).
struct ExpandParts {
  void* out[kMaxLoraKernelParts];
  int64_t m[kMaxLoraKernelParts];
  int32_t block_end[kMaxLoraKernelParts];
  const float* base[kMaxLoraKernelParts];  // overwrite's base row per part (null: zeros)
  bool overwrite;
};

// out[row, col] += sum_j t[row, part * rank_cap + j] b[col, j] for the rows row_order[r0, r0 +
// kExpandRows) (blockIdx.y) and the columns of block blockIdx.x of its part, j in increasing
// order.
template <typename WT, typename OutT>
__global__ void __launch_bounds__(kExpandThreads)
    LoraExpandKernel(const int32_t* row_entry, const int32_t* row_order, const LoraEntry* entries,
                     int32_t num_slots, int32_t rank_cap, int32_t n, const float* t,
                     int32_t t_stride, ExpandParts parts, bool w_vec) {
  __shared__ float ts[kExpandRows][kMaxLoraKernelRank];
  const int32_t r0 = static_cast<int32_t>(blockIdx.y) * kExpandRows;
  int32_t part = 0;
  while (static_cast<int32_t>(blockIdx.x) >= parts.block_end[part]) ++part;
  const int32_t first_block = part == 0 ? 0 : parts.block_end[part - 1];
  const int64_t m = parts.m[part];
  OutT* out = static_cast<OutT*>(parts.out[part]);
  const LoraEntry* part_entries = entries + int64_t{part} * num_slots;
  const int64_t col = int64_t{static_cast<int32_t>(blockIdx.x) - first_block} * kExpandThreads +
                      threadIdx.x;
  const WT* b[kExpandRows];
  int32_t rank[kExpandRows], rows[kExpandRows];
  int32_t max_rank = 0;
#pragma unroll
  for (int i = 0; i < kExpandRows; ++i) {
    rows[i] = r0 + i < n ? row_order[r0 + i] : -1;
    const int32_t e = rows[i] >= 0 ? row_entry[rows[i]] : -1;
    b[i] = nullptr;
    rank[i] = 0;
    if (e >= 0) {
      const LoraEntry en = part_entries[e];
      b[i] = static_cast<const WT*>(en.b);
      rank[i] = en.rank;
      if (col < m && en.rank > 0 && (i == 0 || b[i] != b[i - 1]))
        PrefetchChunk(b[i], col * en.rank);
    }
    max_rank = max(max_rank, rank[i]);
  }
  PdlTrigger();
  PdlWait();  // every block (pdl.cuh)
  // The same for every thread of the block (overwrite writes every row, adapter or not).
  if (max_rank == 0 && !parts.overwrite) return;
#pragma unroll
  for (int i = 0; i < kExpandRows; ++i)
    for (int32_t j = threadIdx.x; j < rank[i]; j += kExpandThreads)
      ts[i][j] = t[int64_t{rows[i]} * t_stride + part * rank_cap + j];
  __syncthreads();
  if (col >= m) return;
  float acc[kExpandRows] = {};
  for (int32_t j0 = 0; j0 < max_rank; j0 += kChunk) {
    float w[kChunk];
    const WT* loaded = nullptr;
#pragma unroll
    for (int i = 0; i < kExpandRows; ++i) {
      if (j0 >= rank[i]) continue;
      const int cnt = min(kChunk, rank[i] - j0);
      const WT* row = b[i] + col * rank[i];
      if (row != loaded) {
        LoadChunk(row, j0, cnt, w_vec && rank[i] % kChunk == 0, w);
        loaded = row;
      }
#pragma unroll
      for (int q = 0; q < kChunk; ++q)
        if (q < cnt) acc[i] = fmaf(ts[i][j0 + q], w[q], acc[i]);
    }
  }
  if (parts.overwrite) {
    const float* base = part == 0 ? parts.base[0] : part == 1 ? parts.base[1] : parts.base[2];
    const float b0 = base != nullptr ? base[col] : 0.0f;
#pragma unroll
    for (int i = 0; i < kExpandRows; ++i)
      if (rows[i] >= 0) StoreVec<OutT, float>(out, int64_t{rows[i]} * m + col, b0 + acc[i]);
    return;
  }
  // out's rows read first, then written (a store that may alias the next row's load would make
  // each row wait out a round trip).
  float old[kExpandRows];
#pragma unroll
  for (int i = 0; i < kExpandRows; ++i)
    old[i] = rank[i] == 0 ? 0.0f : LoadVec<float>(out, int64_t{rows[i]} * m + col);
#pragma unroll
  for (int i = 0; i < kExpandRows; ++i)
    if (rank[i] != 0) StoreVec<OutT, float>(out, int64_t{rows[i]} * m + col, old[i] + acc[i]);
}

template <typename WT>
void LaunchTyped(const LoraDeltaArgs& a, cudaStream_t stream) {
  const int32_t t_stride = a.parts * a.rank_cap;
  const dim3 shrink_grid((a.n + kShrinkRows - 1) / kShrinkRows, t_stride);
  auto shrink = [&](auto* x) {
    using XT = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
    LaunchPdl(LoraShrinkKernel<XT, WT>, shrink_grid, dim3(kShrinkThreads), 0, stream, a.row_entry,
              a.row_order, a.entries, a.num_slots, a.rank_cap, a.n, x, a.k, a.x_vec, a.t, t_stride);
  };
  DispatchIn(a.x, a.x_bf16, shrink);
  ExpandParts parts = {};
  parts.overwrite = a.overwrite;
  int32_t blocks = 0;
  for (int p = 0; p < kMaxLoraKernelParts; ++p) {
    if (p < a.parts) {
      parts.out[p] = a.out[p];
      parts.m[p] = a.m[p];
      parts.base[p] = a.base[p];
      blocks += static_cast<int32_t>((a.m[p] + kExpandThreads - 1) / kExpandThreads);
    }
    parts.block_end[p] = blocks;
  }
  const dim3 expand_grid(static_cast<unsigned>(blocks), (a.n + kExpandRows - 1) / kExpandRows);
  if (a.out_bf16) {
    LaunchPdl(LoraExpandKernel<WT, __nv_bfloat16>, expand_grid, dim3(kExpandThreads), 0, stream,
              a.row_entry, a.row_order, a.entries, a.num_slots, a.rank_cap, a.n, a.t, t_stride,
              parts, a.w_vec);
  } else {
    LaunchPdl(LoraExpandKernel<WT, float>, expand_grid, dim3(kExpandThreads), 0, stream,
              a.row_entry, a.row_order, a.entries, a.num_slots, a.rank_cap, a.n, a.t, t_stride,
              parts, a.w_vec);
  }
}

// tb[p][row][j] = t[row][p][j] rounded to bf16 where the row's slot in part p owns column j
// (j / rank == part_rows[p][row]), else 0. A thread per 8 adjacent columns (16-byte stores).
__global__ void LoraStackMaskKernel(const float* __restrict__ t,
                                    const int32_t* __restrict__ part_rows, int32_t n, int32_t parts,
                                    int32_t width, int32_t rank, __nv_bfloat16* __restrict__ tb) {
  const int64_t groups = static_cast<int64_t>(parts) * n * (width / 8);
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const int32_t j = static_cast<int32_t>(g % (width / 8)) * 8;
  const int64_t pr = g / (width / 8);  // p * n + row
  const int32_t row = static_cast<int32_t>(pr % n), p = static_cast<int32_t>(pr / n);
  const int32_t slot = part_rows[pr];
  __align__(16) __nv_bfloat16 v[8];
  if (slot >= 0 && j / rank == slot) {  // rank % 8 == 0: the 8 columns share a slot
    const float* src = t + (static_cast<int64_t>(row) * parts + p) * width + j;
    const float4 lo = *reinterpret_cast<const float4*>(src);
    const float4 hi = *reinterpret_cast<const float4*>(src + 4);
    const float f[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    for (int i = 0; i < 8; ++i) v[i] = __float2bfloat16_rn(f[i]);
  } else {
    for (int i = 0; i < 8; ++i) v[i] = __float2bfloat16_rn(0.0f);
  }
  *reinterpret_cast<uint4*>(tb + pr * width + j) = *reinterpret_cast<const uint4*>(v);
}

}  // namespace

void LaunchLoraStackMask(const float* t, const int32_t* part_rows, int32_t n, int32_t parts,
                         int32_t width, int32_t rank, void* tb, cudaStream_t stream) {
  const int64_t groups = static_cast<int64_t>(parts) * n * (width / 8);
  if (groups == 0) return;
  constexpr int kThreads = 256;
  LoraStackMaskKernel<<<static_cast<unsigned>((groups + kThreads - 1) / kThreads), kThreads, 0,
                        stream>>>(t, part_rows, n, parts, width, rank,
                                  static_cast<__nv_bfloat16*>(tb));
  CUDA_CHECK(cudaGetLastError());
}

void LaunchLoraDelta(const LoraDeltaArgs& args, cudaStream_t stream) {
  if (args.n == 0 || args.rank_cap == 0) return;
  if (args.w_bf16)
    LaunchTyped<__nv_bfloat16>(args, stream);
  else
    LaunchTyped<float>(args, stream);
}

}  // namespace ember::cuda
