// CPU matmul over block-quantized weights kept as they are in memory (DType::kQ8_0, kQ4_0: ggml's
// layouts, see backend.h): out = x W^T (+ bias), x float32 [n, k], k % 32 == 0. Two kernels:
//  - decode (n <= kQuantFewRows): fused dequantize + FMA in float32 (each weight block is widened
//    to floats in registers and multiplied with x's float32 values; weights streamed once);
//  - prefill (n > kQuantFewRows): x's rows are quantized per block of 32 to int8 (scale
//    max|x| / 127, round to nearest even, float32 scale) and each block's product is an exact
//    int32 dot (VPDPBUSD on AVX512_VNNI or AVX-VNNI, else AVX2 VPMADDUBSW/VPMADDWD), scaled by
//    the two blocks' scales into a float32 accumulator.
// Batch invariance: within each kernel a row's result is one fixed chain whatever n and the
// thread count (and, in the prefill kernel, whatever integer-dot ISA the CPU has: the int32 dots
// are exact, the float steps identical), so a row never depends on its batch-mates -- except
// that which kernel runs depends on n: the same row gives (slightly) different results in a
// decode-sized and a prefill-sized product. Pure apart from the pool (one caller at a time).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"

namespace ember::cpu {

constexpr int64_t kQuantBlock = 32;     // values per block (both types)
constexpr int64_t kQuantFewRows = 8;    // up to this many rows: the float32 decode kernel

// x [n, k] f32, w [m, k] of w_dtype (kQ8_0 / kQ4_0, rows of DTypeRowBytes(w_dtype, k) bytes),
// bias [m] f32 or null, out [n, m] f32. CHECKs k % 32 == 0.
void MatMulQuant(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
                 const float* bias, float* out, ThreadPool& pool);

// ggml's reference quantizers (round to nearest): Q8_0 d = max|x| / 127, q = round(x / d);
// Q4_0 d = m / -8 with m the value of largest magnitude (sign kept), q = min(15, trunc(x / d +
// 8.5)). The scale is stored as f16. `count` % 32 == 0; dst holds DTypeRowBytes(dtype, count).
void QuantizeRow(DType dtype, const float* src, int64_t count, void* dst);
// The values a quantized row stands for (q * d, (q - 8) * d) as float32.
void DequantizeQuantRow(DType dtype, const void* src, int64_t count, float* dst);

// The prefill kernel's integer dot on this CPU: "avx512vnni", "avxvnni" or "avx2".
const char* QuantDotIsaName();

// Tests and benchmarks: which kernel and integer dot to use (kAuto: by n, and the best ISA the
// CPU runs). Forcing an ISA the CPU lacks is a CHECK failure.
enum class QuantKernel { kAuto, kDecode, kPrefill };
enum class QuantIsa { kAuto, kAvx2, kAvxVnni, kAvx512Vnni };
void SetQuantKernelForTesting(QuantKernel kernel, QuantIsa isa);
bool CpuHasQuantIsa(QuantIsa isa);

}  // namespace ember::cpu
