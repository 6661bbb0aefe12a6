// CPU matmul kernels: out = x W^T (+ bias) with float32 x and float32/float16/bfloat16 (or packed
// MXFP4) W read straight from the checkpoint mapping. Decode-sized x (n <= 8) converts weights 8 at
// a time inside the kernel (F16C / bf16 shift, no transposes), so each weight is streamed once per
// step; prefill-sized x packs x rows once and converts a [64 columns, 512 k]
// weight slice into f32 panel tiles reused by every row (4x3 register tiles, operands in L1).
// Batch-invariant: every output element is the same chain (per 512-k chunk an 8-lane FMA over k
// in order and a fixed horizontal sum added to a running sum; then the scalar k tail; then the
// bias) whatever the number of rows, so a row's result never depends on its batch-mates nor on
// the thread count. Pure apart from the pool, which runs blocks of 64 output columns in parallel
// (one caller per pool at a time).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"

namespace ember::cpu {

// x [n, k] f32 (row stride k), w [m, k] of w_dtype, bias [m] f32 or null, out [n, m] f32.
void MatMul(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
            const float* bias, float* out, ThreadPool& pool);

// An MXFP4 weight matrix [m, k] (gpt-oss experts kept packed): per row, k / 2 bytes of FP4 E2M1
// pairs (low nibble first) and k / 32 E8M0 scale bytes (2^(scale - 127) per block of 32).
struct Mxfp4Matrix {
  const uint8_t* blocks;
  const uint8_t* scales;
};

// MatMul with MXFP4 weights (k % 32 == 0), converted as they load to E2M1 times 2^(scale - 127),
// which f32 and bf16 hold exactly: the same outputs, bit for bit, as MatMul over the matrix
// dequantized to bf16 (model/weight_convert's rule: ldexp, then bf16 RN).
void MatMulMxfp4(const float* x, int64_t n, int64_t k, const Mxfp4Matrix& w, int64_t m,
                 const float* bias, float* out, ThreadPool& pool);

// Bias of a MatMul may also be stored as f16/bf16: converts `count` values to f32.
void ConvertToF32(const void* src, DType dtype, int64_t count, float* dst);

}  // namespace ember::cpu
