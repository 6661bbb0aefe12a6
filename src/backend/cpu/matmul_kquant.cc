#include "backend/cpu/matmul_kquant.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "util/check.h"

// GCC 12's AVX-512 intrinsics pass an undefined vector as their (ignored) merge source, which
// -Wuninitialized reports once they are inlined into target("avx512f") functions.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ember::cpu {
namespace {

constexpr int kWCols = 4;          // weight rows dequantized together (one stack buffer each)
constexpr int64_t kXRows = 16;     // x rows multiplied with each dequantized super-block
constexpr int64_t kColBlock = 64;  // output columns per parallel work item
constexpr int64_t kFusedRows = 2;  // up to this many x rows: decode fused into the FMAs

// How far ahead the decode rows' weights are prefetched (the int8-x ColumnDot with <= 2 x rows):
// as matmul_quant.cc's kDecodePrefetchBytes (the 1B Q4_0 file's Q6_K LM head streams from memory).
constexpr size_t kDecodePrefetchBytes = 2048;

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 32 int8 values q in element order, values 8 * first .. 8 * first + 31 of the super-block:
// sink(i, w) for the 4 runs of 8, w = dl * float(q) - ml with dl = dl_lo for the first 16 and
// dl_hi after (Q6_K's sub-blocks of 16). Multiply, then subtract: ggml's rounding (no FMA).
template <class Sink>
inline void Scaled(__m256i q, float dl_lo, float dl_hi, float ml, int first, Sink& sink) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  const __m256 m = _mm256_set1_ps(ml);
  for (int j = 0; j < 4; ++j) {
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[j]));
    const __m256 d = _mm256_set1_ps(j < 2 ? dl_lo : dl_hi);
    sink(first + j, _mm256_sub_ps(_mm256_mul_ps(d, f), m));
  }
}

// Q4_K / Q5_K's 8 6-bit scales and mins from their 12 packed bytes (ggml's get_scale_min_k4).
void UnpackScaleMin(const uint8_t* packed, uint8_t* scale, uint8_t* min) {
  for (int j = 0; j < 4; ++j) {
    scale[j] = packed[j] & 0x3F;
    min[j] = packed[j + 4] & 0x3F;
    scale[j + 4] = (packed[j + 8] & 0x0F) | ((packed[j] >> 2) & 0x30);
    min[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 2) & 0x30);
  }
}

// A Q4_K (kFifthBit false) or Q5_K super-block's 32 runs of 8 values, in order, to sink.
template <bool kFifthBit, class Sink>
inline void DecodeQ45K(const uint8_t* block, Sink& sink) {
  const float d = Half(block), dmin = Half(block + 2);
  uint8_t scale[8], min[8];
  UnpackScaleMin(block + 4, scale, min);
  const uint8_t* qs = block + (kFifthBit ? 48 : 16);
  const __m256i nibble = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const __m256i qh = kFifthBit ? Load32(block + 16) : _mm256_setzero_si256();
  for (int sub = 0; sub < 8; ++sub) {
    const __m256i bytes = Load32(qs + (sub / 2) * 32);
    const __m128i shift = _mm_cvtsi32_si128(4 * (sub % 2));
    __m256i q = _mm256_and_si256(_mm256_srl_epi16(bytes, shift), nibble);
    if constexpr (kFifthBit) {
      const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(sub)), one);
      q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
    }
    const float dl = d * static_cast<float>(scale[sub]);
    Scaled(q, dl, dl, dmin * static_cast<float>(min[sub]), 4 * sub, sink);
  }
}

// A Q6_K super-block's runs to sink: per half of 128, four runs of 32 (element 32s + l: low
// nibble of ql[l] (s even) or ql[32 + l] (s odd), shifted by 4 for s >= 2; high bits 2s of qh[l]).
template <class Sink>
inline void DecodeQ6K(const uint8_t* block, Sink& sink) {
  const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = Half(block + 208);
  const __m256i nibble = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
  const __m256i thirty_two = _mm256_set1_epi8(32);
  for (int half = 0; half < 2; ++half) {
    const __m256i ql[2] = {Load32(block + 64 * half), Load32(block + 64 * half + 32)};
    const __m256i qh = Load32(block + 128 + 32 * half);
    for (int s = 0; s < 4; ++s) {
      const __m256i low =
          _mm256_and_si256(_mm256_srl_epi16(ql[s % 2], _mm_cvtsi32_si128(4 * (s / 2))), nibble);
      const __m256i high =
          _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * s)), three);
      const __m256i q =
          _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), thirty_two);
      const int sc = 8 * half + 2 * s;
      Scaled(q, d * static_cast<float>(scales[sc]), d * static_cast<float>(scales[sc + 1]), 0.0f,
             16 * half + 4 * s, sink);
    }
  }
}

// The super-block's 32 runs of 8 values (as ggml's dequantization gives them), in order.
template <DType D, class Sink>
inline void DecodeSuperBlock(const uint8_t* block, Sink& sink) {
  if constexpr (D == DType::kQ6_K)
    DecodeQ6K(block, sink);
  else
    DecodeQ45K<D == DType::kQ5_K>(block, sink);
}

template <DType D>
void DequantizeInto(const uint8_t* block, float* y) {
  auto store = [y](int i, __m256 w) { _mm256_storeu_ps(y + 8 * i, w); };
  DecodeSuperBlock<D>(block, store);
}

void DequantizeSuperBlock(DType dtype, const uint8_t* block, float* y) {
  switch (dtype) {
    case DType::kQ4_K: return DequantizeInto<DType::kQ4_K>(block, y);
    case DType::kQ5_K: return DequantizeInto<DType::kQ5_K>(block, y);
    case DType::kQ6_K: return DequantizeInto<DType::kQ6_K>(block, y);
    default: CHECK(false) << "not a k-quant: " << DTypeName(dtype);
  }
}

// The fixed horizontal sum of 8 lanes: halves, then pairs, then the last two.
inline float SumLanes(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// acc[c] += (even chain + odd chain) of w[c] . x over one super-block (two FMA chains of 16).
template <int C>
inline void FmaSuperBlock(const float* x, const float* wbuf, __m256* acc) {
  __m256 even[C], odd[C];
  for (int c = 0; c < C; ++c) even[c] = odd[c] = _mm256_setzero_ps();
  for (int j = 0; j < kKQuantBlock; j += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + j), x1 = _mm256_loadu_ps(x + j + 8);
    for (int c = 0; c < C; ++c) {
      even[c] = _mm256_fmadd_ps(_mm256_load_ps(wbuf + c * kKQuantBlock + j), x0, even[c]);
      odd[c] = _mm256_fmadd_ps(_mm256_load_ps(wbuf + c * kKQuantBlock + j + 8), x1, odd[c]);
    }
  }
  for (int c = 0; c < C; ++c) acc[c] = _mm256_add_ps(acc[c], _mm256_add_ps(even[c], odd[c]));
}

// Column c of w against R (<= kFusedRows) x rows with no stack buffer: each run of 8 goes to its
// FMA as it is decoded. The same values and the same chains as ColumnTile + FmaSuperBlock, so the
// same results, bit for bit.
template <DType D, int R>
void FusedColumn(const float* x, int64_t k, const uint8_t* w, size_t block_bytes,
                 const float* bias, float* out, int64_t m) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / kKQuantBlock; ++b) {
    __m256 even[R], odd[R];
    for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
    const float* xb = x + b * kKQuantBlock;
    auto fma = [&](int i, __m256 wv) {
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_loadu_ps(xb + r * k + 8 * i);
        if (i % 2 == 0)
          even[r] = _mm256_fmadd_ps(wv, xv, even[r]);
        else
          odd[r] = _mm256_fmadd_ps(wv, xv, odd[r]);
      }
    };
    DecodeSuperBlock<D>(w + static_cast<size_t>(b) * block_bytes, fma);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_add_ps(acc[r], _mm256_add_ps(even[r], odd[r]));
  }
  for (int r = 0; r < R; ++r) {
    float s = SumLanes(acc[r]);
    if (bias != nullptr) s += bias[0];
    out[r * m] = s;
  }
}

template <DType D>
void FusedColumns(const float* x, int64_t n, int64_t k, const uint8_t* w, size_t row_bytes,
                  int64_t cols, const float* bias, float* out, int64_t m) {
  const size_t block_bytes = DTypeRowBytes(D, kKQuantBlock);
  for (int64_t c = 0; c < cols; ++c) {
    const float* b = bias ? bias + c : nullptr;
    if (n == 1)
      FusedColumn<D, 1>(x, k, w + c * row_bytes, block_bytes, b, out + c, m);
    else
      FusedColumn<D, 2>(x, k, w + c * row_bytes, block_bytes, b, out + c, m);
  }
}

// Columns [0, cols) (cols <= kWCols) of w for every x row, kXRows rows per pass over the weights.
void ColumnTile(const float* x, int64_t n, int64_t k, const uint8_t* w, DType dtype,
                size_t row_bytes, int cols, const float* bias, float* out, int64_t m) {
  alignas(32) float wbuf[kWCols * kKQuantBlock];
  __m256 acc[kXRows][kWCols];
  const int64_t num_blocks = k / kKQuantBlock;
  const size_t block_bytes = row_bytes / static_cast<size_t>(num_blocks);
  for (int64_t r0 = 0; r0 < n; r0 += kXRows) {
    const int64_t rows = std::min(kXRows, n - r0);
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < kWCols; ++c) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < num_blocks; ++b) {
      for (int c = 0; c < cols; ++c)
        DequantizeSuperBlock(dtype, w + c * row_bytes + static_cast<size_t>(b) * block_bytes,
                             wbuf + c * kKQuantBlock);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + (r0 + r) * k + b * kKQuantBlock;
        switch (cols) {
          case 4: FmaSuperBlock<4>(xr, wbuf, acc[r]); break;
          case 3: FmaSuperBlock<3>(xr, wbuf, acc[r]); break;
          case 2: FmaSuperBlock<2>(xr, wbuf, acc[r]); break;
          default: FmaSuperBlock<1>(xr, wbuf, acc[r]); break;
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        float s = SumLanes(acc[r][c]);
        if (bias != nullptr) s += bias[c];
        out[(r0 + r) * m + c] = s;
      }
  }
}

}  // namespace

// ---- the int8-x kernel, once per integer-dot ISA (matmul_kquant_int8.inc) ----
namespace kquant_avx2 {
#define EMBER_KQ_ISA 0
#include "backend/cpu/matmul_kquant_int8.inc"
#undef EMBER_KQ_ISA
}  // namespace kquant_avx2

#pragma GCC push_options
#pragma GCC target("avxvnni,avx2,fma,f16c")
namespace kquant_avxvnni {
#define EMBER_KQ_ISA 1
#include "backend/cpu/matmul_kquant_int8.inc"
#undef EMBER_KQ_ISA
}  // namespace kquant_avxvnni
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
namespace kquant_avx512vnni {
#define EMBER_KQ_ISA 2
#include "backend/cpu/matmul_kquant_int8.inc"
#undef EMBER_KQ_ISA
}  // namespace kquant_avx512vnni
#pragma GCC pop_options

KQuantInt8Fn KQuantInt8Kernel(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kAvx512Vnni: return kquant_avx512vnni::Int8Columns;
    case QuantIsa::kAvxVnni: return kquant_avxvnni::Int8Columns;
    default: return kquant_avx2::Int8Columns;
  }
}

void MatMulKQuant(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
                  const float* bias, float* out, ThreadPool& pool) {
  CHECK(IsKQuant(w_dtype)) << "MatMulKQuant weight " << DTypeName(w_dtype);
  CHECK_EQ(k % kKQuantBlock, 0) << "MatMulKQuant: k " << k << " is not a multiple of 256";
  if (n == 0 || m == 0) return;
  const auto* wb = static_cast<const uint8_t*>(w);
  const size_t row_bytes = DTypeRowBytes(w_dtype, k);
  const int max_threads = n * k * m < (1 << 20) ? 1 : pool.num_threads();
  pool.ParallelFor(
      (m + kColBlock - 1) / kColBlock,
      [&](int64_t blk, int) {
        const int64_t c0 = blk * kColBlock, end = std::min(m, c0 + kColBlock);
        const float* b = bias ? bias + c0 : nullptr;
        if (n <= kFusedRows) {
          const uint8_t* wc = wb + c0 * row_bytes;
          switch (w_dtype) {
            case DType::kQ4_K:
              return FusedColumns<DType::kQ4_K>(x, n, k, wc, row_bytes, end - c0, b, out + c0, m);
            case DType::kQ5_K:
              return FusedColumns<DType::kQ5_K>(x, n, k, wc, row_bytes, end - c0, b, out + c0, m);
            default:
              return FusedColumns<DType::kQ6_K>(x, n, k, wc, row_bytes, end - c0, b, out + c0, m);
          }
        }
        for (int64_t c = c0; c < end; c += kWCols)
          ColumnTile(x, n, k, wb + c * row_bytes, w_dtype, row_bytes,
                     static_cast<int>(std::min<int64_t>(kWCols, end - c)),
                     bias ? bias + c : nullptr, out + c, m);
      },
      max_threads);
}

void DequantizeKQuantRow(DType dtype, const void* src, int64_t count, float* dst) {
  CHECK(IsKQuant(dtype) && count % kKQuantBlock == 0);
  const auto* in = static_cast<const uint8_t*>(src);
  const size_t block_bytes = DTypeRowBytes(dtype, kKQuantBlock);
  for (int64_t b = 0; b < count / kKQuantBlock; ++b)
    DequantizeSuperBlock(dtype, in + b * block_bytes, dst + b * kKQuantBlock);
}

}  // namespace ember::cpu
