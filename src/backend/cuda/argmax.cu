// ArgmaxRows: one block per row finds the first index of the row's maximum (NaN never wins),
// the device half of greedy decoding: only the ids travel back to the host.

#include "backend/cuda/block_argmax.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

constexpr int kThreads = 512;

__global__ void ArgmaxRowsKernel(const float* __restrict__ x, int64_t cols,
                                 int32_t* __restrict__ ids) {
  float max;
  int index;
  BlockArgmax<kThreads>(x + static_cast<int64_t>(blockIdx.x) * cols, cols, &max, &index);
  if (threadIdx.x == 0) ids[blockIdx.x] = index;
}

}  // namespace

void LaunchArgmaxRows(const float* x, int64_t rows, int64_t cols, int32_t* ids,
                      cudaStream_t stream) {
  if (rows == 0) return;
  PreferMaxShared(reinterpret_cast<const void*>(ArgmaxRowsKernel));
  ArgmaxRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, ids);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda
