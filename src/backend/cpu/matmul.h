// CPU matmul kernels: out = x W^T (+ bias) with float32 x and float32/float16/bfloat16 W read
// straight from the checkpoint mapping. Weights are converted a tile at a time ([kMatmulColBlock
// rows, kMatmulKBlock]) into a small float32 panel reused by every x row, so prefill is
// compute-bound and decode streams each weight once. Batch-invariant: every output element is
// the same chain (8-lane FMA over k in order, fixed horizontal sum, scalar tail, bias) whatever
// the number of rows, so a row's result never depends on its batch-mates. Thread-safe (pure);
// parallel over output columns with OpenMP.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace ember::cpu {

// x [n, k] f32 (row stride k), w [m, k] of w_dtype, bias [m] f32 or null, out [n, m] f32.
void MatMul(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
            const float* bias, float* out, int32_t num_threads);

// Bias of a MatMul may also be stored as f16/bf16: converts `count` values to f32.
void ConvertToF32(const void* src, DType dtype, int64_t count, float* dst);

}  // namespace ember::cpu
