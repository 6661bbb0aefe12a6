#include "backend/kv_quant.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "util/half.h"
#include "util/check.h"

namespace ember {
namespace {

// Every E4M3 byte's value (0x7f and 0xff are NaN).
const std::array<float, 256>& Fp8Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) {
      const int exp = (b >> 3) & 0xf, mant = b & 7;
      float v = exp == 0 ? std::ldexp(static_cast<float>(mant), -9)
                         : std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
      if ((b & 0x7f) == 0x7f) v = NAN;
      t[static_cast<size_t>(b)] = (b & 0x80) != 0 ? -v : v;
    }
    return t;
  }();
  return table;
}

float AbsMax(const float* x, int32_t n) {
  float m = 0.0f;
  for (int32_t j = 0; j < n; ++j) m = std::max(m, std::abs(x[j]));
  return m;
}

// An int4 value's level: x / d rounded to nearest even, clamped to [-8, 7] (inv = 1 / d).
float Int4Level(float x, float inv) {
  return std::clamp(std::nearbyint(x * inv), -8.0f, 7.0f);
}

// The squared error of a group's 32 lanes (its values, then zeros) against their levels at step
// d: each term (x - q d)^2 exact in double (q d has at most 15 significant bits, x 24, so the
// difference at most 26 and its square 52), summed by the tree of a 32-lane xor butterfly seen
// from lane 0 (lane j + lane j + 16, then + 8, + 4, + 2, + 1: the CUDA quantizer's warp sum), so
// both backends pick the same step. AVX2: the same terms and tree, eight lanes at a time.
double Int4GroupError(const std::array<float, 32>& v, float d) {
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
#ifdef __AVX2__
  const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-8.0f), hi = _mm256_set1_ps(7.0f);
  const __m256d vd = _mm256_set1_pd(static_cast<double>(d));
  __m256d e[8];  // lanes 4i .. 4i + 3
  for (int c = 0; c < 4; ++c) {
    const __m256 x = _mm256_loadu_ps(v.data() + 8 * c);
    __m256 q =
        _mm256_round_ps(_mm256_mul_ps(x, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
    for (int h = 0; h < 2; ++h) {
      const __m256d xd =
          _mm256_cvtps_pd(h == 0 ? _mm256_castps256_ps128(x) : _mm256_extractf128_ps(x, 1));
      const __m256d qd =
          _mm256_cvtps_pd(h == 0 ? _mm256_castps256_ps128(q) : _mm256_extractf128_ps(q, 1));
      const __m256d r = _mm256_sub_pd(xd, _mm256_mul_pd(qd, vd));
      e[2 * c + h] = _mm256_mul_pd(r, r);
    }
  }
  for (int i = 0; i < 4; ++i) e[i] = _mm256_add_pd(e[i], e[i + 4]);                         // + 16
  for (int i = 0; i < 2; ++i) e[i] = _mm256_add_pd(e[i], e[i + 2]);                         // + 8
  const __m256d s4 = _mm256_add_pd(e[0], e[1]);                                             // + 4
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));  // + 2
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));                            // + 1
#else
  std::array<double, 32> e;
  for (size_t j = 0; j < 32; ++j) {
    const double r = static_cast<double>(v[j]) -
                     static_cast<double>(Int4Level(v[j], inv)) * static_cast<double>(d);
    e[j] = r * r;
  }
  for (size_t w = 16; w >= 1; w /= 2)
    for (size_t j = 0; j < w; ++j) e[j] += e[j + w];
  return e[0];
#endif
}

// An int4 group's f16 step: among max|x| / (7 + k / 8), k = -8 .. 16 (from no clipping at 6 to
// clipping the largest values at 9), each rounded to f16, the one with the least squared error
// (the first of equals). About a quarter less error than max|x| / 7 on Gaussian-like rows.
uint16_t Int4GroupScale(const float* v, int32_t n) {
  std::array<float, 32> lanes{};  // the group, then the absent lanes' zeros
  std::copy(v, v + n, lanes.begin());
  const float amax = AbsMax(v, n);
  uint16_t best_h = 0;
  double best = 0.0;
  for (int k = -8; k <= 16; ++k) {
    const uint16_t h = F32ToF16(std::min(amax / (7.0f + 0.125f * static_cast<float>(k)), 65504.0f));
    const double err = Int4GroupError(lanes, F16ToF32(h));
    if (k == -8 || err < best) best = err, best_h = h;
  }
  return best_h;
}

void PutScale(uint8_t* at, float s) { std::memcpy(at, &s, sizeof(s)); }
float GetScale(const uint8_t* at) {
  float s;
  std::memcpy(&s, at, sizeof(s));
  return s;
}

}  // namespace

int32_t KvInt4Group(int32_t head_dim) { return std::min(head_dim, 32); }

int64_t KvRowBytes(KvDType dtype, int32_t head_dim) {
  switch (dtype) {
    case KvDType::kF32: return 4LL * head_dim;
    case KvDType::kBF16:
    case KvDType::kF16: return 2LL * head_dim;
    case KvDType::kInt8:
    case KvDType::kFP8: return head_dim + 4LL;
    case KvDType::kInt4: return head_dim / 2 + 2LL * (head_dim / KvInt4Group(head_dim));
    case KvDType::kAuto: break;
  }
  CHECK(false) << "KvRowBytes of " << KvDTypeName(dtype);
  return 0;
}

std::string KvHeadDimUnsupported(KvDType dtype, int32_t head_dim) {
  if (dtype == KvDType::kInt4 && (head_dim < 8 || !std::has_single_bit(static_cast<uint32_t>(head_dim))))
    return "int4 KV rows need a power-of-two head_dim >= 8 (the Hadamard rotation), got " +
           std::to_string(head_dim);
  return "";
}

uint8_t FloatToFp8E4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7f;
  const float a = std::abs(x);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0.015625f) {  // below 2^-6: subnormal, unit 2^-9 (8 rounds up to 2^-6, encoded 0x08)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int e = 0;
  const float fr = std::frexp(a, &e);  // a = fr 2^e, fr in [0.5, 1)
  int mant = static_cast<int>(std::nearbyint((fr * 2.0f - 1.0f) * 8.0f));
  int exp = e - 1 + 7;
  if (mant == 8) {
    mant = 0;
    ++exp;
  }
  return sign | static_cast<uint8_t>(exp << 3 | mant);
}

float Fp8E4m3ToFloat(uint8_t bits) { return Fp8Table()[bits]; }
const float* Fp8E4m3Table() { return Fp8Table().data(); }

void QuantizeKvRow(KvDType dtype, const float* x, int32_t hd, uint8_t* out) {
  switch (dtype) {
    case KvDType::kF32: std::memcpy(out, x, 4 * static_cast<size_t>(hd)); return;
    case KvDType::kBF16:
    case KvDType::kF16: {
      for (int32_t j = 0; j < hd; ++j) {
        const uint16_t h = dtype == KvDType::kBF16 ? F32ToBf16(x[j]) : F32ToF16(x[j]);
        std::memcpy(out + 2 * j, &h, 2);
      }
      return;
    }
    case KvDType::kInt8: {
      const float s = AbsMax(x, hd) / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
      for (int32_t j = 0; j < hd; ++j)
        out[j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::nearbyint(x[j] * inv), -127.0f, 127.0f)));
      PutScale(out + hd, s);
      return;
    }
    case KvDType::kFP8: {
      const float s = AbsMax(x, hd) / 448.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
      for (int32_t j = 0; j < hd; ++j) out[j] = FloatToFp8E4m3(x[j] * inv);
      PutScale(out + hd, s);
      return;
    }
    case KvDType::kInt4: {
      const int32_t group = KvInt4Group(hd);
      uint8_t* scales = out + hd / 2;
      std::memset(out, 0, static_cast<size_t>(hd / 2));
      for (int32_t g = 0; g < hd / group; ++g) {
        const float* v = x + g * group;
        const uint16_t dh = Int4GroupScale(v, group);
        std::memcpy(scales + 2 * g, &dh, 2);
        const float d = F16ToF32(dh), inv = d > 0.0f ? 1.0f / d : 0.0f;
        for (int32_t j = 0; j < group; ++j) {
          const int q = static_cast<int>(Int4Level(v[j], inv)) + 8;
          const int32_t at = g * group + j;
          out[at / 2] |= static_cast<uint8_t>(at % 2 == 0 ? q : q << 4);
        }
      }
      return;
    }
    case KvDType::kAuto: break;
  }
  CHECK(false) << "QuantizeKvRow of " << KvDTypeName(dtype);
}

void DequantizeKvRow(KvDType dtype, const uint8_t* in, int32_t hd, float* out) {
  switch (dtype) {
    case KvDType::kF32: std::memcpy(out, in, 4 * static_cast<size_t>(hd)); return;
    case KvDType::kBF16:
    case KvDType::kF16: {
      for (int32_t j = 0; j < hd; ++j) {
        uint16_t h;
        std::memcpy(&h, in + 2 * j, 2);
        out[j] = dtype == KvDType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
      }
      return;
    }
    case KvDType::kInt8: {
      const float s = GetScale(in + hd);
      const int8_t* q = reinterpret_cast<const int8_t*>(in);
      for (int32_t j = 0; j < hd; ++j) out[j] = static_cast<float>(q[j]) * s;
      return;
    }
    case KvDType::kFP8: {
      const float s = GetScale(in + hd);
      const std::array<float, 256>& table = Fp8Table();
      for (int32_t j = 0; j < hd; ++j) out[j] = table[in[j]] * s;
      return;
    }
    case KvDType::kInt4: {
      const int32_t group = KvInt4Group(hd);
      const uint8_t* scales = in + hd / 2;
      for (int32_t g = 0; g < hd / group; ++g) {
        uint16_t dh;
        std::memcpy(&dh, scales + 2 * g, 2);
        const float d = F16ToF32(dh);
        for (int32_t j = g * group; j < (g + 1) * group; j += 2) {
          const uint8_t b = in[j / 2];
          out[j] = static_cast<float>((b & 0xf) - 8) * d;
          out[j + 1] = static_cast<float>((b >> 4) - 8) * d;
        }
      }
      return;
    }
    case KvDType::kAuto: break;
  }
  CHECK(false) << "DequantizeKvRow of " << KvDTypeName(dtype);
}

void HadamardRotate(float* x, int32_t n) {
  CHECK(n > 0 && std::has_single_bit(static_cast<uint32_t>(n))) << "Hadamard of " << n;
  for (int32_t h = 1; h < n; h *= 2)
    for (int32_t i = 0; i < n; i += 2 * h)
      for (int32_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int32_t j = 0; j < n; ++j) x[j] *= norm;
}

}  // namespace ember
