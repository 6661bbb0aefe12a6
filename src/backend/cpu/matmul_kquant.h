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
// The int8-x kernel (MatMulQuant's default for the k-quants, matmul_kquant_int8.inc): x's rows
// quantized per super-block of 256 to int8 (scale max|x| / 127, round to nearest even) with int16
// sums per run of 16; per super-block, row and column one exact int32 sum (quants times x by
// VPMADDUBSW, times the sub-block scales by a 16-bit multiply-add; Q4_K/Q5_K's mins through the
// x sums, Q6_K's -32 offset likewise), then one or two float FMAs into 8 lanes. Chosen ISA at run
// time (AVX2, AVX-VNNI, AVX512_VNNI: bitwise equal results). Within max|x_sb| / 254 per
// element of the float32-x kernel's product.
// Batch invariance (both kernels): a row's result is one fixed chain (per super-block two 8-lane FMA chains over
// its 256 values, summed and added to a running 8-lane sum; then a fixed horizontal sum; then
// the bias) whatever n and the thread count, so a row never depends on its batch-mates. Pure
// apart from the pool (one caller per pool at a time).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/matmul_quant.h"
#include "backend/cpu/thread_pool.h"

namespace ember::cpu {

constexpr int64_t kKQuantBlock = 256;  // values per super-block

// x [n, k] f32, w [m, k] of w_dtype (IsKQuant, rows of DTypeRowBytes(w_dtype, k) bytes), bias
// [m] f32 or null, out [n, m] f32. CHECKs k % 256 == 0.
void MatMulKQuant(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
                  const float* bias, float* out, ThreadPool& pool);

// x quantized for the int8-x kernel: q [n, k] int8, d [n, k / 256] scales, sums [n, k / 16] (the
// sum of each run of 16 q values).
struct KQuantInt8X {
  const int8_t* q;
  const float* d;
  const int16_t* sums;
};

// The int8-x kernel for output columns [0, cols) of every x row: w points at the first column's
// row, out at [0, 0] of an [n, m] output, bias (or null) at the first column's.
using KQuantInt8Fn = void (*)(const KQuantInt8X& x, int64_t n, int64_t k, const uint8_t* w,
                              DType w_dtype, size_t row_bytes, int64_t cols, const float* bias,
                              float* out, int64_t m);
KQuantInt8Fn KQuantInt8Kernel(QuantIsa isa);  // isa: not kAuto

// The values of `count` (% 256 == 0) elements of a k-quant row as float32 (bit-exact with ggml).
void DequantizeKQuantRow(DType dtype, const void* src, int64_t count, float* dst);

}  // namespace ember::cpu
