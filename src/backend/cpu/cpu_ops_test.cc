// CPU backend ops against independent double-precision references: gpt_oss's mixture of experts
// (router bias, expert biases, clamped SwiGLU, softmax over the top k logits) and attention with
// sinks (decode and prefill rows, with and without a sliding window).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace ember {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

Tensor Weight(Backend& be, const std::vector<float>& v, std::vector<int64_t> shape) {
  auto t = be.UploadWeight("w", DType::kF32, shape, v.data());
  CHECK(t.ok()) << t.message();
  return *t;
}

double RelErr(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// transformers' GptOssTopKRouter + GptOssExperts, in double.
TEST(CpuOpsTest, MoeMlpBiasedClampedSwigluMatchesGptOss) {
  const int64_t n = 7, d = 16, inter = 24, num = 5;
  const int32_t k = 2;
  const float limit = 7.0f, alpha = 1.702f;
  auto be = MakeCpuBackend({});
  // Weights large enough that gate and up pass the clamp (|value| up to ~20).
  const std::vector<float> x = Random(static_cast<size_t>(n * d), 1, 2.0f);
  const std::vector<float> router = Random(static_cast<size_t>(num * d), 2, 1.0f);
  const std::vector<float> router_b = Random(static_cast<size_t>(num), 3, 1.0f);
  std::vector<std::vector<float>> gate, up, down, gate_b, up_b, down_b;
  MoeExperts ex;
  ex.router = Weight(*be, router, {num, d});
  ex.router_bias = Weight(*be, router_b, {num});
  for (int64_t e = 0; e < num; ++e) {
    const uint32_t s = static_cast<uint32_t>(10 * e + 10);
    gate.push_back(Random(static_cast<size_t>(inter * d), s, 1.5f));
    up.push_back(Random(static_cast<size_t>(inter * d), s + 1, 1.5f));
    down.push_back(Random(static_cast<size_t>(d * inter), s + 2, 0.3f));
    gate_b.push_back(Random(static_cast<size_t>(inter), s + 3, 2.0f));
    up_b.push_back(Random(static_cast<size_t>(inter), s + 4, 2.0f));
    down_b.push_back(Random(static_cast<size_t>(d), s + 5, 0.5f));
    ex.gate.push_back(Weight(*be, gate.back(), {inter, d}));
    ex.up.push_back(Weight(*be, up.back(), {inter, d}));
    ex.down.push_back(Weight(*be, down.back(), {d, inter}));
    ex.gate_bias.push_back(Weight(*be, gate_b.back(), {inter}));
    ex.up_bias.push_back(Weight(*be, up_b.back(), {inter}));
    ex.down_bias.push_back(Weight(*be, down_b.back(), {d}));
  }
  ex.top_k = k;
  ex.normalize = true;
  ex.activation = MoeActivation::kClampedSwiglu;
  ex.swiglu_limit = limit;
  ex.swiglu_alpha = alpha;

  std::vector<double> want(static_cast<size_t>(n * d), 0.0);
  int clamped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x.data() + i * d;
    std::vector<double> logits(static_cast<size_t>(num));
    for (int64_t e = 0; e < num; ++e) {
      double acc = router_b[static_cast<size_t>(e)];
      for (int64_t c = 0; c < d; ++c) acc += double{router[static_cast<size_t>(e * d + c)]} * xi[c];
      logits[static_cast<size_t>(e)] = acc;
    }
    std::vector<int64_t> order(static_cast<size_t>(num));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
    double z = 0;
    for (int32_t j = 0; j < k; ++j) z += std::exp(logits[order[j]] - logits[order[0]]);
    for (int32_t j = 0; j < k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      const double weight = std::exp(logits[e] - logits[order[0]]) / z;
      std::vector<double> act(static_cast<size_t>(inter));
      for (int64_t f = 0; f < inter; ++f) {
        double g = gate_b[e][f], u = up_b[e][f];
        for (int64_t c = 0; c < d; ++c) {
          g += double{gate[e][f * d + c]} * xi[c];
          u += double{up[e][f * d + c]} * xi[c];
        }
        clamped += g > limit || std::abs(u) > limit;
        g = std::min(g, double{limit});
        u = std::clamp(u, -double{limit}, double{limit});
        act[f] = (u + 1.0) * g / (1.0 + std::exp(-double{alpha} * g));
      }
      for (int64_t c = 0; c < d; ++c) {
        double y = down_b[e][c];
        for (int64_t f = 0; f < inter; ++f) y += double{down[e][c * inter + f]} * act[f];
        want[static_cast<size_t>(i * d + c)] += weight * y;
      }
    }
  }
  EXPECT_GT(clamped, 10) << "the test should exercise the clamp";
  BatchPlan plan;
  plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(n), 1), 0, {0}, false);
  ASSERT_TRUE(be->AllocateKvPool(1, 1, 16, 1, 8).ok());
  ASSERT_TRUE(be->BeginStep(plan).ok());
  Tensor xt = be->Alloc({n, d}), out = be->Alloc({n, d});
  std::memcpy(xt.data, x.data(), x.size() * sizeof(float));
  be->MoeMlp(xt, ex, out);
  std::vector<float> got(static_cast<float*>(out.data), static_cast<float*>(out.data) + n * d);
  EXPECT_LT(RelErr(got, want), 1e-5);
}

// Rows of one sequence at positions [first, first + rows) over keys [0, pos], the head's
// softmax denominator with exp(sink) added; in double.
TEST(CpuOpsTest, AttentionWithSinksMatchesReference) {
  const int32_t heads = 4, kv_heads = 2, hd = 16, group = heads / kv_heads;
  const int32_t ctx = 40, block = 16;
  const std::vector<float> sinks = {-3.0f, 0.0f, 2.5f, 30.0f};  // the last dwarfs every key
  for (int32_t window : {0, 9}) {
    for (int32_t rows : {ctx, 1}) {  // a prefill of every row, and a decode of the last
      auto be = MakeCpuBackend({});
      ASSERT_TRUE(be->AllocateKvPool(1, 4, block, kv_heads, hd).ok());
      const std::vector<float> q = Random(static_cast<size_t>(ctx * heads * hd), 5, 1.0f);
      const std::vector<float> k = Random(static_cast<size_t>(ctx * kv_heads * hd), 6, 1.0f);
      const std::vector<float> v = Random(static_cast<size_t>(ctx * kv_heads * hd), 7, 1.0f);
      const Tensor sink_t = Weight(*be, sinks, {heads});
      // Fill the KV of every position first (a prefill of all rows), then run `rows` rows.
      BatchPlan fill;
      fill.block_size = block;
      fill.AddSequence(std::vector<int32_t>(ctx, 1), 0, {0, 1, 2, 3}, false);
      ASSERT_TRUE(be->BeginStep(fill).ok());
      Tensor kt = be->Alloc({ctx, kv_heads, hd}), vt = be->Alloc({ctx, kv_heads, hd});
      std::memcpy(kt.data, k.data(), k.size() * 4);
      std::memcpy(vt.data, v.data(), v.size() * 4);
      be->WriteKv(0, kt, vt);
      const int32_t first = ctx - rows;
      BatchPlan plan;
      plan.block_size = block;
      plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(rows), 1), first, {0, 1, 2, 3},
                       false);
      ASSERT_TRUE(be->BeginStep(plan).ok());
      Tensor qt = be->Alloc({rows, heads, hd}), out = be->Alloc({rows, heads * hd});
      std::memcpy(qt.data, q.data() + static_cast<size_t>(first) * heads * hd,
                  static_cast<size_t>(rows) * heads * hd * 4);
      AttentionParams p;
      p.num_heads = heads;
      p.num_kv_heads = kv_heads;
      p.head_dim = hd;
      p.scale = 0.25f;
      p.sliding_window = window;
      p.sinks = &sink_t;
      be->Attention(p, qt, out);
      std::vector<double> want(static_cast<size_t>(rows * heads * hd), 0.0);
      for (int32_t r = 0; r < rows; ++r) {
        const int32_t pos = first + r;
        const int32_t lo = window > 0 ? std::max(0, pos - window + 1) : 0;
        for (int32_t h = 0; h < heads; ++h) {
          const int32_t kvh = h / group;
          std::vector<double> s;
          double m = sinks[static_cast<size_t>(h)];
          for (int32_t t = lo; t <= pos; ++t) {
            double dot = 0;
            for (int32_t c = 0; c < hd; ++c)
              dot += double{q[static_cast<size_t>((pos * heads + h) * hd + c)]} *
                     k[static_cast<size_t>((t * kv_heads + kvh) * hd + c)];
            s.push_back(dot * p.scale);
            m = std::max(m, s.back());
          }
          double z = std::exp(sinks[static_cast<size_t>(h)] - m);
          for (double& e : s) z += (e = std::exp(e - m));
          for (int32_t c = 0; c < hd; ++c) {
            double acc = 0;
            for (int32_t t = lo; t <= pos; ++t)
              acc += s[static_cast<size_t>(t - lo)] *
                     v[static_cast<size_t>((t * kv_heads + kvh) * hd + c)];
            want[static_cast<size_t>((r * heads + h) * hd + c)] = acc / z;
          }
        }
      }
      const float* o = static_cast<const float*>(out.data);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(o[i], want[i], 1e-5 + 1e-5 * std::abs(want[i]))
            << "window " << window << " rows " << rows << " element " << i;
    }
  }
}

}  // namespace
}  // namespace ember
