// The CPU's fast matmul: out = x W^T (+ bias) on the AVX512_BF16 dot-product instruction
// (VDPBF16PS), for CPUs that have it (HasBf16Dot; runtime dispatch, so the build still runs on
// CPUs without AVX-512). x and W are rounded to bfloat16 (round to nearest even; f16 and f32
// weights are converted as they are read, bf16 weights are used as stored) and the products are
// summed in float32. The chain of every output element is fixed — 16 lane accumulators over k in
// order of 32-element steps (k zero-padded to a multiple of 32), then one fixed horizontal sum,
// then the bias — so a row's result never depends on its batch-mates, the tile shape, nor the
// thread count (batch-invariant, like the exact kernels in matmul.h). The exact float32 kernels
// stay the numerical reference; this one differs from them by bf16's rounding of x and W.
// Pure apart from the pool (one caller per pool at a time).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"

namespace ember::cpu {

// Whether this CPU executes the kernels below (AVX512F/BW/VL + AVX512_BF16).
bool HasBf16Dot();

// x [n, k] f32 (row stride k), w [m, k] f32/f16/bf16, bias [m] f32 or null, out [n, m] f32.
// Requires HasBf16Dot().
void MatMulBf16(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
                const float* bias, float* out, ThreadPool& pool);

}  // namespace ember::cpu
