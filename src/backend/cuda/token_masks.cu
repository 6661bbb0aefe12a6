// ApplyTokenMasks: the structured-output masks of the rows the device samples, as packed
// allowed-token bits (one word per 32 columns), applied in place after ApplyLogitEdits and
// before ArgmaxRows / SampleRows. Which columns a mask keeps is TokenMaskAllows and a dropped
// column becomes ApplyLogitEdit(x, kMask, 0) (both backend/logit_edit.h, shared with the CPU twin,
// backend/threshold_sampling.cc ApplyTokenMasksToRows), so the result is the same bits.

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/logit_edit.h"

namespace ember::cuda {
namespace {

constexpr int kThreads = 256;

// Block (x, y): columns [x * 256, x * 256 + 256) of mask y. A warp reads one word (a broadcast)
// and writes only its dropped columns, coalesced.
__global__ void TokenMasksKernel(float* __restrict__ x, int64_t cols,
                                 const int32_t* __restrict__ rows,
                                 const uint32_t* __restrict__ masks, int64_t words) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= cols) return;
  const uint32_t* bits = masks + static_cast<int64_t>(blockIdx.y) * words;
  if (TokenMaskAllows(bits, t)) return;
  float* p = x + static_cast<int64_t>(rows[blockIdx.y]) * cols + t;
  *p = ApplyLogitEdit(*p, LogitEditOp::kMask, 0.0f);
}

}  // namespace

void LaunchTokenMasks(float* x, int64_t cols, const int32_t* rows, const uint32_t* masks,
                      int32_t num_masks, cudaStream_t stream) {
  if (num_masks <= 0 || cols <= 0) return;
  CHECK_LE(num_masks, 65535) << "token masks: one grid row per mask";
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(num_masks));
  TokenMasksKernel<<<grid, kThreads, 0, stream>>>(x, cols, rows, masks, (cols + 31) / 32);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda
