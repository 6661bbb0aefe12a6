// Programmatic dependent launch (Hopper): a kernel launched with LaunchPdl may start while the
// previous kernel in the stream is still running, once every block of that kernel has called
// PdlTrigger (or exited). Before PdlWait() it may only read memory the previous kernels do not
// write (weights, the step's plan); PdlWait() returns once the previous kernel has completed and
// its writes are visible. Every PDL-launched kernel calls PdlWait() in every block that touches
// activations, so completion stays ordered through chains of such kernels. Both instructions are
// no-ops when the kernel was launched normally. Graph capture records the programmatic edges.
// EMBER_CUDA_PDL=0 in the environment launches these kernels normally (A/B measurements).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace ember::cuda {

__device__ __forceinline__ void PdlWait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void PdlTrigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

inline bool PdlEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("EMBER_CUDA_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

template <typename... KernelArgs, typename... Args>
void LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
               cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = PdlEnabled() ? 1 : 0;
  config.attrs = attr;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace ember::cuda
