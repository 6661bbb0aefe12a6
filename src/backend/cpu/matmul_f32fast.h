// The CPU's fast float32 matmul: out = x W^T (+ bias) on AVX-512 FMA register tiles, for CPUs
// with AVX-512 (HasF32Fast; runtime dispatch, so the build still runs without it). Products and
// sums are float32 (f16 and bf16 weights widen exactly), so it is as precise as the exact
// kernels in matmul.h; only the summation order differs: every output element is one FMA chain
// over k in order, from zero, then + bias. That chain does not depend on the row's batch-mates,
// the tiling nor the thread count (batch-invariant among the calls that take this kernel).
// The tiles hold 16 rows per register (x is packed transposed, once per call), so prefill-sized
// products reach the FMA units' peak; decode-sized ones belong to the exact kernels.
// Pure apart from the pool (one caller per pool at a time).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"

namespace ember::cpu {

// Whether this CPU executes MatMulF32Fast (AVX512F/BW/VL).
bool HasF32Fast();

// x [n, k] f32 (row stride k), w [m, k] f32/f16/bf16, bias [m] f32 or null, out [n, m] f32.
// Requires HasF32Fast().
void MatMulF32Fast(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
                   const float* bias, float* out, ThreadPool& pool);

// Whether this CPU's bf16 dot products (VDPBF16PS, MatMulBf16) outrun its float32 FMAs
// (MatMulF32Fast) in flops per second: timed once, on first call, over about a millisecond of
// independent chains of each instruction (alternating passes after a warm-up). False without
// AVX512_BF16. Some CPUs run VDPBF16PS at half the FMA rate (2 x 32 flops every other cycle against
// 2 x 32 every cycle), others at twice.
bool Bf16DotOutrunsF32Fma();

// One core's flops per second in VFMADD231PS (f32_fma) and VDPBF16PS (bf16_dot) chains, measured
// now as Bf16DotOutrunsF32Fma measures them (0 for an instruction the CPU lacks).
struct DotRates {
  double f32_fma = 0.0, bf16_dot = 0.0;
};
DotRates MeasureDotRates();

}  // namespace ember::cpu
