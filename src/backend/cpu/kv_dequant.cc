#include "backend/cpu/kv_dequant.h"

#include <immintrin.h>

#include <cstring>
#include <limits>

#include "backend/kv_quant.h"

namespace ember::cpu {
namespace {

float ScaleAt(const uint8_t* at) {
  float s;
  std::memcpy(&s, at, sizeof(s));
  return s;
}

// 8 int4 values from 4 bytes (element 2i low nibble of byte i, 2i + 1 high), times d.
inline __m256 Int4x8(const uint8_t* bytes, __m256 d) {
  int32_t four;
  std::memcpy(&four, bytes, 4);
  const __m128i dup = _mm_shuffle_epi8(_mm_cvtsi32_si128(four),
                                       _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1));
  __m256i q = _mm256_srlv_epi32(_mm256_cvtepu8_epi32(dup), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
  q = _mm256_sub_epi32(_mm256_and_si256(q, _mm256_set1_epi32(0xf)), _mm256_set1_epi32(8));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
}

}  // namespace

void DequantizeKvRowFast(KvDType dtype, const uint8_t* in, int32_t hd, float* out) {
  if (hd % 8 != 0 || dtype == KvDType::kF32) return DequantizeKvRow(dtype, in, hd, out);
  switch (dtype) {
    case KvDType::kBF16:  // bf16 bits in the high half of each float's
      for (int32_t j = 0; j < hd; j += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * j));
        const __m128i zero = _mm_setzero_si128();
        _mm_storeu_ps(out + j, _mm_castsi128_ps(_mm_unpacklo_epi16(zero, h)));
        _mm_storeu_ps(out + j + 4, _mm_castsi128_ps(_mm_unpackhi_epi16(zero, h)));
      }
      return;
    case KvDType::kF16:
      for (int32_t j = 0; j < hd; j += 8)
        _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * j))));
      return;
    case KvDType::kInt8: {
      const __m256 s = _mm256_set1_ps(ScaleAt(in + hd));
      for (int32_t j = 0; j < hd; j += 8) {
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + j)));
        _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), s));
      }
      return;
    }
    case KvDType::kFP8: {
      // E4M3 as f16 bits (sign, then exponent and mantissa shifted into place: the value over
      // 2^8, subnormals included), times 2^8 s: the table's value times s, one rounding. 0x7f /
      // 0xff (NaN) are blended in.
      const __m256 s = _mm256_set1_ps(ScaleAt(in + hd) * 256.0f);
      const __m256 nan = _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN());
      for (int32_t j = 0; j < hd; j += 8) {
        const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + j)));
        const __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
        const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                                       _mm_slli_epi16(mag, 7));
        const __m256 x = _mm256_cvtph_ps(h);
        const __m256 is_nan = _mm256_castsi256_ps(
            _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f))));
        const __m256 signed_nan = _mm256_or_ps(nan, _mm256_and_ps(x, _mm256_set1_ps(-0.0f)));
        _mm256_storeu_ps(out + j, _mm256_blendv_ps(_mm256_mul_ps(x, s), signed_nan, is_nan));
      }
      return;
    }
    case KvDType::kInt4: {
      const int32_t group = KvInt4Group(hd);
      const uint8_t* scales = in + hd / 2;
      for (int32_t g = 0; g < hd / group; ++g) {
        uint16_t dh;
        std::memcpy(&dh, scales + 2 * g, 2);
        const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(dh)));
        for (int32_t j = g * group; j < (g + 1) * group; j += 8)
          _mm256_storeu_ps(out + j, Int4x8(in + j / 2, d));
      }
      return;
    }
    default:
      return DequantizeKvRow(dtype, in, hd, out);
  }
}

}  // namespace ember::cpu
