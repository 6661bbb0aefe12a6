// Backend::LoraDelta's kernels: every segment of one call in two launches, a shrink
// t[rows, rank] = x[rows] A^T (BGMV-like: a block per rank index and tile of up to kShrinkRows
// rows, k strided over its threads) and an expand out[rows] += t[rows] B^T (a thread per output
// column and tile of up to kExpandRows rows, rank summed in order). The segments are read from a
// device array (LoraSegmentDesc), so a captured graph replays whatever the array holds; blocks
// past a segment's rows exit at once. Each output element is summed in one fixed order that
// depends only on its row (batch-invariant), in float32.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/lora.h"
#include "backend/cuda/out_store.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

constexpr int kShrinkRows = 4;
constexpr int kShrinkWarps = 8;
constexpr int kExpandRows = 8;
constexpr int kExpandThreads = 256;

template <typename T>
__device__ __forceinline__ float Load(const T* p, int64_t i) {
  return LoadVec<float>(p, i);
}

// t[row, j] = sum_k x[row, k] a[j, k] for rank index j = blockIdx.y and the rows
// [r0, r0 + kShrinkRows) of segment blockIdx.z: k strided over the block's threads, then the
// warps' sums added in warp order (a fixed order: batch-invariant).
template <typename XT, typename WT>
__global__ void __launch_bounds__(kShrinkWarps * 32)
    LoraShrinkKernel(const LoraSegmentDesc* segs, const XT* x, int64_t k, float* t,
                     int32_t t_stride) {
  __shared__ float partial[kShrinkWarps][kShrinkRows];
  const LoraSegmentDesc seg = segs[blockIdx.z];
  const int32_t r0 = static_cast<int32_t>(blockIdx.x) * kShrinkRows;
  const int32_t j = static_cast<int32_t>(blockIdx.y);
  if (r0 >= seg.rows || j >= seg.rank) return;
  const int32_t nrows = min(kShrinkRows, seg.rows - r0);
  const int64_t first = int64_t{seg.first_row} + r0;
  const WT* a_row = static_cast<const WT*>(seg.a) + int64_t{j} * k;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float acc[kShrinkRows] = {};
  for (int64_t c = threadIdx.x; c < k; c += kShrinkWarps * 32) {
    const float w = Load(a_row, c);
#pragma unroll
    for (int i = 0; i < kShrinkRows; ++i)
      if (i < nrows) acc[i] = fmaf(Load(x, (first + i) * k + c), w, acc[i]);
  }
#pragma unroll
  for (int i = 0; i < kShrinkRows; ++i) {
    const float sum = WarpSum(acc[i]);
    if (lane == 0) partial[warp][i] = sum;
  }
  __syncthreads();
  if (threadIdx.x < nrows) {
    float sum = 0.0f;
    for (int w = 0; w < kShrinkWarps; ++w) sum += partial[w][threadIdx.x];
    t[(first + threadIdx.x) * t_stride + j] = sum;
  }
}

// out[row, col] += sum_j t[row, j] b[col, j] for the rows [r0, r0 + kExpandRows) of segment
// blockIdx.z and the columns of block blockIdx.x.
template <typename WT, typename OutT>
__global__ void __launch_bounds__(kExpandThreads)
    LoraExpandKernel(const LoraSegmentDesc* segs, const float* t, int32_t t_stride, OutT* out,
                     int64_t m) {
  __shared__ float ts[kExpandRows][kMaxLoraKernelRank];
  const LoraSegmentDesc seg = segs[blockIdx.z];
  const int32_t r0 = static_cast<int32_t>(blockIdx.y) * kExpandRows;
  if (r0 >= seg.rows) return;
  const int32_t nrows = min(kExpandRows, seg.rows - r0);
  const int64_t first = int64_t{seg.first_row} + r0;
  for (int idx = threadIdx.x; idx < nrows * seg.rank; idx += kExpandThreads) {
    const int i = idx / seg.rank, j = idx % seg.rank;
    ts[i][j] = t[(first + i) * t_stride + j];
  }
  __syncthreads();
  const int64_t col = int64_t{blockIdx.x} * kExpandThreads + threadIdx.x;
  if (col >= m) return;
  const WT* b_row = static_cast<const WT*>(seg.b) + col * seg.rank;
  float acc[kExpandRows] = {};
  for (int32_t j = 0; j < seg.rank; ++j) {
    const float w = Load(b_row, j);
#pragma unroll
    for (int i = 0; i < kExpandRows; ++i)
      if (i < nrows) acc[i] = fmaf(ts[i][j], w, acc[i]);
  }
#pragma unroll
  for (int i = 0; i < kExpandRows; ++i) {
    if (i >= nrows) break;
    const int64_t e = (first + i) * m + col;
    StoreVec<OutT, float>(out, e, Load(out, e) + acc[i]);
  }
}

template <typename WT>
void LaunchTyped(const LoraDeltaArgs& a, cudaStream_t stream) {
  const dim3 shrink_grid((a.max_rows + kShrinkRows - 1) / kShrinkRows, a.max_rank,
                         a.num_segments);
  auto shrink = [&](auto* x) {
    using XT = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
    LoraShrinkKernel<XT, WT>
        <<<shrink_grid, kShrinkWarps * 32, 0, stream>>>(a.segments, x, a.k, a.t, a.max_rank);
  };
  DispatchIn(a.x, a.x_bf16, shrink);
  CUDA_CHECK_LAUNCH();
  const dim3 expand_grid(static_cast<unsigned>((a.m + kExpandThreads - 1) / kExpandThreads),
                         (a.max_rows + kExpandRows - 1) / kExpandRows, a.num_segments);
  if (a.out_bf16) {
    LoraExpandKernel<WT, __nv_bfloat16><<<expand_grid, kExpandThreads, 0, stream>>>(
        a.segments, a.t, a.max_rank, static_cast<__nv_bfloat16*>(a.out), a.m);
  } else {
    LoraExpandKernel<WT, float><<<expand_grid, kExpandThreads, 0, stream>>>(
        a.segments, a.t, a.max_rank, static_cast<float*>(a.out), a.m);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void LaunchLoraDelta(const LoraDeltaArgs& args, cudaStream_t stream) {
  if (args.num_segments == 0 || args.max_rows == 0) return;
  if (args.w_bf16)
    LaunchTyped<__nv_bfloat16>(args, stream);
  else
    LaunchTyped<float>(args, stream);
}

}  // namespace ember::cuda
