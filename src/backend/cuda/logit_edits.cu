// ApplyLogitEdits: the logits processors (logit_bias, penalties, min_tokens mask) of the rows
// the device samples, as a sparse edit list (backend/logit_edit.h) applied in place before
// ArgmaxRows / SampleRows. The float operation is ApplyLogitEdit itself (shared with the CPU twin,
// backend/threshold_sampling.cc ApplyLogitEditsToRows), so the result is the same bits.

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/logit_edit.h"

namespace ember::cuda {
namespace {

constexpr int kThreads = 256;

__device__ bool SameElement(const LogitEdit& a, const LogitEdit& b) {
  return a.row == b.row && a.token == b.token;
}

// Thread i owns edit i when it starts a run (its predecessor edits another element) and applies
// the whole run; a run is usually one edit (a bias entry plus a penalty makes two or three).
__global__ void LogitEditsKernel(float* __restrict__ x, int64_t cols,
                                 const LogitEdit* __restrict__ edits, int32_t num_edits) {
  const int32_t i = static_cast<int32_t>(blockIdx.x) * kThreads + static_cast<int32_t>(threadIdx.x);
  if (i >= num_edits) return;
  const LogitEdit first = edits[i];
  if (i > 0 && SameElement(edits[i - 1], first)) return;
  float* p = x + static_cast<int64_t>(first.row) * cols + first.token;
  float v = ApplyLogitEdit(*p, first.op, first.value);
  for (int32_t j = i + 1; j < num_edits; ++j) {
    const LogitEdit e = edits[j];
    if (!SameElement(e, first)) break;
    v = ApplyLogitEdit(v, e.op, e.value);
  }
  *p = v;
}

}  // namespace

void LaunchLogitEdits(float* x, int64_t cols, const LogitEdit* edits, int32_t num_edits,
                      cudaStream_t stream) {
  if (num_edits <= 0) return;
  const unsigned blocks = static_cast<unsigned>((num_edits + kThreads - 1) / kThreads);
  LogitEditsKernel<<<blocks, kThreads, 0, stream>>>(x, cols, edits, num_edits);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda
