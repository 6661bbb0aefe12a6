// The recurrent kernels (cpu/gated_delta.h): a run split in two with the state carried equals
// the run in one piece, bitwise; the first token from the zero state matches the closed form.
#include "backend/cpu/gated_delta.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace ember::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

TEST(GatedDeltaTest, ConvSplitEqualsWholeAndStartsFromZeros) {
  const int64_t rows = 9, channels = 5;
  const int32_t kernel = 4;
  const std::vector<float> weight = Random(channels * kernel, 1);
  const std::vector<float> input = Random(rows * channels, 2);
  std::vector<float> whole = input, split = input;
  std::vector<float> w1((kernel - 1) * channels, 0.0f), w2 = w1;
  CausalConv1dSiluRows(whole.data(), rows, channels, weight.data(), kernel, w1.data());
  CausalConv1dSiluRows(split.data(), 4, channels, weight.data(), kernel, w2.data());
  CausalConv1dSiluRows(split.data() + 4 * channels, rows - 4, channels, weight.data(), kernel,
                       w2.data());
  EXPECT_EQ(whole, split);
  EXPECT_EQ(w1, w2);
  for (int64_t c = 0; c < channels; ++c)  // row 0 sees only itself (the last tap)
    EXPECT_FLOAT_EQ(whole[c], Silu(weight[c * kernel + kernel - 1] * input[c]));
  for (int64_t c = 0; c < channels; ++c)  // the window keeps the last kernel - 1 inputs
    EXPECT_EQ(w1[(kernel - 2) * channels + c], input[(rows - 1) * channels + c]);
}

TEST(GatedDeltaTest, DeltaRuleSplitEqualsWholeAndFirstTokenClosedForm) {
  const DeltaHeadShape s{2, 4, 8, 6};  // 2 key heads, each serving 2 value heads
  const int64_t rows = 7, stride = s.qkv_stride();
  const std::vector<float> qkv = Random(rows * stride, 3), ba = Random(rows * 2 * 4, 4);
  const std::vector<float> a_log = Random(4, 5), dt_bias = Random(4, 6);
  const int64_t out_cols = int64_t{s.num_v_heads} * s.v_dim;
  std::vector<float> whole(rows * out_cols), split(rows * out_cols);
  for (int32_t h = 0; h < s.num_v_heads; ++h) {
    std::vector<float> st1(s.k_dim * s.v_dim, 0.0f), st2 = st1;
    GatedDeltaRuleHead(s, h, qkv.data(), ba.data(), a_log.data(), dt_bias.data(), rows,
                       st1.data(), whole.data());
    GatedDeltaRuleHead(s, h, qkv.data(), ba.data(), a_log.data(), dt_bias.data(), 3, st2.data(),
                       split.data());
    GatedDeltaRuleHead(s, h, qkv.data() + 3 * stride, ba.data() + 3 * 8, a_log.data(),
                       dt_bias.data(), rows - 3, st2.data(), split.data() + 3 * out_cols);
    EXPECT_EQ(st1, st2) << "head " << h;
    // Token 0 from S = 0: S = k (beta v)^T, out = (k . q) beta v, q and k l2-normed, q / sqrt(dk).
    const int32_t kh = h / 2;
    const float* q = qkv.data() + kh * s.k_dim;
    const float* k = qkv.data() + s.num_k_heads * s.k_dim + kh * s.k_dim;
    const float* v = qkv.data() + 2 * s.num_k_heads * s.k_dim + h * s.v_dim;
    double qq = 0, kk = 0, qk = 0;
    for (int32_t i = 0; i < s.k_dim; ++i) qq += q[i] * q[i], kk += k[i] * k[i], qk += q[i] * k[i];
    const double beta = 1.0 / (1.0 + std::exp(-ba[h]));
    const double dot = qk / std::sqrt(qq + 1e-6) / std::sqrt(kk + 1e-6) / std::sqrt(8.0);
    for (int32_t j = 0; j < s.v_dim; ++j)
      EXPECT_NEAR(whole[h * s.v_dim + j], dot * beta * v[j], 1e-5) << "head " << h;
  }
  EXPECT_EQ(whole, split);
}

}  // namespace
}  // namespace ember::cpu
