// The AVX512_BF16 matmul against a double-precision reference over the bf16-rounded operands
// (x and W rounded to nearest even, as the kernel rounds them) for every weight dtype and awkward
// shapes (k not a multiple of 32, m not of the 6-column tile, n across partial row groups and
// column blocks), its batch invariance (row i of an n-row product on two threads is bitwise the
// 1-row product of row i on one thread), that bf16 weights give the bits of their f32 values,
// and its distance from the exact f32 kernel (the fast mode's stated tolerance).
#include "backend/cpu/matmul_bf16.h"

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/matmul.h"
#include "util/half.h"

namespace ember::cpu {
namespace {

double RoundBf16(float v) { return Bf16ToF32(F32ToBf16(v)); }

struct Case {
  DType dtype;
  int64_t n, k, m;
};

class MatMulBf16Test : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasBf16Dot()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  }
};

TEST_F(MatMulBf16Test, MatchesRoundedReferenceAndIsBatchInvariant) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool one_thread(1), two_threads(2);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (auto [n, k, m] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 64}, {7, 37, 13},
                           {13, 300, 131}, {6, 8, 200}, {2, 513, 70}, {9, 1024, 200},
                           {37, 1100, 70}, {5, 2048, 389}}) {
      std::vector<float> wf(static_cast<size_t>(m * k)), x(static_cast<size_t>(n * k)),
          bias(static_cast<size_t>(m));
      std::vector<uint16_t> wh(wf.size());
      std::vector<double> w_seen(wf.size());  // the weight the kernel uses, after its rounding
      for (size_t i = 0; i < wf.size(); ++i) {
        wf[i] = dist(rng) * 0.5f;
        if (dtype == DType::kF16) {
          wh[i] = F32ToF16(wf[i]);
          w_seen[i] = RoundBf16(F16ToF32(wh[i]));
        } else if (dtype == DType::kBF16) {
          wh[i] = F32ToBf16(wf[i]);
          w_seen[i] = Bf16ToF32(wh[i]);
        } else {
          w_seen[i] = RoundBf16(wf[i]);
        }
      }
      for (float& v : x) v = dist(rng);
      for (float& v : bias) v = dist(rng);
      const void* wp = dtype == DType::kF32 ? static_cast<const void*>(wf.data()) : wh.data();
      std::vector<float> out(static_cast<size_t>(n * m)), solo(static_cast<size_t>(m));
      MatMulBf16(x.data(), n, k, wp, dtype, m, bias.data(), out.data(), two_threads);
      for (int64_t r = 0; r < n; ++r) {
        MatMulBf16(x.data() + r * k, 1, k, wp, dtype, m, bias.data(), solo.data(), one_thread);
        for (int64_t c = 0; c < m; ++c) {
          double ref = bias[c], mag = std::fabs(bias[c]);
          for (int64_t i = 0; i < k; ++i) {
            const double p = RoundBf16(x[r * k + i]) * w_seen[c * k + i];
            ref += p;
            mag += std::fabs(p);
          }
          const float got = out[r * m + c];
          ASSERT_NEAR(got, ref, 2e-6 * mag + 1e-6)
              << DTypeName(dtype) << " n=" << n << " k=" << k << " m=" << m << " at " << r << ","
              << c;
          ASSERT_EQ(got, solo[c]) << "row " << r << " differs when computed alone ("
                                  << DTypeName(dtype) << " n=" << n << " k=" << k << ")";
        }
      }
    }
  }
}

// bf16 weights and the same values stored as f32 (or f16 where exact) take one path's bits.
TEST_F(MatMulBf16Test, StoredDtypeOfTheSameValuesDoesNotMatter) {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool pool(2);
  const int64_t n = 11, k = 96, m = 50;
  std::vector<uint16_t> wb(static_cast<size_t>(m * k));
  std::vector<float> wf(wb.size()), x(static_cast<size_t>(n * k));
  for (size_t i = 0; i < wb.size(); ++i) {
    wb[i] = F32ToBf16(dist(rng));
    wf[i] = Bf16ToF32(wb[i]);
  }
  for (float& v : x) v = dist(rng);
  std::vector<float> a(static_cast<size_t>(n * m)), b(a.size());
  MatMulBf16(x.data(), n, k, wb.data(), DType::kBF16, m, nullptr, a.data(), pool);
  MatMulBf16(x.data(), n, k, wf.data(), DType::kF32, m, nullptr, b.data(), pool);
  EXPECT_EQ(a, b);
}

// The fast mode's distance from the exact f32 kernel on N(0, 1) x and N(0, 0.05) weights with
// k = 2048 (a 1B model's hidden size): relative to the sum of |products| (the scale rounding
// errors grow with), at most 2^-8 (bf16 keeps 8 significant bits) — the tolerance README states.
TEST_F(MatMulBf16Test, DistanceFromExactKernel) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool pool(2);
  const int64_t n = 16, k = 2048, m = 256;
  std::vector<uint16_t> w(static_cast<size_t>(m * k));
  std::vector<float> x(static_cast<size_t>(n * k));
  for (uint16_t& v : w) v = F32ToBf16(dist(rng) * 0.05f);
  for (float& v : x) v = dist(rng);
  std::vector<float> fast(static_cast<size_t>(n * m)), exact(fast.size());
  MatMulBf16(x.data(), n, k, w.data(), DType::kBF16, m, nullptr, fast.data(), pool);
  MatMul(x.data(), n, k, w.data(), DType::kBF16, m, nullptr, exact.data(), pool);
  double worst = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < m; ++c) {
      double mag = 0;
      for (int64_t i = 0; i < k; ++i) mag += std::fabs(x[r * k + i] * Bf16ToF32(w[c * k + i]));
      worst = std::max(worst, std::fabs(fast[r * m + c] - exact[r * m + c]) / mag);
    }
  }
  EXPECT_LT(worst, 1.0 / 256);
  EXPECT_GT(worst, 0.0) << "x is rounded: the two cannot agree everywhere";
}

}  // namespace
}  // namespace ember::cpu
