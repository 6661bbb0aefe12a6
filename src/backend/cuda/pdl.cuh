// Programmatic dependent launch (Hopper): a kernel launched with LaunchPdl may start while the
// previous kernel in the stream is still running, once every block of that kernel has called
// PdlTrigger (or exited). Before PdlWait() it may only read memory the previous kernels do not
// write (weights, the step's plan); PdlWait() returns once the previous kernel has completed and
// its writes are visible. Every PDL-launched kernel calls PdlWait() in every block that touches
// activations, so completion stays ordered through chains of such kernels. Both instructions are
// no-ops when the kernel was launched normally. Graph capture records the programmatic edges.
#pragma once

#include <cuda_runtime.h>

#ifdef EMBER_CUDA_TRACE
#include <algorithm>
#include <cstdio>
#include <vector>
#endif

#include <mutex>
#include <unordered_set>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace ember::cuda {

#ifdef EMBER_CUDA_TRACE
// The step timeline (a build with -DEMBER_CUDA_TRACE=ON only; no profiler needed): thread 0 of
// block 0 of every kernel stamps %globaltimer when its PdlWait returns, with its grid size, block
// size and dynamic shared memory. Kernel N's wait returns once kernel N - 1 has completed, so the
// gap between consecutive stamps is the time kernel N - 1 held the stream's critical path.
// Each translation unit keeps its own ring of stamps; DumpTrace (CudaBackend's destructor, when
// EMBER_CUDA_TRACE_OUT names a file) merges them by time.
struct TraceStampRecord {
  unsigned long long t;
  unsigned grid;
  unsigned block;
  unsigned smem;
  unsigned pad;
};
constexpr unsigned kTraceRing = 1u << 15;
using TraceReader = void (*)(std::vector<TraceStampRecord>&);
inline std::vector<TraceReader>& TraceReaders() {
  static std::vector<TraceReader> readers;
  return readers;
}
namespace {
__device__ TraceStampRecord g_trace[kTraceRing];
__device__ unsigned g_trace_next;
void ReadTrace(std::vector<TraceStampRecord>& out) {
  unsigned n = 0;
  if (cudaMemcpyFromSymbol(&n, g_trace_next, sizeof n) != cudaSuccess || n == 0) return;
  std::vector<TraceStampRecord> ring(kTraceRing);
  CUDA_CHECK(cudaMemcpyFromSymbol(ring.data(), g_trace, sizeof(TraceStampRecord) * kTraceRing));
  ring.resize(n < kTraceRing ? n : kTraceRing);
  out.insert(out.end(), ring.begin(), ring.end());
}
[[maybe_unused]] const bool g_trace_registered = (TraceReaders().push_back(&ReadTrace), true);
}  // namespace
__device__ unsigned g_trace_arrivals;
__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ void TraceStampNow() {
  const unsigned long long t = GlobalTimer();
  unsigned smem;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem));
  const unsigned i = atomicAdd(&g_trace_next, 1u) % kTraceRing;
  g_trace[i] = {t, gridDim.x * gridDim.y * gridDim.z, blockDim.x * blockDim.y * blockDim.z, smem,
                0u};
}
__device__ __forceinline__ void TraceStamp() {
  if ((blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) != 0) return;
  TraceStampNow();
}
// Called by one thread of every block: the grid's last block to arrive stamps (one counter per
// translation unit, so kernels calling it in one unit must not run their ends concurrently).
__device__ __forceinline__ void TraceStampLastBlock() {
  const unsigned n = gridDim.x * gridDim.y * gridDim.z;
  if (atomicAdd(&g_trace_arrivals, 1u) % n == n - 1) TraceStampNow();
}
// Writes every translation unit's stamps, sorted by time, one "t_ns grid block smem" line each
// (kernels.h's DumpStepTrace, for host code).
inline void DumpTrace(const char* path) {
  std::vector<TraceStampRecord> all;
  for (TraceReader r : TraceReaders()) r(all);
  std::sort(all.begin(), all.end(),
            [](const TraceStampRecord& a, const TraceStampRecord& b) { return a.t < b.t; });
  if (FILE* f = std::fopen(path, "w")) {
    for (const TraceStampRecord& r : all) {
      std::fprintf(f, "%llu %u %u %u\n", r.t, r.grid, r.block, r.smem);
    }
    std::fclose(f);
  }
}
#else
__device__ __forceinline__ void TraceStamp() {}
__device__ __forceinline__ void TraceStampLastBlock() {}
#endif

__device__ __forceinline__ void PdlWait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  TraceStamp();
}
__device__ __forceinline__ void PdlTrigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Every kernel prefers the largest shared-memory carveout: an SM whose L1 / shared split differs
// from what a kernel needs must drain before that kernel's block can be placed, so a ring GEMV
// (gemv.cu) needing ~100 KB could not start its copies beside the small kernel before it
// (docs/perf.md).
inline void PreferMaxShared(const void* kernel) {
  static std::mutex mu;
  static std::unordered_set<const void*> done;
  std::lock_guard<std::mutex> lock(mu);
  if (done.insert(kernel).second) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
  }
}

template <typename... KernelArgs, typename... Args>
void LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
               cudaStream_t stream, Args&&... args) {
  PreferMaxShared(reinterpret_cast<const void*>(kernel));
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace ember::cuda
