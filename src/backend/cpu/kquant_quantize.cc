// The k-quant reference quantizers (see kquant_quantize.h), step for step as ggml-quants.c.
#include "backend/cpu/kquant_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/check.h"
#include "util/half.h"

namespace ember::cpu {
namespace {

constexpr float kGroupMaxEps = 1e-15f;

// ggml's nearest_int: round half to even through the float's mantissa (|x| <= 2^22).
int NearestInt(float x) {
  const float v = x + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &v, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

// make_qkx2_quants: a scale and a min (returned negated, as ggml) for `n` values in [0, nmax].
float MakeQkx2Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                     float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = NearestInt(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = NearestInt(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// make_qx_quants with rmse_type 1 (weights x^2) and no importance weights: a signed scale for
// `n` values in [-nmax, nmax - 1], stored as L = q + nmax.
float MakeQxQuants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = NearestInt(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = NearestInt(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = NearestInt(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void GetScaleMinK4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

// The shared half of Q4_K / Q5_K: one super-block's 8 (scale, min) pairs fitted, packed into
// `head` (d, dmin as f16, then 12 bytes of 6-bit scales and mins) and L re-quantized in [0, nmax].
void FitScaleMinBlock(const float* x, int nmax, float rmin, int nstep, uint8_t* head,
                      uint8_t* L) {
  uint8_t Laux[32];
  float weights[32], mins[8], scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = MakeQkx2Quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin,
                               0.1f, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t* sc = head + 4;
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_min * mins[j])));
    if (j < 4) {
      sc[j] = ls;
      sc[j + 4] = lm;
    } else {
      sc[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      sc[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      sc[j - 0] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  const uint16_t d16 = F32ToF16(max_scale / 63.f), dmin16 = F32ToF16(max_min / 63.f);
  std::memcpy(head, &d16, 2);
  std::memcpy(head + 2, &dmin16, 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    GetScaleMinK4(j, sc, &s, &m);
    const float d = F16ToF32(d16) * s;
    if (!d) continue;
    const float dm = F16ToF32(dmin16) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = NearestInt((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

void QuantizeQ4K(const float* x, uint8_t* y) {  // 144 bytes: d, dmin, scales[12], qs[128]
  uint8_t L[kKQuantBlock];
  FitScaleMinBlock(x, 15, -1.0f, 20, y, L);
  uint8_t* q = y + 16;
  for (int j = 0; j < kKQuantBlock; j += 64, q += 32)
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
}

void QuantizeQ5K(const float* x, uint8_t* y) {  // 176 bytes: d, dmin, scales[12], qh[32], qs[128]
  uint8_t L[kKQuantBlock];
  FitScaleMinBlock(x, 31, -0.5f, 15, y, L);
  uint8_t* qh = y + 16;
  uint8_t* ql = y + 48;
  std::memset(qh, 0, 32);
  uint8_t m1 = 1, m2 = 2;
  for (int n = 0; n < kKQuantBlock; n += 64, ql += 32) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) l1 -= 16, qh[j] |= m1;
      if (l2 > 15) l2 -= 16, qh[j] |= m2;
      ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
    }
    m1 = static_cast<uint8_t>(m1 << 2);
    m2 = static_cast<uint8_t>(m2 << 2);
  }
}

void QuantizeQ6K(const float* x, uint8_t* y) {  // 210 bytes: ql[128], qh[64], scales[16], d
  int8_t L[kKQuantBlock];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < 16; ++ib) {
    scales[ib] = MakeQxQuants(16, 32, x + 16 * ib, L + 16 * ib);
    const float abs_scale = std::fabs(scales[ib]);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scales[ib];
    }
  }
  std::memset(y, 0, 210);
  if (max_abs_scale < kGroupMaxEps) return;  // all zero, d = 0
  int8_t* sc = reinterpret_cast<int8_t*>(y + 192);
  const float iscale = -128.f / max_scale;
  const uint16_t d16 = F32ToF16(1 / iscale);
  std::memcpy(y + 208, &d16, 2);
  for (int ib = 0; ib < 16; ++ib)
    sc[ib] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[ib])));
  for (int j = 0; j < 16; ++j) {
    const float d = F16ToF32(d16) * sc[j];
    if (!d) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = NearestInt(x[16 * j + ii] / d);
      L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
    }
  }
  uint8_t* ql = y;
  uint8_t* qh = y + 128;
  for (int j = 0; j < kKQuantBlock; j += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      const auto q = [&](int o) { return static_cast<uint8_t>(L[j + l + o]); };
      ql[l + 0] = static_cast<uint8_t>((q(0) & 0xF) | ((q(64) & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((q(32) & 0xF) | ((q(96) & 0xF) << 4));
      qh[l] = static_cast<uint8_t>((q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) |
                                   ((q(96) >> 4) << 6));
    }
  }
}

}  // namespace

void QuantizeKQuantRow(DType dtype, const float* src, int64_t count, void* dst) {
  CHECK(IsKQuant(dtype) && count % kKQuantBlock == 0)
      << "QuantizeKQuantRow: " << DTypeName(dtype) << " over " << count << " values";
  const size_t block_bytes = DTypeRowBytes(dtype, kKQuantBlock);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < count / kKQuantBlock; ++b) {
    const float* x = src + b * kKQuantBlock;
    uint8_t* y = out + static_cast<size_t>(b) * block_bytes;
    if (dtype == DType::kQ4_K)
      QuantizeQ4K(x, y);
    else if (dtype == DType::kQ5_K)
      QuantizeQ5K(x, y);
    else
      QuantizeQ6K(x, y);
  }
}

}  // namespace ember::cpu
