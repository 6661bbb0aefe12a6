// The row layouts of the quantized KV-cache formats (kv_format.h) and their quantize /
// dequantize twins: the reference every backend's KV pool follows (the CPU backend's WriteKv
// and Attention call these; GPU kernels' tests compare with them). Pure functions; thread-safe.
//
// A pool row is one token's K (or V) of one KV head, head_dim values, stored as:
//   kF32   head_dim float32                                         4 * head_dim bytes
//   kBF16  head_dim bfloat16 (round to nearest even)                2 * head_dim
//   kF16   head_dim IEEE half (round to nearest even)               2 * head_dim
//   kInt8  head_dim int8 q, then a float32 scale s; value q * s,    head_dim + 4
//          s = max|x| / 127 (symmetric, per token per head: exact on write, a block never
//          re-scales as it fills)
//   kFP8   head_dim FP8 E4M3 (OCP "e4m3fn": bias 7, no infinities, max 448, 0x7f NaN) of x / s,
//          then a float32 scale s = max|x| / 448; value e4m3 * s    head_dim + 4
//   kInt4  head_dim / 2 bytes (element 2i in the low nibble of byte i, 2i + 1 in the high), then
//          one f16 scale d per group of KvInt4Group(head_dim) values; nibble n holds q + 8,
//          q = x / d rounded, clamped to [-8, 7], value q * d; d the f16 of max|x| / (7 + k / 8),
//          k in -8 .. 16, with the group's least squared error      head_dim / 2 + 2 * groups
// int4 rows hold H x, not x, when the format rotates (KvFormat::rotate_int4): H is the
// orthonormal Walsh-Hadamard matrix of head_dim (HadamardRotate), which spreads an outlier
// channel over the group so one scale fits every value. H is symmetric and H H = I, so
// q . k = (H q) . (H k) and sum p_t v_t = H sum p_t (H v_t): attention rotates q once per row
// and head and its output once per row and head, never the cached rows.
#pragma once

#include <cstdint>
#include <string>

#include "backend/kv_format.h"

namespace ember {

// Values per int4 scale: 32, or head_dim when it is smaller.
int32_t KvInt4Group(int32_t head_dim);
// Bytes of one row of `head_dim` values (dtype is not kAuto; CHECKed).
int64_t KvRowBytes(KvDType dtype, int32_t head_dim);
// "" when `dtype` can store rows of `head_dim`; else why not (int4: a power of two >= 8).
std::string KvHeadDimUnsupported(KvDType dtype, int32_t head_dim);

// out [KvRowBytes] = the row x [head_dim] in `dtype`. No rotation (the caller rotates int4 rows).
void QuantizeKvRow(KvDType dtype, const float* x, int32_t head_dim, uint8_t* out);
// out [head_dim] = the values of the stored row `in`.
void DequantizeKvRow(KvDType dtype, const uint8_t* in, int32_t head_dim, float* out);

// x [n] = H x in place: the Walsh-Hadamard transform scaled by 1 / sqrt(n) (orthonormal and its
// own inverse). n is a power of two (CHECKed).
void HadamardRotate(float* x, int32_t n);

// FP8 E4M3 (e4m3fn) conversions: round to nearest even, |x| beyond 448 saturates to +-448.
uint8_t FloatToFp8E4m3(float x);
float Fp8E4m3ToFloat(uint8_t bits);
// Every E4M3 byte's value, [256] (0x7f and 0xff NaN): for kernels that look them up.
const float* Fp8E4m3Table();

}  // namespace ember
