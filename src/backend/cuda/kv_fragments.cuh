// The quantized-KV attention's direct operands (attention_invariant.cu, int8 / FP8 rows of head
// dim 128): stored bytes become f16 mma fragments in registers, exactly, and the row's scale is
// applied to the products (scores) or folded into the weights (P.V) instead of to every value.
// Every int8 and E4M3 value is an f16, so the conversion loses nothing.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace ember::cuda {

__device__ __forceinline__ uint32_t PackF16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c[16x8] += a[16x16] b[16x8] (row.col), f16 operands, f32 accumulators.
__device__ __forceinline__ void MmaF16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte select: result byte k is byte (sel >> 4k) & 7 of {hi:lo} (prmt.b32).
__device__ __forceinline__ uint32_t Prmt(uint32_t lo, uint32_t hi, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(sel));
  return r;
}

// Four stored int8 / FP8 bytes (b0 lowest) as two f16 pairs, before the row's scale: lo = (b0,
// b1), hi = (b2, b3). int8: the byte with its sign bit flipped (s + 128) placed in the mantissa of
// 1024 (whose unit is 1), then 1024 + 128 taken off; FP8: the hardware's E4M3 -> f16 conversion
// (E4M3's NaN bytes, which the quantizer never writes, give NaN).
template <bool kInt8>
__device__ __forceinline__ void QuantWordToF16x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
  if constexpr (kInt8) {
    const uint32_t u = word ^ 0x80808080u;
    const uint32_t a = Prmt(u, 0x64646464u, 0x4140), b = Prmt(u, 0x64646464u, 0x4342);
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
    const __half2 x = __hsub2(*reinterpret_cast<const __half2*>(&a), bias);
    const __half2 y = __hsub2(*reinterpret_cast<const __half2*>(&b), bias);
    lo = *reinterpret_cast<const uint32_t*>(&x);
    hi = *reinterpret_cast<const uint32_t*>(&y);
  } else {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
        " cvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(word));
  }
}

// The words w0..w3 of four consecutive keys (the same four value bytes d0..d3 of each) as the f16
// B fragments of P.V for those keys: b[f][0] = keys 0, 1 at byte f, b[f][1] = keys 2, 3 at byte f.
template <bool kInt8>
__device__ __forceinline__ void QuantWordsToVFragments(uint32_t w0, uint32_t w1, uint32_t w2,
                                                       uint32_t w3, uint32_t (&b)[4][2]) {
  // (w0.d0, w1.d0, w0.d1, w1.d1), (w0.d2, w1.d2, w0.d3, w1.d3), the same of w2, w3.
  const uint32_t lo01 = Prmt(w0, w1, 0x5140), hi01 = Prmt(w0, w1, 0x7362);
  const uint32_t lo23 = Prmt(w2, w3, 0x5140), hi23 = Prmt(w2, w3, 0x7362);
  QuantWordToF16x2<kInt8>(lo01, b[0][0], b[1][0]);
  QuantWordToF16x2<kInt8>(lo23, b[0][1], b[1][1]);
  QuantWordToF16x2<kInt8>(hi01, b[2][0], b[3][0]);
  QuantWordToF16x2<kInt8>(hi23, b[2][1], b[3][1]);
}

}  // namespace ember::cuda
