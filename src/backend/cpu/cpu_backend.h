// The CPU backend: the reference implementation of backend.h (float32 arithmetic over
// f32/f16/bf16 weights read straight from the checkpoint mapping; optionally faster kernels for
// prefill-sized matrix products, CpuBackendOptions::matmul), AVX2+FMA+F16C kernels,
// spread over cores by its own thread pool (cpu/thread_pool.h). Matrix weights are never copied (UploadWeight keeps the pointer, which
// must outlive the backend); 1-D weights (norms, biases) are converted to small f32 copies.
// Every op computes each output row independently of the other rows of the batch, in a fixed
// order, so results are bitwise batch-invariant (unless `matmul` is not kExact). Not thread-safe: one driving thread.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace ember {

// The kernels of prefill-sized matrix products (more than 8 rows) of f32/f16/bf16 weights:
// kExact, the float32 reference chains (cpu/matmul.h); kF32, AVX-512 FMA register tiles
// (cpu/matmul_f32fast.h: float32 too, another summation order); kBf16, AVX512_BF16 dot products
// (cpu/matmul_bf16.h: x and W rounded to bf16, f32 sums). Decode-sized products, MXFP4 experts
// and MoE routers stay exact, so with kF32 or kBf16 a row's result depends on how many rows its
// step has (not batch-invariant).
enum class CpuMatmul { kExact, kF32, kBf16 };
const char* CpuMatmulName(CpuMatmul matmul);

struct CpuBackendOptions {
  int32_t num_threads = 0;  // 0: all cores
  // Prefill-sized matrix products' kernels; exact where the CPU lacks the one asked for.
  CpuMatmul matmul = CpuMatmul::kExact;
  // Steps of at least cpu::kDeltaChunkMinRows rows of one sequence run the gated delta rule
  // (recurrent layers) chunk-wise by matrix products (cpu/gated_delta.h, ~2x faster) instead of
  // row by row. The two agree to float rounding, not bitwise: a sequence's results then depend on
  // how its rows were split into steps (not batch-invariant), so it is off unless asked for.
  bool chunked_delta_rule = false;
  // Tests: the row counts DecodeGraphBuckets reports (ascending). The CPU captures no graphs, so
  // this only makes the engine pad its decode steps as it does for a GPU, where CI can run it.
  std::vector<int32_t> decode_graph_buckets;
  // Tests: false makes TakesQuantizedWeights false for every type, so loaders dequantize the
  // block-quantized matrices to f32 (the reference the quantized kernels are compared with).
  bool takes_quantized_weights = true;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options);

}  // namespace ember
