// The CPU backend: the reference implementation of backend.h (float32 arithmetic over
// f32/f16/bf16 weights read straight from the checkpoint mapping), AVX2+FMA+F16C kernels,
// spread over cores by its own thread pool (cpu/thread_pool.h). Matrix weights are never copied (UploadWeight keeps the pointer, which
// must outlive the backend); 1-D weights (norms, biases) are converted to small f32 copies.
// Every op computes each output row independently of the other rows of the batch, in a fixed
// order, so results are bitwise batch-invariant. Not thread-safe: one driving thread.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace ember {

struct CpuBackendOptions {
  int32_t num_threads = 0;  // 0: all cores
  // Tests: the row counts DecodeGraphBuckets reports (ascending). The CPU captures no graphs, so
  // this only makes the engine pad its decode steps as it does for a GPU, where CI can run it.
  std::vector<int32_t> decode_graph_buckets;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options);

}  // namespace ember
