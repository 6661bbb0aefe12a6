// Element-wise ops: add, soft-capping, bias add.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace ember::cuda {
namespace {

unsigned GridFor(int64_t n) {
  int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks > 65536 ? 65536 : blocks);
}

__global__ void AddKernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void SoftcapKernel(float* x, float cap, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

__global__ void AddBiasKernel(float* out, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] += bias[i % cols];
}

__global__ void SpinKernel(int64_t ns) {
  const int64_t start = clock64();
  // clock64 counts SM cycles; ~2 GHz on H200, so ns * 2 cycles is close enough for a stall.
  while (clock64() - start < 2 * ns) {
  }
}

}  // namespace

void LaunchSpin(int64_t ns, cudaStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(ns);
  CUDA_CHECK_LAUNCH();
}

void LaunchAdd(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  AddKernel<<<GridFor(n), 256, 0, stream>>>(a, b, out, n);
  CUDA_CHECK_LAUNCH();
}

void LaunchSoftcap(float* x, float cap, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  SoftcapKernel<<<GridFor(n), 256, 0, stream>>>(x, cap, n);
  CUDA_CHECK_LAUNCH();
}

void LaunchAddBias(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  AddBiasKernel<<<GridFor(rows * cols), 256, 0, stream>>>(out, bias, rows, cols);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
