// Run-time access to the CUDA backend. The backend lives in a separate shared module,
// libember_cuda.so (built whenever nvcc is present), which is dlopen()ed on first use, so a CPU
// run never maps the CUDA runtime or cuBLAS (hundreds of MB of relocated library pages) and a
// binary built with CUDA still runs on machines without it. The module is looked for at
// $EMBER_CUDA_MODULE, next to the running executable, then at its build-tree location.
// Thread-safe (the load happens once, under a static initializer).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"  // CudaBackendOptions (the header needs no CUDA includes)
#include "util/status.h"

namespace ember {

// Number of usable CUDA devices (compute capability 9.0; others are named in a warning): 0
// without an NVIDIA driver (libcuda.so.1 not loadable), without
// the module, or when the runtime reports an error. Loads the module only when a driver exists.
int CudaDevicesAvailable();
// Whether an NVIDIA driver (libcuda.so.1) is present, usable device or not.
bool CudaDriverPresent();

// A CUDA backend on `device`; errors say why (module not found and where it was looked for,
// driver missing, no such device).
Result<std::unique_ptr<Backend>> LoadCudaBackend(int device, const CudaBackendOptions& options);

}  // namespace ember
