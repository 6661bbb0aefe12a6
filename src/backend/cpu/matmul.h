// CPU matmul kernels: out = x W^T (+ bias) with float32 x and float32/float16/bfloat16 W read
// straight from the checkpoint mapping. Decode-sized x (n <= 8) converts weights 8 at a time
// inside the kernel (F16C / bf16 shift, no transposes), so each weight is streamed once per step;
// prefill-sized x converts a [64 rows, 1024] weight slice once into an f32 panel reused by every
// row (4x3 register tiles). Batch-invariant: every output element is the same chain (8-lane FMA
// over k in order, fixed horizontal sum, scalar k tail, bias) whatever the number of rows, so a
// row's result never depends on its batch-mates. Thread-safe (pure); parallel over output
// columns with OpenMP.
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
