// 16 matrix values as float32 in one AVX-512 register, from f32, f16 or bf16 storage: the one
// load-and-widen the AVX-512 matmul kernels (matmul_bf16.cc, matmul_f32fast.cc) share. Compiled
// by target attribute (callers' targets include these features; they run only where the CPU
// has AVX-512). Include only from kernel sources that already use <immintrin.h>.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/backend.h"

namespace ember::cpu {

// Elements [idx, idx + 16) of `src` (dtype D) as float32, exactly (f16 and bf16 widen without
// rounding); lanes outside `mask` are 0 and not read.
template <DType D>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) inline __m512 Widen16(const void* src,
                                                                                int64_t idx,
                                                                                __mmask16 mask) {
  static_assert(D == DType::kF32 || D == DType::kF16 || D == DType::kBF16);
  if constexpr (D == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(src) + idx);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(src) + idx);
    if constexpr (D == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

}  // namespace ember::cpu
