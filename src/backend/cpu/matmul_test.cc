// The CPU matmul against a double-precision reference for every weight dtype and awkward shapes
// (m, k not multiples of 8 or of the 512-k chunk; n across the decode kernels and the packed
// prefill tiles), and its batch invariance: row i of an n-row product on two threads is bitwise
// equal to the 1-row product of row i alone on one thread.
#include "backend/cpu/matmul.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "util/half.h"

namespace ember::cpu {
namespace {

struct Weights {
  std::vector<uint16_t> half;
  std::vector<float> f32;
  std::vector<double> exact;  // the values the kernel sees, in double
};

Weights MakeWeights(DType dtype, int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 0.5f);
  Weights w;
  for (int64_t i = 0; i < count; ++i) {
    float v = dist(rng);
    if (dtype == DType::kF16) {
      w.half.push_back(F32ToF16(v));
      w.exact.push_back(F16ToF32(w.half.back()));
    } else if (dtype == DType::kBF16) {
      w.half.push_back(F32ToBf16(v));
      w.exact.push_back(Bf16ToF32(w.half.back()));
    } else {
      w.f32.push_back(v);
      w.exact.push_back(v);
    }
  }
  return w;
}

TEST(MatMulTest, MatchesReferenceAndIsBatchInvariant) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool one_thread(1), two_threads(2);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (auto [n, k, m] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 64}, {7, 37, 13},
                           {13, 300, 131}, {6, 8, 200}, {2, 513, 70}, {9, 1024, 200} /* two threads */,
                           {37, 1100, 70} /* three k chunks + tail, partial row group */}) {
      Weights w = MakeWeights(dtype, m * k, rng);
      const void* wp = dtype == DType::kF32 ? static_cast<const void*>(w.f32.data()) : w.half.data();
      std::vector<float> x(static_cast<size_t>(n * k)), bias(static_cast<size_t>(m));
      for (float& v : x) v = dist(rng);
      for (float& v : bias) v = dist(rng);
      std::vector<float> out(static_cast<size_t>(n * m));
      MatMul(x.data(), n, k, wp, dtype, m, bias.data(), out.data(), two_threads);
      for (int64_t r = 0; r < n; ++r) {
        std::vector<float> solo(static_cast<size_t>(m));
        MatMul(x.data() + r * k, 1, k, wp, dtype, m, bias.data(), solo.data(), one_thread);
        for (int64_t c = 0; c < m; ++c) {
          double ref = bias[c];
          double mag = std::fabs(bias[c]);
          for (int64_t i = 0; i < k; ++i) {
            ref += static_cast<double>(x[r * k + i]) * w.exact[c * k + i];
            mag += std::fabs(x[r * k + i] * w.exact[c * k + i]);
          }
          const float got = out[r * m + c];
          ASSERT_NEAR(got, ref, 1e-5 * mag + 1e-6) << DTypeName(dtype) << " n=" << n << " k=" << k
                                                    << " m=" << m << " at " << r << "," << c;
          ASSERT_EQ(got, solo[c]) << "row " << r << " differs when computed alone (" << DTypeName(dtype)
                                  << " n=" << n << " k=" << k << " m=" << m << ")";
        }
      }
    }
  }
}

// MXFP4 weights (gpt-oss experts kept packed) give the bits MatMul gives over their dequantization
// to bf16 by weight_convert's rule (E2M1 value, ldexp by scale - 127, bf16 RN), on the decode and
// the prefill paths, across k chunks, with scales at the ends of the range (2^-127: bf16
// subnormals; 2^127, 2^128: overflow to infinity, zero staying zero) and negative zeros.
TEST(MatMulTest, Mxfp4MatchesItsBf16Dequantization) {
  static const float kE2M1[16] = {0,     0.5f,  1,  1.5f,  2,  3,  4,  6,
                                  -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool pool(2);
  for (auto [n, k, m] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 70},
                         {3, 96, 13},
                         {8, 1056, 40},
                         {9, 64, 131},
                         {20, 1056, 70}}) {
    std::vector<uint8_t> blocks(static_cast<size_t>(m * k / 2)),
        scales(static_cast<size_t>(m * k / 32));
    for (uint8_t& b : blocks) b = static_cast<uint8_t>(rng());
    for (size_t i = 0; i < scales.size(); ++i) {
      // Mostly around 2^-4; every 7th block one of the extremes.
      static const uint8_t kEdges[] = {0, 1, 2, 126, 127, 128, 240, 254, 255};
      scales[i] = i % 7 == 3 ? kEdges[rng() % 9] : static_cast<uint8_t>(120 + rng() % 6);
    }
    std::vector<uint16_t> bf16(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m * k; ++i) {
      const int code = (blocks[static_cast<size_t>(i / 2)] >> (4 * (i % 2))) & 15;
      bf16[static_cast<size_t>(i)] =
          F32ToBf16(std::ldexp(kE2M1[code], scales[static_cast<size_t>(i / 32)] - 127));
    }
    std::vector<float> x(static_cast<size_t>(n * k)), bias(static_cast<size_t>(m));
    for (float& v : x) v = dist(rng) * 1e-3f;
    for (float& v : bias) v = dist(rng);
    std::vector<float> want(static_cast<size_t>(n * m)), got(want.size());
    MatMul(x.data(), n, k, bf16.data(), DType::kBF16, m, bias.data(), want.data(), pool);
    MatMulMxfp4(x.data(), n, k, {blocks.data(), scales.data()}, m, bias.data(), got.data(), pool);
    size_t infinite = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      infinite += std::isinf(want[i]);
      ASSERT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))
          << "n=" << n << " k=" << k << " m=" << m << " at " << i << ": " << got[i] << " vs "
          << want[i];
    }
    EXPECT_LT(infinite, want.size()) << "the extremes swamped every output";
  }
}

}  // namespace
}  // namespace ember::cpu
