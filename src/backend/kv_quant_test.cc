// kv_format / kv_quant: flag parsing and per-layer resolution, row round trips of every KV dtype
// within each format's stated error bound, FP8 E4M3 conversions, the Hadamard rotation's
// orthogonality (and that it rescues an int4 row with an outlier channel).
#include "backend/kv_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "util/half.h"

namespace ember {
namespace {

std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

std::vector<float> RoundTrip(KvDType t, const std::vector<float>& x) {
  const int32_t hd = static_cast<int32_t>(x.size());
  std::vector<uint8_t> row(static_cast<size_t>(KvRowBytes(t, hd)));
  QuantizeKvRow(t, x.data(), hd, row.data());
  std::vector<float> y(x.size());
  DequantizeKvRow(t, row.data(), hd, y.data());
  return y;
}

double RelRms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * double{a[i] - b[i]};
    den += double{a[i]} * a[i];
  }
  return std::sqrt(num / den);
}

TEST(KvFormatTest, ParsesAndResolvesLayers) {
  EXPECT_EQ(*ParseKvDType("int8", "--kv-cache-dtype"), KvDType::kInt8);
  const auto bad = ParseKvDType("int3", "--kv-cache-dtype");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--kv-cache-dtype"), std::string::npos);
  EXPECT_NE(bad.message().find("int3"), std::string::npos);
  auto layers = ParseKvLayerOverrides("0:1=bf16,-1=f32");
  ASSERT_TRUE(layers.ok()) << layers.message();
  KvCacheSpec spec{KvDType::kInt8, *layers, true};
  auto f = ResolveKvFormat(spec, 6);
  ASSERT_TRUE(f.ok()) << f.message();
  const std::vector<KvDType> want = {KvDType::kBF16, KvDType::kBF16, KvDType::kInt8,
                                     KvDType::kInt8, KvDType::kInt8, KvDType::kF32};
  EXPECT_EQ(f->layers, want);
  EXPECT_EQ(f->Describe(), "bf16 (layers 0-1), int8 (2-4), f32 (5)");
  EXPECT_EQ(ResolveKvFormat({KvDType::kFP8, {}, true}, 3)->Describe(), "fp8");
  EXPECT_FALSE(ResolveKvFormat({KvDType::kInt8, {{4, 4, KvDType::kF32}}, true}, 3).ok());
  EXPECT_FALSE(ResolveKvFormat({KvDType::kInt8, {{-4, -1, KvDType::kF32}}, true}, 3).ok());
  for (const char* item : {"0", "a=bf16", "0=int3", "0:x=f16", "0:1:2=f16"}) {
    const auto r = ParseKvLayerOverrides(item);
    ASSERT_FALSE(r.ok()) << item;
    EXPECT_NE(r.message().find("--kv-cache-dtype-layers"), std::string::npos) << r.message();
  }
  EXPECT_TRUE(ParseKvLayerOverrides("")->empty());
}

TEST(KvQuantTest, RowBytes) {
  EXPECT_EQ(KvRowBytes(KvDType::kF32, 64), 256);
  EXPECT_EQ(KvRowBytes(KvDType::kBF16, 64), 128);
  EXPECT_EQ(KvRowBytes(KvDType::kInt8, 64), 68);
  EXPECT_EQ(KvRowBytes(KvDType::kFP8, 128), 132);
  EXPECT_EQ(KvRowBytes(KvDType::kInt4, 64), 32 + 4);
  EXPECT_EQ(KvRowBytes(KvDType::kInt4, 16), 8 + 2);  // one group of 16
  EXPECT_EQ(KvHeadDimUnsupported(KvDType::kInt4, 64), "");
  EXPECT_NE(KvHeadDimUnsupported(KvDType::kInt4, 80), "");
  EXPECT_EQ(KvHeadDimUnsupported(KvDType::kInt8, 80), "");
}

TEST(KvQuantTest, RoundTripsWithinBounds) {
  for (int32_t hd : {16, 64, 128}) {
    const std::vector<float> x = Gaussian(static_cast<size_t>(hd), static_cast<uint32_t>(hd));
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::abs(v));
    EXPECT_EQ(RoundTrip(KvDType::kF32, x), x);
    const auto bf = RoundTrip(KvDType::kBF16, x), h = RoundTrip(KvDType::kF16, x);
    const auto i8 = RoundTrip(KvDType::kInt8, x), f8 = RoundTrip(KvDType::kFP8, x);
    const auto i4 = RoundTrip(KvDType::kInt4, x);
    const int32_t group = KvInt4Group(hd);
    for (size_t j = 0; j < x.size(); ++j) {
      EXPECT_EQ(bf[j], Bf16ToF32(F32ToBf16(x[j])));
      EXPECT_EQ(h[j], F16ToF32(F32ToF16(x[j])));
      EXPECT_LE(std::abs(i8[j] - x[j]), amax / 127.0f * 0.5f * 1.0001f) << j;
      // E4M3: 3 mantissa bits, so half an ulp is 1/16 relative; subnormals (below 2^-6 of the
      // scaled range) are absolute steps of 2^-10 of the scale.
      EXPECT_LE(std::abs(f8[j] - x[j]), std::abs(x[j]) / 16.0f + amax / 448.0f * 0.001f) << j;
      float gmax = 0;
      const size_t g0 = j / static_cast<size_t>(group) * static_cast<size_t>(group);
      for (size_t t = g0; t < g0 + static_cast<size_t>(group); ++t) gmax = std::max(gmax, std::abs(x[t]));
      // int4: at most half a step d <= gmax / 6, or a value clipped at 7 d with d >= gmax / 9.
      EXPECT_LE(std::abs(i4[j] - x[j]), gmax * 2.0f / 9.0f * 1.002f) << j;
    }
    EXPECT_LT(RelRms(x, i8), 0.01);
    EXPECT_LT(RelRms(x, f8), 0.04);
    EXPECT_LT(RelRms(x, i4), 0.2);
    // The chosen steps give no more squared error than max|x| / 7 (a candidate), here less.
    std::vector<float> plain(x.size());
    for (size_t g0 = 0; g0 < x.size(); g0 += static_cast<size_t>(group)) {
      float gmax = 0;
      for (size_t t = g0; t < g0 + static_cast<size_t>(group); ++t)
        gmax = std::max(gmax, std::abs(x[t]));
      const float d = F16ToF32(F32ToF16(gmax / 7.0f));
      for (size_t t = g0; t < g0 + static_cast<size_t>(group); ++t)
        plain[t] = std::clamp(std::nearbyint(x[t] / d), -7.0f, 7.0f) * d;
    }
    EXPECT_LT(RelRms(x, i4), RelRms(x, plain)) << "head_dim " << hd;
  }
  const std::vector<float> zero(32, 0.0f);
  for (KvDType t : {KvDType::kInt8, KvDType::kFP8, KvDType::kInt4}) EXPECT_EQ(RoundTrip(t, zero), zero);
}

TEST(KvQuantTest, Fp8E4m3Conversions) {
  EXPECT_EQ(FloatToFp8E4m3(0.0f), 0x00);
  EXPECT_EQ(FloatToFp8E4m3(1.0f), 0x38);
  EXPECT_EQ(FloatToFp8E4m3(-2.0f), 0xc0);
  EXPECT_EQ(FloatToFp8E4m3(448.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4m3(1e6f), 0x7e);                // saturates
  EXPECT_EQ(FloatToFp8E4m3(std::ldexp(1.0f, -9)), 0x01);  // the smallest subnormal
  EXPECT_EQ(FloatToFp8E4m3(1.0625f), 0x38);             // a tie rounds to even (1.0)
  EXPECT_EQ(FloatToFp8E4m3(1.1875f), 0x3a);             // a tie rounds to even (1.25)
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0x7f)));
  for (int b = 0; b < 256; ++b) {  // every finite byte survives the round trip
    const float v = Fp8E4m3ToFloat(static_cast<uint8_t>(b));
    if (std::isnan(v) || b == 0x80) continue;  // NaN; -0 encodes as 0x80 too but compares equal
    EXPECT_EQ(FloatToFp8E4m3(v), b) << b;
  }
}

TEST(KvQuantTest, HadamardIsOrthonormalAndItsOwnInverse) {
  for (int32_t n : {8, 16, 64, 128}) {
    // Columns of H: rotate the unit vectors; H^T H = I.
    std::vector<std::vector<float>> cols;
    for (int32_t i = 0; i < n; ++i) {
      std::vector<float> e(static_cast<size_t>(n), 0.0f);
      e[static_cast<size_t>(i)] = 1.0f;
      HadamardRotate(e.data(), n);
      cols.push_back(e);
    }
    for (int32_t i = 0; i < n; ++i)
      for (int32_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int32_t t = 0; t < n; ++t) dot += double{cols[i][t]} * cols[j][t];
        ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << n << " " << i << " " << j;
        ASSERT_EQ(cols[i][j], cols[j][i]);  // symmetric
      }
    std::vector<float> x = Gaussian(static_cast<size_t>(n), 9), y = x;
    HadamardRotate(y.data(), n);
    HadamardRotate(y.data(), n);
    for (int32_t j = 0; j < n; ++j) ASSERT_NEAR(y[j], x[j], 1e-5);
  }
}

TEST(KvQuantTest, RotationHelpsInt4WithAnOutlierChannel) {
  const int32_t hd = 64;
  double plain = 0, rotated = 0;
  for (uint32_t seed = 0; seed < 50; ++seed) {
    std::vector<float> x = Gaussian(hd, seed);
    x[5] = 40.0f;  // an outlier channel, as keys have
    plain += RelRms(x, RoundTrip(KvDType::kInt4, x));
    std::vector<float> r = x;
    HadamardRotate(r.data(), hd);
    std::vector<float> back = RoundTrip(KvDType::kInt4, r);
    HadamardRotate(back.data(), hd);
    rotated += RelRms(x, back);
  }
  EXPECT_LT(rotated, 0.7 * plain) << "plain " << plain / 50 << " rotated " << rotated / 50;
}

}  // namespace
}  // namespace ember
