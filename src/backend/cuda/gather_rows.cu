// GatherLogitsRows: copies the rows whose logits are sampled (one block per output row).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

__global__ void GatherRowsKernel(const float* x, int64_t d, const int32_t* rows, float* out) {
  const int64_t j = blockIdx.x;
  const int64_t src = static_cast<int64_t>(rows[j]) * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) out[j * d + c] = x[src + c];
}

}  // namespace

void LaunchGatherRows(const float* x, int64_t d, const PlanView& plan, float* out,
                      cudaStream_t stream) {
  if (plan.num_logits_rows == 0) return;
  PreferMaxShared(reinterpret_cast<const void*>(GatherRowsKernel));
  GatherRowsKernel<<<plan.num_logits_rows, 256, 0, stream>>>(x, d, plan.logits_rows, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
