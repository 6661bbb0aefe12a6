// ggml's reference quantizers for the k-quants (quantize_row_q4_K_ref, _q5_K_ref, _q6_K_ref in
// ggml-quants.c, the ones llama-quantize uses without an importance matrix), ported as they are:
// Q4_K / Q5_K fit a scale and a min per run of 32 by a weighted search (make_qkx2_quants: 21 / 16
// candidate scales, weights av|x| + |x|), Q6_K a signed scale per run of 16 (make_qx_quants with
// x^2 weights, 19 candidates); the per-run scales and mins are then quantized to 6 bits (Q6_K: to
// int8) against one f16 super-block scale, and the values re-quantized with them. Compiled
// without floating-point contraction so that every rounding step is ggml's. Pure functions; safe
// from any thread.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/matmul_kquant.h"  // kKQuantBlock

namespace ember::cpu {

// Quantizes `count` values (a multiple of 256) of `src` into DTypeRowBytes(dtype, count) bytes at
// `dst` in ggml's block layout. `dtype` is kQ4_K, kQ5_K or kQ6_K (CHECKed).
void QuantizeKQuantRow(DType dtype, const float* src, int64_t count, void* dst);

}  // namespace ember::cpu
