// CUDA_CHECK / CUBLAS_CHECK: every CUDA runtime and cuBLAS call in the CUDA backend goes through
// one of these. A failure is a broken invariant at this layer (out of memory after sizing, an
// illegal address, a bad launch), so it aborts via CHECK with file:line and the error string.
// Errors a user can cause (no GPU, bad device index) are turned into Status before this point.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "util/check.h"

#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    cudaError_t _ember_err = (expr);                                                  \
    CHECK(_ember_err == cudaSuccess) << #expr << ": " << cudaGetErrorName(_ember_err) \
                                     << " (" << cudaGetErrorString(_ember_err) << ")"; \
  } while (0)

// After a kernel launch: catches bad launch configurations immediately (not async faults).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                     \
    cublasStatus_t _ember_st = (expr);                                                     \
    CHECK(_ember_st == CUBLAS_STATUS_SUCCESS) << #expr << ": " << cublasGetStatusName(_ember_st) \
                                              << " (" << cublasGetStatusString(_ember_st) << ")"; \
  } while (0)

namespace ember::cuda {

// The current device's SM count, read once per process (the backend uses one device).
inline int CurrentDeviceSmCount() {
  static const int sms = [] {
    int device = 0, count = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  return sms;
}

}  // namespace ember::cuda
