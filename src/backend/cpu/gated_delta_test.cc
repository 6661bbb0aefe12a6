// The recurrent kernels (cpu/gated_delta.h): a run split in two with the state carried equals
// the run in one piece, bitwise; the first token from the zero state matches the closed form;
// the chunked delta rule equals the token loop to float rounding.
#include "backend/cpu/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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
    GatedDeltaRuleTokens(s, h, qkv.data(), ba.data(), a_log.data(), dt_bias.data(), rows,
                         st1.data(), whole.data());
    GatedDeltaRuleTokens(s, h, qkv.data(), ba.data(), a_log.data(), dt_bias.data(), 3, st2.data(),
                         split.data());
    GatedDeltaRuleTokens(s, h, qkv.data() + 3 * stride, ba.data() + 3 * 8, a_log.data(),
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

// A step of several sequences (rows back to back, as the backend passes them) for every value
// head, each from a random state: outputs and final states of the chunked form (chunk rows per
// chunk) and of the token loop. Head h's decays: h % 3 == 0 near 1 (a_log -8), 1 near 0
// (exp(-26) or less), 2 in between; the conv-free inputs are uniform in [-1, 1] (beta about
// sigmoid of that).
struct DeltaRun {
  std::vector<float> out, states;
};
DeltaRun RunDelta(const DeltaHeadShape& s, const std::vector<int64_t>& seq_rows, int32_t chunk,
                  uint32_t seed) {
  int64_t rows = 0;
  for (int64_t r : seq_rows) rows += r;
  const int64_t stride = s.qkv_stride(), nv = s.num_v_heads,
                head_floats = int64_t{s.k_dim} * s.v_dim;
  const std::vector<float> qkv = Random(static_cast<size_t>(rows * stride), seed);
  const std::vector<float> ba = Random(static_cast<size_t>(rows * 2 * nv), seed + 1);
  std::vector<float> a_log(static_cast<size_t>(nv)), dt_bias(static_cast<size_t>(nv));
  for (int64_t h = 0; h < nv; ++h) {
    a_log[static_cast<size_t>(h)] = h % 3 == 0 ? -8.0f : h % 3 == 1 ? 2.5f : 0.0f;
    dt_bias[static_cast<size_t>(h)] = h % 3 == 1 ? 3.0f : 0.0f;  // softplus >= 2.1: g <= -26
  }
  DeltaRun run{std::vector<float>(static_cast<size_t>(rows * nv * s.v_dim)),
               Random(static_cast<size_t>(seq_rows.size() * nv * head_floats), seed + 2)};
  int64_t first = 0;
  for (size_t i = 0; i < seq_rows.size(); ++i) {
    for (int32_t h = 0; h < s.num_v_heads; ++h) {
      float* state = run.states.data() + (static_cast<int64_t>(i) * nv + h) * head_floats;
      const float* q = qkv.data() + first * stride;
      const float* b = ba.data() + first * 2 * nv;
      float* o = run.out.data() + first * nv * s.v_dim;
      if (chunk > 0)
        GatedDeltaRuleChunked(s, h, q, b, a_log.data(), dt_bias.data(), seq_rows[i], chunk, state,
                              o);
      else
        GatedDeltaRuleTokens(s, h, q, b, a_log.data(), dt_bias.data(), seq_rows[i], state, o);
    }
    first += seq_rows[i];
  }
  return run;
}

// Largest |a - b| over the largest |b| (1 where b is all zeros).
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return worst / std::max(scale, 1.0);
}

TEST(GatedDeltaTest, ChunkedEqualsTheTokenLoop) {
  struct Case {
    DeltaHeadShape shape;
    std::vector<int64_t> seq_rows;
    int32_t chunk;
  };
  const std::vector<Case> cases = {
      {{1, 1, 16, 16}, {1, 7, 8, 9}, 8},    // single rows, one chunk and a bit
      {{2, 4, 32, 16}, {100, 37}, 16},      // chunk boundaries not aligned
      {{2, 6, 48, 24}, {64, 65, 130}, 64},  // v_dim 24 (two tiles of 8 and 16)
      {{1, 3, 128, 128}, {200, 129}, 64},   // Qwen3-Next's head dims
      {{2, 4, 128, 64}, {300}, 32},
      {{1, 2, 64, 128}, {70}, 64},  // k_dim < v_dim, a padded last chunk
  };
  double worst = 0.0;
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    const DeltaRun chunked = RunDelta(k.shape, k.seq_rows, k.chunk, 10 + static_cast<uint32_t>(c));
    const DeltaRun tokens = RunDelta(k.shape, k.seq_rows, 0, 10 + static_cast<uint32_t>(c));
    const double out_err = RelativeError(chunked.out, tokens.out);
    const double state_err = RelativeError(chunked.states, tokens.states);
    EXPECT_LT(out_err, 1e-5) << "case " << c;
    EXPECT_LT(state_err, 1e-5) << "case " << c;
    worst = std::max({worst, out_err, state_err});
  }
  std::printf("chunked vs token loop: largest error %.3g relative to the largest value\n", worst);
}

// GatedDeltaRuleHead, when allowed, takes the chunked form from kDeltaChunkMinRows rows: its
// results then equal GatedDeltaRuleChunked's with kDeltaChunk bitwise, and below that (or not
// allowed) the token loop's.
TEST(GatedDeltaTest, HeadDispatchesByRows) {
  const DeltaHeadShape s{1, 1, 16, 16};
  for (const int64_t rows : {kDeltaChunkMinRows - 1, kDeltaChunkMinRows})
  for (const bool chunked : {false, true}) {
    const int64_t stride = s.qkv_stride();
    const std::vector<float> qkv = Random(static_cast<size_t>(rows * stride), 20);
    const std::vector<float> ba = Random(static_cast<size_t>(rows * 2), 21);
    const float a_log = -1.0f, dt_bias = 0.5f;
    std::vector<float> st1 = Random(256, 22), st2 = st1, out1(static_cast<size_t>(rows * 16)),
                       out2 = out1;
    GatedDeltaRuleHead(s, 0, qkv.data(), ba.data(), &a_log, &dt_bias, rows, st1.data(),
                       out1.data(), chunked);
    if (chunked && rows >= kDeltaChunkMinRows)
      GatedDeltaRuleChunked(s, 0, qkv.data(), ba.data(), &a_log, &dt_bias, rows, kDeltaChunk,
                            st2.data(), out2.data());
    else
      GatedDeltaRuleTokens(s, 0, qkv.data(), ba.data(), &a_log, &dt_bias, rows, st2.data(),
                           out2.data());
    EXPECT_EQ(out1, out2) << rows << " rows, chunked " << chunked;
    EXPECT_EQ(st1, st2) << rows << " rows, chunked " << chunked;
  }
}

}  // namespace
}  // namespace ember::cpu
