// The AVX-512 FMA matmul (matmul_f32fast.h) against its definition, bit for bit: each output is
// the scalar chain s = fma(x[r, i], w[c, i], s) over i in order from s = 0, then s + bias[c] — for
// every weight dtype (f16/bf16 widened exactly) and awkward shapes (k not a multiple of 16 nor of
// the 256-value chunk, m not of the 12-column tile nor the 96-column block, n across partial
// 16-row groups and the 512-row panels), on one and on two threads; so a row's result never
// depends on its batch-mates. And its distance from the exact kernel (matmul.h), the same
// float32 products summed in another order.
#include "backend/cpu/matmul_f32fast.h"

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/matmul.h"
#include "util/half.h"

namespace ember::cpu {
namespace {

class MatMulF32FastTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasF32Fast()) GTEST_SKIP() << "this CPU has no AVX-512 (F, BW, VL)";
  }
};

TEST_F(MatMulF32FastTest, IsTheFmaChainInOrderOnAnyShapeAndThreadCount) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool one_thread(1), two_threads(2);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (auto [n, k, m] : {std::tuple<int64_t, int64_t, int64_t>{9, 64, 64},
                           {16, 37, 13},
                           {17, 300, 131},
                           {33, 8, 200},
                           {40, 513, 97},
                           {600, 100, 30},
                           {31, 1100, 12},
                           {48, 2048, 389}}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " n " + std::to_string(n) + " k " +
                   std::to_string(k) + " m " + std::to_string(m));
      std::vector<float> w_seen(static_cast<size_t>(m * k)), x(static_cast<size_t>(n * k)),
          bias(static_cast<size_t>(m));
      std::vector<uint16_t> wh(w_seen.size());
      for (size_t i = 0; i < w_seen.size(); ++i) {
        const float v = dist(rng) * 0.5f;
        if (dtype == DType::kF16) {
          wh[i] = F32ToF16(v);
          w_seen[i] = F16ToF32(wh[i]);
        } else if (dtype == DType::kBF16) {
          wh[i] = F32ToBf16(v);
          w_seen[i] = Bf16ToF32(wh[i]);
        } else {
          w_seen[i] = v;
        }
      }
      for (float& v : x) v = dist(rng);
      for (float& v : bias) v = dist(rng);
      const void* w = dtype == DType::kF32 ? static_cast<const void*>(w_seen.data()) : wh.data();
      std::vector<float> want(static_cast<size_t>(n * m));
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < m; ++c) {
          float s = 0.0f;
          for (int64_t i = 0; i < k; ++i)
            s = std::fma(x[static_cast<size_t>(r * k + i)], w_seen[static_cast<size_t>(c * k + i)],
                         s);
          want[static_cast<size_t>(r * m + c)] = s + bias[static_cast<size_t>(c)];
        }
      }
      for (ThreadPool* pool : {&one_thread, &two_threads}) {
        std::vector<float> got(want.size(), -1.0f);
        MatMulF32Fast(x.data(), n, k, w, dtype, m, bias.data(), got.data(), *pool);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
            << pool->num_threads() << " threads";
      }
      // Without bias: the chain alone.
      std::vector<float> nobias(want.size());
      MatMulF32Fast(x.data(), n, k, w, dtype, m, nullptr, nobias.data(), two_threads);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(nobias[i] + bias[i % static_cast<size_t>(m)], want[i]) << "element " << i;
    }
  }
}

// k = 0: every chain is empty, out = 0 + bias (or 0).
TEST_F(MatMulF32FastTest, EmptyProductsAreTheBias) {
  ThreadPool pool(2);
  const std::vector<float> bias = {1.5f, -2.0f, 0.25f};
  std::vector<float> out(6, 7.0f);
  MatMulF32Fast(nullptr, 2, 0, nullptr, DType::kF16, 3, bias.data(), out.data(), pool);
  EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f, 0.25f, 1.5f, -2.0f, 0.25f}));
  MatMulF32Fast(nullptr, 2, 0, nullptr, DType::kF16, 3, nullptr, out.data(), pool);
  EXPECT_EQ(out, std::vector<float>(6, 0.0f));
}

// The stated tolerance against the exact kernel: the same float32 products, another summation
// order, so relative differences of a few float32 ulps of the row's magnitude (here within 1e-5
// of the largest |output| at k = 2048).
TEST_F(MatMulF32FastTest, AgreesWithTheExactKernel) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool pool(2);
  const int64_t n = 64, k = 2048, m = 300;
  std::vector<float> x(static_cast<size_t>(n * k));
  std::vector<uint16_t> w(static_cast<size_t>(m * k));
  for (float& v : x) v = dist(rng);
  for (uint16_t& v : w) v = F32ToF16(dist(rng) * 0.05f);
  std::vector<float> exact(static_cast<size_t>(n * m)), fast(exact.size());
  MatMul(x.data(), n, k, w.data(), DType::kF16, m, nullptr, exact.data(), pool);
  MatMulF32Fast(x.data(), n, k, w.data(), DType::kF16, m, nullptr, fast.data(), pool);
  double scale = 0.0, worst = 0.0;
  for (size_t i = 0; i < exact.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(exact[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(exact[i]) - fast[i]));
  }
  EXPECT_LT(worst, 1e-5 * scale) << "worst " << worst << " of " << scale;
  EXPECT_GT(worst, 0.0) << "the orders differ, so some sum should";
}

}  // namespace
}  // namespace ember::cpu
