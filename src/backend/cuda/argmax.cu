// ArgmaxRows: the first index of each row's maximum (NaN never wins), the device half of greedy
// decoding: only the ids travel back to the host.
//
// Two shapes with the same answer (the rule fixes the index whatever the order of comparison):
//   - split (few rows, ArgmaxScratch given): a row's columns are cut into chunks of kChunkCols,
//     one block each, all of its loads issued at once; each block leaves its chunk's (max, index)
//     in the scratch and the last block of the row to count itself out (a device counter per
//     row, reset by that block) folds them. A batch-1 decode's 128k-column row takes 63 blocks
//     instead of one block striding through 0.5 MB.
//   - one block per row (many rows, or no scratch).
// Both are programmatic dependent launches (they wait for the logits with PdlWait).

#include <climits>
#include <string>

#include "backend/cuda/block_argmax.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kSplitThreads = 256;
constexpr int kChunkCols = 2048;  // per split block: 8 columns a thread
constexpr int kPerThread = kChunkCols / kSplitThreads;
static_assert(kPerThread % 4 == 0);

__global__ void __launch_bounds__(kThreads)
    ArgmaxRowsKernel(const float* __restrict__ x, int64_t cols, int32_t* __restrict__ ids) {
  PdlWait();
  float max;
  int index;
  BlockArgmax<kThreads>(x + static_cast<int64_t>(blockIdx.x) * cols, cols, &max, &index);
  if (threadIdx.x == 0) ids[blockIdx.x] = index;
}

// Block (chunk, row). kVec: cols % 4 == 0 and x 16-byte aligned (float4 loads).
template <bool kVec>
__global__ void __launch_bounds__(kSplitThreads)
    ArgmaxSplitKernel(const float* __restrict__ x, int64_t cols, ArgmaxScratch scratch,
                      int32_t* __restrict__ ids) {
  const int64_t row = blockIdx.y;
  const int chunks = static_cast<int>(gridDim.x);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunkCols;
  const float* xr = x + row * cols;
  PdlTrigger();
  PdlWait();
  // This thread's columns: kPerThread consecutive ones from begin + threadIdx.x * kPerThread.
  const int64_t c0 = begin + static_cast<int64_t>(threadIdx.x) * kPerThread;
  float v[kPerThread];
  if constexpr (kVec) {
#pragma unroll
    for (int u = 0; u < kPerThread / 4; ++u) {
      const int64_t c = c0 + 4 * u;
      const float4 f =
          c < cols ? *reinterpret_cast<const float4*>(xr + c) : make_float4(NAN, NAN, NAN, NAN);
      v[4 * u] = f.x;
      v[4 * u + 1] = f.y;
      v[4 * u + 2] = f.z;
      v[4 * u + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) v[u] = c0 + u < cols ? xr[c0 + u] : NAN;
  }
  float best = -INFINITY;
  int best_i = INT_MAX;
#pragma unroll
  for (int u = 0; u < kPerThread; ++u) {
    if (v[u] != v[u]) continue;  // NaN (and the columns past the row)
    if (best_i == INT_MAX || v[u] > best) {
      best = v[u];
      best_i = static_cast<int>(c0 + u);
    }
  }
  __shared__ float warp_max[kSplitThreads / 32];
  __shared__ int warp_index[kSplitThreads / 32];
  __shared__ bool last;
  BlockArgmaxFold<kSplitThreads>(best, best_i, warp_max, warp_index);
  if (threadIdx.x == 0) {
    scratch.max[row * chunks + blockIdx.x] = best;
    scratch.index[row * chunks + blockIdx.x] = best_i;
    __threadfence();  // the partial before the count
    last = atomicAdd(scratch.counters + row, 1u) == static_cast<unsigned>(chunks) - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other blocks' partials after their counts
  best = -INFINITY;
  best_i = INT_MAX;
  for (int j = threadIdx.x; j < chunks; j += kSplitThreads) {
    ArgmaxTake(__ldcg(scratch.max + row * chunks + j), __ldcg(scratch.index + row * chunks + j),
               best, best_i);
  }
  BlockArgmaxFold<kSplitThreads>(best, best_i, warp_max, warp_index);
  if (threadIdx.x == 0) {
    ids[row] = best_i == INT_MAX ? 0 : best_i;
    scratch.counters[row] = 0;  // ready for the next launch (stream-ordered after this one)
  }
}

// The split shape's blocks per row.
int32_t ArgmaxSplitChunks(int64_t cols) {
  return static_cast<int32_t>((cols + kChunkCols - 1) / kChunkCols);
}

}  // namespace

void LaunchArgmaxRows(const float* x, int64_t rows, int64_t cols, int32_t* ids,
                      const ArgmaxScratch* scratch, cudaStream_t stream) {
  if (rows == 0) return;
  CHECK_LE(cols, int64_t{INT_MAX});
  if (scratch != nullptr && rows <= scratch->max_rows && cols > kChunkCols &&
      ArgmaxSplitChunks(cols) <= scratch->max_chunks) {
    const dim3 grid(static_cast<unsigned>(ArgmaxSplitChunks(cols)), static_cast<unsigned>(rows));
    if (cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
      LaunchPdl(ArgmaxSplitKernel<true>, grid, dim3(kSplitThreads), 0, stream, x, cols, *scratch,
                ids);
    } else {
      LaunchPdl(ArgmaxSplitKernel<false>, grid, dim3(kSplitThreads), 0, stream, x, cols, *scratch,
                ids);
    }
    return;
  }
  LaunchPdl(ArgmaxRowsKernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, x, cols,
            ids);
}

#ifdef EMBER_CUDA_TRACE
#ifdef EMBER_TRACE_GEMV
void DumpGemvDetail(const char* path);  // gemv.cu
#endif
void DumpStepTrace(const char* path) {
  DumpTrace(path);
#ifdef EMBER_TRACE_GEMV
  DumpGemvDetail((std::string(path) + ".gemv").c_str());
#endif
}
#endif

}  // namespace ember::cuda
