// CPU matmul over block-quantized weights kept as they are in memory (DType::kQ8_0, kQ4_0: ggml's
// layouts, see backend.h): out = x W^T (+ bias), x float32 [n, k], k % 32 == 0. The k-quants
// (kQ4_K, kQ5_K, kQ6_K, k % 256 == 0) run matmul_kquant.h's kernels: with int8 x (the default)
// x is quantized here per super-block of 256 (with int16 sums per run of 16) and handed to
// KQuantInt8Kernel; with QuantKernel::kFloatX to MatMulKQuant. Two kernels for Q8_0 / Q4_0:
//  - int8 x (the default, every n): x's rows are quantized per block of 32 to int8 (scale
//    max|x| / 127, round to nearest even, float32 scale, as ggml's Q8_0 activations) and each
//    block's product is an exact int32 dot (VPDPBUSD on AVX512_VNNI -- two blocks per 512-bit
//    dot -- or AVX-VNNI, else AVX2 VPMADDUBSW/VPMADDWD, chosen at run time; the weights are the
//    unsigned operand, x's offset taken back by per-row starting values), scaled by the two
//    blocks' scales into two float32 accumulators (even and odd blocks). Faster than the float
//    kernel at every n, decode included (see bench/quant_matmul_bench.cc). On AVX512_VNNI x's
//    per-row values (starting values; for n > 2 each block pair's dx broadcast) are made once
//    per call (scratch: up to 3 n k bytes plus the scales) and each prefill work item unpacks
//    its 64 columns' block pairs once (2 * 64 * k bytes per thread); decode (n <= 2) runs
//    streaming tiles that prefetch the weights 2 KB ahead. Bits are the same on every path.
//  - float32 x (QuantKernel::kFloatX, the exact-activation mode): each weight block is widened to
//    floats in registers (fused dequantize + FMA) and multiplied with x's float32 values, rows in
//    groups of up to 8 (weights streamed once per group).
// Batch invariance: in either kernel a row's result is one fixed chain whatever n, the thread
// count and (int8 x) the integer-dot ISA -- the int32 dots are exact and the float steps
// identical -- so a row never depends on its batch-mates. The two kernels differ from each other
// (int8 x is within max|x_b| / 254 per element of float32 x). Pure apart from the pool and the
// process-wide kernel choice (one MatMulQuant caller at a time).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"

namespace ember::cpu {

constexpr int64_t kQuantBlock = 32;     // values per block (both types)
constexpr int64_t kFloatXRows = 8;      // the float32-x kernel's row group

// x [n, k] f32, w [m, k] of w_dtype (IsBlockQuantized, rows of DTypeRowBytes(w_dtype, k) bytes),
// bias [m] f32 or null, out [n, m] f32. CHECKs k % 32 == 0 (k-quants: % 256, MatMulKQuant).
void MatMulQuant(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
                 const float* bias, float* out, ThreadPool& pool);

// ggml's reference quantizers (round to nearest): Q8_0 d = max|x| / 127, q = round(x / d);
// Q4_0 d = m / -8 with m the value of largest magnitude (sign kept), q = min(15, trunc(x / d +
// 8.5)). The scale is stored as f16. `count` % 32 == 0; dst holds DTypeRowBytes(dtype, count).
// The k-quants (`count` % 256 == 0) go to ggml's k-quant reference quantizers (kquant_quantize.h).
void QuantizeRow(DType dtype, const float* src, int64_t count, void* dst);
// The values a quantized row stands for (q * d, (q - 8) * d; k-quants: DequantizeKQuantRow).
void DequantizeQuantRow(DType dtype, const void* src, int64_t count, float* dst);

// The prefill kernel's integer dot on this CPU: "avx512vnni", "avxvnni" or "avx2".
const char* QuantDotIsaName();

// Which kernel and integer dot MatMulQuant uses from now on, process-wide (kInt8X with kAuto: the
// best ISA the CPU runs; the default). Forcing an ISA the CPU lacks is a CHECK failure. For
// tests, benchmarks and an exact-activation mode; not to be called while a MatMulQuant runs.
enum class QuantKernel { kInt8X, kFloatX };
enum class QuantIsa { kAuto, kAvx2, kAvxVnni, kAvx512Vnni };
void SetQuantKernel(QuantKernel kernel, QuantIsa isa);
bool CpuHasQuantIsa(QuantIsa isa);

}  // namespace ember::cpu
