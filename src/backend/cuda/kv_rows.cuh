// Device code for the quantized KV rows (kernels.h's KvQuant; backend/kv_quant.h defines the
// layout and is the reference): where a row lives in a layer's pool, its values as float
// (bit-equal to DequantizeKvRow), and one warp's quantization of a row (bit-equal to
// QuantizeKvRow given the same float inputs: the same scale, reciprocal and round-to-nearest-even
// products; int4 after HadamardRotate's bits). Included by write_kv.cu and the attention kernels.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {

// Byte offset of the row of (pool slot, KV head) in a quantized layer's K or V: head-major
// within the slot's block, as the CPU backend lays it out (its KvRowOffset).
__device__ __forceinline__ int64_t KvQuantRowOffset(const KvLayerView& kv, int64_t slot,
                                                    int32_t head) {
  const int64_t block = slot / kv.block_size, offset = slot % kv.block_size;
  return ((block * kv.num_kv_heads + head) * kv.block_size + offset) * kv.row_bytes;
}

// A row's float32 scale, after its head_dim value bytes (row_bytes % 4 == 0: aligned).
__device__ __forceinline__ float KvQuantScale(const unsigned char* row, int32_t head_dim) {
  return *reinterpret_cast<const float*>(row + head_dim);
}

// int4 rows: values per f16 scale (kv_quant.h's KvInt4Group), and the bytes of a row.
__host__ __device__ constexpr int32_t KvInt4GroupOf(int32_t head_dim) {
  return head_dim < 32 ? head_dim : 32;
}
__host__ __device__ constexpr int32_t KvInt4RowBytes(int32_t head_dim) {
  return head_dim / 2 + 2 * (head_dim / KvInt4GroupOf(head_dim));
}
// The f16 scale of the int4 row's group holding element d (rows are 2-byte aligned).
__device__ __forceinline__ float KvInt4Scale(const unsigned char* row, int32_t d,
                                             int32_t head_dim) {
  return __half2float(
      *reinterpret_cast<const __half*>(row + head_dim / 2 + 2 * (d / KvInt4GroupOf(head_dim))));
}
// A nibble's value before the scale: q - 8, exact.
__device__ __forceinline__ float KvInt4Level(unsigned nibble) {
  return static_cast<float>(static_cast<int>(nibble & 0xfu) - 8);
}

// The stored byte's value before the scale. FP8 E4M3 goes through its f16 bits (sign, then
// exponent and mantissa shifted into place: the value over 2^8, subnormals included), times 2^8:
// exact. (0x7f / 0xff, E4M3's NaN, read as 480: the quantizer never writes them.)
// int8: the byte with its sign bit flipped is s + 128, placed in the mantissa of 2^23 (whose
// unit is 1) and 2^23 + 128 taken off: exact, one FADD rather than an int-to-float conversion.
template <bool kInt8>
__device__ __forceinline__ float KvQuantByteOf(unsigned b) {
  if constexpr (kInt8) return __fsub_rn(__uint_as_float(0x4b000000u | (b ^ 0x80u)), 8388736.f);
  const unsigned short h = static_cast<unsigned short>(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
  return __fmul_rn(__half2float(__ushort_as_half(h)), 256.f);
}
__device__ __forceinline__ float KvQuantByte(KvQuant t, unsigned b) {
  return t == KvQuant::kInt8 ? KvQuantByteOf<true>(b) : KvQuantByteOf<false>(b);
}

// Element d of a stored row: byte value times scale (int4: its nibble's level times its group's
// scale), one rounding (DequantizeKvRow's value).
__device__ __forceinline__ float KvQuantValue(KvQuant t, const unsigned char* row, int32_t d,
                                              int32_t head_dim) {
  if (t == KvQuant::kInt4) {
    const unsigned b = row[d / 2];
    return __fmul_rn(KvInt4Level(d % 2 == 0 ? b : b >> 4), KvInt4Scale(row, d, head_dim));
  }
  return __fmul_rn(KvQuantByte(t, row[d]), KvQuantScale(row, head_dim));
}

// For the f32 kernels: element d of the K (is_v false) or V row of (slot, KV head) of a float32
// or quantized layer (never bf16).
__device__ __forceinline__ float KvLoad(const KvLayerView& kv, bool is_v, int64_t slot,
                                        int32_t head, int32_t d) {
  if (kv.quant == KvQuant::kNone) {
    const float* base = is_v ? kv.v : kv.k;
    return base[(slot * kv.num_kv_heads + head) * kv.head_dim + d];
  }
  const unsigned char* base = reinterpret_cast<const unsigned char*>(is_v ? kv.v : kv.k);
  return KvQuantValue(kv.quant, base + KvQuantRowOffset(kv, slot, head), d, kv.head_dim);
}

// v[i] = x[lane + 32 i] for the row x of n <= kMaxHeadDim values, 0 past n: a row spread over the
// warp, as WarpHadamard and the quantizers take it.
__device__ __forceinline__ void WarpLoadRow(const float* x, int32_t n,
                                            float (&v)[kMaxHeadDim / 32]) {
  const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int i = 0; i < kMaxHeadDim / 32; ++i) {
    const int d = lane + 32 * i;
    v[i] = d < n ? x[d] : 0.f;
  }
}

// v (WarpLoadRow's layout; n a power of two <= kMaxHeadDim) = H v, HadamardRotate's butterflies
// (strides 1, 2, 4, ...: those under 32 between lanes, the rest between a lane's registers) and its
// final scaling by 1 / sqrt(n), each value rounded as there, so the same bits. Every lane of the
// warp calls it.
__device__ __forceinline__ void WarpHadamard(float (&v)[kMaxHeadDim / 32], int32_t n) {
  constexpr int kPerLane = kMaxHeadDim / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int h = 1; h < 32; h *= 2) {
    if (h >= n) break;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const float other = __shfl_xor_sync(0xffffffffu, v[i], h);
      v[i] = (lane & h) != 0 ? __fsub_rn(other, v[i]) : __fadd_rn(v[i], other);
    }
  }
#pragma unroll
  for (int h = 1; h < kPerLane; h *= 2) {
    if (32 * h >= n) break;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if ((i & h) != 0) continue;
      const float a = v[i], b = v[i + h];
      v[i] = __fadd_rn(a, b);
      v[i + h] = __fsub_rn(a, b);
    }
  }
  const float norm = __frcp_rn(__fsqrt_rn(static_cast<float>(n)));
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) v[i] = __fmul_rn(v[i], norm);
}

// An int4 value's level (kv_quant.cc's Int4Level): x * inv rounded to nearest even, clamped to
// [-8, 7].
__device__ __forceinline__ float KvInt4LevelOf(float x, float inv) {
  return fminf(fmaxf(rintf(__fmul_rn(x, inv)), -8.f), 7.f);
}

// int4 (one warp, WarpQuantizeRow's values v): per group of KvInt4GroupOf(head_dim) values
// (register i across the lanes, or the whole row when head_dim < 32; the lanes past it hold 0)
// the f16 step d of kv_quant.cc's Int4GroupScale: among f16(min(max|x| / (7 + k / 8), 65504)),
// k = -8 .. 16, the first with the least squared error, each lane's (x - q d)^2 exact in double
// and summed by the xor butterfly Int4GroupError mirrors; each value's level q plus 8, element 2j
// in byte j's low nibble, 2j + 1 in its high one; then the scales.
__device__ __forceinline__ void WarpQuantizeInt4(const float (&v)[kMaxHeadDim / 32],
                                                 int32_t head_dim, unsigned char* out) {
  constexpr int kPerLane = kMaxHeadDim / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (32 * i >= head_dim) break;
    const float amax = WarpMax(fabsf(v[i]));
    __half dh = __float2half_rn(0.f);
    double best = 0.0;
    for (int k = -8; k <= 16; ++k) {
      const __half ch = __float2half_rn(
          fminf(__fdiv_rn(amax, __fadd_rn(7.f, 0.125f * static_cast<float>(k))), 65504.f));
      const float cd = __half2float(ch);
      const float cinv = cd > 0.f ? __frcp_rn(cd) : 0.f;
      const double r = __dsub_rn(
          static_cast<double>(v[i]),
          __dmul_rn(static_cast<double>(KvInt4LevelOf(v[i], cinv)), static_cast<double>(cd)));
      double err = __dmul_rn(r, r);
#pragma unroll
      for (int w = 16; w >= 1; w /= 2) err = __dadd_rn(err, __shfl_xor_sync(0xffffffffu, err, w));
      if (k == -8 || err < best) best = err, dh = ch;
    }
    const float d = __half2float(dh);
    const float inv = d > 0.f ? __frcp_rn(d) : 0.f;
    const int q = static_cast<int>(KvInt4LevelOf(v[i], inv)) + 8;
    const int high = __shfl_down_sync(0xffffffffu, q, 1);
    const int e = lane + 32 * i;
    if (lane % 2 == 0 && e < head_dim) out[e / 2] = static_cast<unsigned char>(q | high << 4);
    if (lane == 0) *reinterpret_cast<__half*>(out + head_dim / 2 + 2 * i) = dh;
  }
}

// One warp stores x [head_dim] (head_dim <= kMaxHeadDim) as a quantized row at `out`:
// s = max|x| / (127 or 448), each value x * (1 / s) rounded to nearest even (int8: clamped to
// [-127, 127]; FP8: saturated to +-448), then s; int4: WarpQuantizeInt4, of H x when `rotate`
// (WarpHadamard). Every lane of the warp calls it.
__device__ __forceinline__ void WarpQuantizeRow(KvQuant t, const float* x, int32_t head_dim,
                                                unsigned char* out, bool rotate = false) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  constexpr int kPerLane = kMaxHeadDim / 32;
  float v[kPerLane];
  WarpLoadRow(x, head_dim, v);
  if (t == KvQuant::kInt4) {
    if (rotate) WarpHadamard(v, head_dim);
    WarpQuantizeInt4(v, head_dim, out);
    return;
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = WarpMax(amax);
  const float s = __fdiv_rn(amax, t == KvQuant::kInt8 ? 127.f : 448.f);
  const float inv = s > 0.f ? __frcp_rn(s) : 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d >= head_dim) break;
    const float y = __fmul_rn(v[i], inv);
    if (t == KvQuant::kInt8) {
      out[d] = static_cast<unsigned char>(
          static_cast<int8_t>(static_cast<int>(fminf(fmaxf(rintf(y), -127.f), 127.f))));
    } else {
      out[d] = static_cast<unsigned char>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
    }
  }
  if (lane == 0) *reinterpret_cast<float*>(out + head_dim) = s;
}

}  // namespace ember::cuda
