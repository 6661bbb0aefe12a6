// CPU matmul over ggml's k-quant weights kept as they are in memory (DType::kQ4_K, kQ5_K,
// kQ6_K): out = x W^T (+ bias), x float32 [n, k], k % 256 == 0. The layouts (one super-block of
// 256 values per 144 / 176 / 210 bytes, as ggml's block_q4_K / block_q5_K / block_q6_K):
//  - Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes
//    of nibbles (32-byte chunk c: element 64c + l in the low nibble of byte l, 64c + 32 + l in the
//    high one). Value (d * scale) * q - (dmin * min).
//  - Q5_K: as Q4_K with 32 bytes of fifth bits between the scales and the nibbles (element e's
//    at bit e / 32 of byte e % 32).
//  - Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales for sub-blocks of
//    16, f16 d last. Value (d * scale) * (q - 32).
// The kernel (float32 x, exact activations): each super-block of up to 4 weight rows is
// dequantized into a stack buffer (AVX2, the same float32 values as ggml's dequantization, bit
// for bit) and multiplied with up to 16 x rows by 8-lane FMAs, so weights are read from memory
// once per 16 x rows and never widened to a whole f32 matrix. For 1 or 2 x rows (decode) the
// stack buffer is skipped: each run of 8 values goes straight from the decode to its FMAs (the
// same values and chains, so the same results bit for bit).
// Batch invariance: a row's result is one fixed chain (per super-block two 8-lane FMA chains over
// its 256 values, summed and added to a running 8-lane sum; then a fixed horizontal sum; then
// the bias) whatever n and the thread count, so a row never depends on its batch-mates. Pure
// apart from the pool (one caller per pool at a time).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"

namespace ember::cpu {

constexpr int64_t kKQuantBlock = 256;  // values per super-block

// x [n, k] f32, w [m, k] of w_dtype (IsKQuant, rows of DTypeRowBytes(w_dtype, k) bytes), bias
// [m] f32 or null, out [n, m] f32. CHECKs k % 256 == 0.
void MatMulKQuant(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
                  const float* bias, float* out, ThreadPool& pool);

// The values of `count` (% 256 == 0) elements of a k-quant row as float32 (bit-exact with ggml).
void DequantizeKQuantRow(DType dtype, const void* src, int64_t count, float* dst);

}  // namespace ember::cpu
