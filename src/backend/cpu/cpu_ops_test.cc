// CPU backend ops against independent double-precision references: gpt_oss's mixture of experts
// (router bias, expert biases, clamped SwiGLU, softmax over the top k logits) and attention with
// sinks (decode and prefill rows, with and without a sliding window); attention over each
// quantized KV dtype (kv_quant.h) against float32 attention and against float32 attention over
// the dequantized rows, and block copies of a quantized pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kv_dequant.h"
#include "backend/kv_quant.h"

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


// One layer's attention (all rows of a `ctx`-token sequence, or only its last row) with the
// pool in `dtype`; k and v are written first by a prefill of every position.
std::vector<float> QuantAttention(KvDType dtype, bool rotate, int32_t hd, const std::vector<float>& q,
                                  const std::vector<float>& k, const std::vector<float>& v,
                                  int32_t rows) {
  const int32_t heads = 8, kv_heads = 2, ctx = 150, block = 16, blocks = 10;
  auto be = MakeCpuBackend({});
  KvFormat format;
  format.layers = {dtype};
  format.rotate_int4 = rotate;
  CHECK(be->SetKvFormat(format, hd).ok());
  CHECK(be->AllocateKvPool(1, blocks, block, kv_heads, hd).ok());
  std::vector<int32_t> table(blocks);
  for (int32_t b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = blocks - 1 - b;  // scattered
  BatchPlan fill;
  fill.block_size = block;
  fill.AddSequence(std::vector<int32_t>(ctx, 1), 0, table, false);
  CHECK(be->BeginStep(fill).ok());
  Tensor kt = be->Alloc({ctx, kv_heads, hd}), vt = be->Alloc({ctx, kv_heads, hd});
  std::memcpy(kt.data, k.data(), k.size() * 4);
  std::memcpy(vt.data, v.data(), v.size() * 4);
  be->WriteKv(0, kt, vt);
  const int32_t first = ctx - rows;
  BatchPlan plan;
  plan.block_size = block;
  plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(rows), 1), first, table, false);
  CHECK(be->BeginStep(plan).ok());
  Tensor qt = be->Alloc({rows, heads, hd}), out = be->Alloc({rows, heads * hd});
  std::memcpy(qt.data, q.data() + static_cast<size_t>(first) * heads * hd,
              static_cast<size_t>(rows) * heads * hd * 4);
  AttentionParams p;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  be->Attention(p, qt, out);
  const float* o = static_cast<const float*>(out.data);
  return std::vector<float>(o, o + rows * heads * hd);
}

// rows [n, hd] through the dtype's round trip (rotated and back for rotated int4).
std::vector<float> Dequantized(KvDType dtype, bool rotate, int32_t hd, std::vector<float> x) {
  std::vector<uint8_t> row(static_cast<size_t>(KvRowBytes(dtype, hd)));
  for (size_t at = 0; at < x.size(); at += static_cast<size_t>(hd)) {
    if (rotate) HadamardRotate(x.data() + at, hd);
    QuantizeKvRow(dtype, x.data() + at, hd, row.data());
    DequantizeKvRow(dtype, row.data(), hd, x.data() + at);
    if (rotate) HadamardRotate(x.data() + at, hd);
  }
  return x;
}

double RelRms(const std::vector<float>& got, const std::vector<float>& want) {
  std::vector<double> w(want.begin(), want.end());
  return RelErr(got, w);
}

TEST(CpuOpsTest, QuantizedKvAttentionWithinToleranceOfF32) {
  struct Case {
    KvDType dtype;
    bool rotate;
    double tolerance;  // relative RMS error of the outputs vs float32 KV
  };
  const Case cases[] = {{KvDType::kBF16, false, 0.01}, {KvDType::kF16, false, 0.002},
                        {KvDType::kInt8, false, 0.02}, {KvDType::kFP8, false, 0.06},
                        {KvDType::kInt4, true, 0.2},   {KvDType::kInt4, false, 0.25}};
  for (int32_t hd : {16, 64}) {
    const int32_t heads = 8, kv_heads = 2, ctx = 150;
    const std::vector<float> q = Random(static_cast<size_t>(ctx * heads * hd), 11, 1.0f);
    std::vector<float> k = Random(static_cast<size_t>(ctx * kv_heads * hd), 12, 1.0f);
    const std::vector<float> v = Random(static_cast<size_t>(ctx * kv_heads * hd), 13, 1.0f);
    for (size_t i = 3; i < k.size(); i += static_cast<size_t>(hd)) k[i] *= 8.0f;  // an outlier channel
    for (int32_t rows : {ctx, 1}) {
      const std::vector<float> f32 = QuantAttention(KvDType::kF32, true, hd, q, k, v, rows);
      for (const Case& c : cases) {
        const std::string what = std::string(KvDTypeName(c.dtype)) + (c.rotate ? "" : " unrotated") +
                                 " hd " + std::to_string(hd) + " rows " + std::to_string(rows);
        const std::vector<float> got = QuantAttention(c.dtype, c.rotate, hd, q, k, v, rows);
        EXPECT_LT(RelRms(got, f32), c.tolerance) << what;
        EXPECT_GT(RelRms(got, f32), 0.0) << what << ": nothing was quantized";
        // The kernel reads exactly the stored values: float32 attention over the dequantized
        // rows gives the same outputs up to float rounding (rotation: the sums' order).
        const bool rot = c.rotate && c.dtype == KvDType::kInt4;
        const std::vector<float> ref =
            QuantAttention(KvDType::kF32, true, hd, q, Dequantized(c.dtype, rot, hd, k),
                           Dequantized(c.dtype, rot, hd, v), rows);
        EXPECT_LT(RelRms(got, ref), rot ? 1e-5 : 1e-6) << what;
      }
    }
  }
}

TEST(CpuOpsTest, QuantizedKvBlockCopiesAndSizes) {
  const int32_t hd = 32, kv_heads = 2, block = 16;
  auto be = MakeCpuBackend({});
  KvFormat format;
  format.layers = {KvDType::kBF16, KvDType::kInt8, KvDType::kInt4};
  ASSERT_TRUE(be->SetKvFormat(format, hd).ok());
  EXPECT_EQ(be->KvTokenBytes(3, kv_heads, hd), 2 * kv_heads * (2 * hd + (hd + 4) + (hd / 2 + 2)));
  EXPECT_EQ(be->KvFormatText(hd), "bf16 (layers 0), int8 (1), int4 (2)");
  ASSERT_TRUE(be->AllocateKvPool(3, 4, block, kv_heads, hd).ok());
  EXPECT_EQ(be->KvBlockBytes(), block * be->KvTokenBytes(3, kv_heads, hd));
  std::vector<uint8_t> bytes(static_cast<size_t>(be->KvBlockBytes()));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_TRUE(be->CopyKvBlockFromHost(2, bytes).ok());
  std::vector<uint8_t> back(bytes.size());
  ASSERT_TRUE(be->CopyKvBlockToHost(2, back).ok());
  EXPECT_EQ(back, bytes);
  auto other = MakeCpuBackend({});
  format.layers = {KvDType::kInt4};
  const Status st = other->SetKvFormat(format, 48);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--kv-cache-dtype int4"), std::string::npos) << st.message();
}

// A recurrent-state slot to host memory and back (the prompt cache's state checkpoints): the
// bytes round-trip, CopyStateSlot moves them between slots, and a wrong slot or size is refused.
TEST(CpuOpsTest, StateSlotHostCopies) {
  auto be = MakeCpuBackend({});
  const int64_t floats = 40;
  ASSERT_TRUE(be->AllocateStateSlots(3, floats).ok());
  std::vector<uint8_t> bytes(static_cast<size_t>(floats) * 4);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 5 + 3);
  ASSERT_TRUE(be->CopyStateSlotFromHost(1, bytes).ok());
  ASSERT_TRUE(be->CopyStateSlot(1, 2).ok());
  std::vector<uint8_t> back(bytes.size());
  ASSERT_TRUE(be->CopyStateSlotToHost(2, back).ok());
  EXPECT_EQ(back, bytes);
  ASSERT_TRUE(be->CopyStateSlotToHost(0, back).ok());
  EXPECT_EQ(back, std::vector<uint8_t>(bytes.size(), 0));  // untouched slot: zeros
  EXPECT_FALSE(be->CopyStateSlotToHost(3, back).ok());
  std::vector<uint8_t> short_buffer(bytes.size() - 4);
  EXPECT_FALSE(be->CopyStateSlotFromHost(0, short_buffer).ok());
}

// The attention's AVX2 reader gives DequantizeKvRow's bits for every dtype and head dim (random
// rows quantized by the reference, and every FP8 byte).
TEST(CpuOpsTest, FastKvDequantEqualsTheReference) {
  for (KvDType t : {KvDType::kF32, KvDType::kBF16, KvDType::kF16, KvDType::kInt8, KvDType::kFP8,
                    KvDType::kInt4}) {
    for (int32_t hd : {8, 16, 24, 32, 64, 128, 12}) {
      if (!KvHeadDimUnsupported(t, hd).empty()) continue;
      for (uint32_t seed = 0; seed < 20; ++seed) {
        const std::vector<float> x = Random(static_cast<size_t>(hd), seed + 100, 3.0f);
        std::vector<uint8_t> row(static_cast<size_t>(KvRowBytes(t, hd)));
        QuantizeKvRow(t, x.data(), hd, row.data());
        if (t == KvDType::kFP8)
          for (int32_t j = 0; j < hd; ++j) row[static_cast<size_t>(j)] = static_cast<uint8_t>(seed * 13 + j * 7);
        std::vector<float> want(static_cast<size_t>(hd)), got(static_cast<size_t>(hd));
        DequantizeKvRow(t, row.data(), hd, want.data());
        cpu::DequantizeKvRowFast(t, row.data(), hd, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
            << KvDTypeName(t) << " hd " << hd << " seed " << seed;
      }
    }
  }
}

}  // namespace
}  // namespace ember
