// Backend::MlaAttention on the CPU (weight absorption over the latent pool) against the expanded
// form in double precision: per head k = [W_uk c | rope(k_rope)], v = W_uv c, softmax attention,
// with interleaved rope dims; prefill rows of two sequences in one step, then a decode row that
// reads the latent rows an earlier step wrote (across blocks).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <tuple>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace ember {
namespace {

constexpr int64_t kHeads = 3, kNope = 8, kRope = 4, kV = 6, kLatent = 16;
constexpr int32_t kBlockSize = 4;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// The roped key/query dims in double: pairs de-interleaved, then rotate-half at `pos`.
std::vector<double> RopeRef(const float* x, int64_t pos) {
  const int64_t half = kRope / 2;
  std::vector<double> d(kRope), out(kRope);
  for (int64_t j = 0; j < half; ++j) {
    d[j] = x[2 * j];
    d[half + j] = x[2 * j + 1];
  }
  for (int64_t j = 0; j < half; ++j) {
    const double a = static_cast<double>(pos) * std::pow(10000.0, -2.0 * j / kRope);
    out[j] = d[j] * std::cos(a) - d[j + half] * std::sin(a);
    out[j + half] = d[j + half] * std::cos(a) + d[j] * std::sin(a);
  }
  return out;
}

// One sequence's tokens (their c and k_rope) as the reference sees them.
struct SeqTokens {
  std::vector<float> c, k_rope;  // [len, kLatent], [len, kRope]
};

// Expanded attention of one query row (q [heads, nope + rope], unrotated) at `pos` over
// tokens [0, pos] of `seq`; returns [heads * kV].
std::vector<double> ExpandedRef(const float* q, int64_t pos, const SeqTokens& seq,
                                const std::vector<float>& kv_b, double scale) {
  std::vector<double> out(static_cast<size_t>(kHeads * kV), 0.0);
  for (int64_t h = 0; h < kHeads; ++h) {
    const float* qh = q + h * (kNope + kRope);
    const std::vector<double> q_rot = RopeRef(qh + kNope, pos);
    const float* w = kv_b.data() + h * (kNope + kV) * kLatent;
    std::vector<double> scores;
    std::vector<std::vector<double>> values;
    for (int64_t t = 0; t <= pos; ++t) {
      const float* c = seq.c.data() + t * kLatent;
      double s = 0;
      for (int64_t j = 0; j < kNope; ++j) {
        double k = 0;
        for (int64_t r = 0; r < kLatent; ++r) k += static_cast<double>(w[j * kLatent + r]) * c[r];
        s += qh[j] * k;
      }
      const std::vector<double> k_rot = RopeRef(seq.k_rope.data() + t * kRope, t);
      for (int64_t j = 0; j < kRope; ++j) s += q_rot[j] * k_rot[j];
      scores.push_back(s * scale);
      std::vector<double> v(kV, 0.0);
      for (int64_t j = 0; j < kV; ++j)
        for (int64_t r = 0; r < kLatent; ++r) v[j] += static_cast<double>(w[(kNope + j) * kLatent + r]) * c[r];
      values.push_back(v);
    }
    double mx = -1e300, sum = 0;
    for (double s : scores) mx = std::max(mx, s);
    for (double& s : scores) sum += (s = std::exp(s - mx));
    for (size_t t = 0; t < scores.size(); ++t)
      for (int64_t j = 0; j < kV; ++j) out[h * kV + j] += scores[t] / sum * values[t][j];
  }
  return out;
}

TEST(MlaAttentionTest, AbsorbedEqualsExpanded) {
  auto be = MakeCpuBackend({});
  ASSERT_TRUE(be->TakesMla());
  ASSERT_TRUE(be->AllocateLatentKvPool(1, 8, kBlockSize, kLatent + kRope).ok());
  RopeSpec spec;
  spec.head_dim = spec.rotary_dim = kRope;
  spec.max_positions = 64;
  auto rope = be->CreateRope(spec);
  ASSERT_TRUE(rope.ok());
  const std::vector<float> kv_b = Random(static_cast<size_t>(kHeads * (kNope + kV) * kLatent), 1);
  const std::array<int64_t, 2> kv_b_shape = {kHeads * (kNope + kV), kLatent};
  auto kv_b_t = be->UploadWeight("kv_b", DType::kF32, kv_b_shape, kv_b.data());
  ASSERT_TRUE(kv_b_t.ok());
  MlaParams p;
  p.num_heads = kHeads;
  p.nope_dim = kNope;
  p.rope_dim = kRope;
  p.v_dim = kV;
  p.latent_dim = kLatent;
  p.scale = 0.3f;
  p.rope_interleave = true;
  p.kv_b = &*kv_b_t;
  const std::vector<int32_t> blocks_a = {0, 1}, blocks_b = {5, 2};
  SeqTokens seq_a, seq_b;
  // One step: its plan (sequences of (first position, length, blocks, tokens)), random inputs.
  auto step = [&](std::vector<std::tuple<int32_t, int32_t, std::vector<int32_t>, SeqTokens*>> seqs,
                  uint32_t seed) {
    BatchPlan plan;
    plan.block_size = kBlockSize;
    for (auto& [first, len, blocks, tokens] : seqs)
      plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(len), 1), first, blocks, false);
    const int64_t n = plan.num_tokens();
    std::vector<float> q = Random(static_cast<size_t>(n * kHeads * (kNope + kRope)), seed);
    std::vector<float> c = Random(static_cast<size_t>(n * kLatent), seed + 1);
    std::vector<float> k_rope = Random(static_cast<size_t>(n * kRope), seed + 2);
    const std::vector<float> q_in = q;
    int64_t row = 0;
    for (auto& [first, len, blocks, tokens] : seqs)
      for (int32_t i = 0; i < len; ++i, ++row) {
        tokens->c.insert(tokens->c.end(), c.begin() + row * kLatent, c.begin() + (row + 1) * kLatent);
        tokens->k_rope.insert(tokens->k_rope.end(), k_rope.begin() + row * kRope,
                              k_rope.begin() + (row + 1) * kRope);
      }
    ASSERT_TRUE(be->BeginStep(plan).ok());
    const Tensor tq{q.data(), DType::kF32, 3, {n, kHeads, kNope + kRope, 0}};
    const Tensor tc{c.data(), DType::kF32, 2, {n, kLatent, 0, 0}};
    const Tensor tk{k_rope.data(), DType::kF32, 2, {n, kRope, 0, 0}};
    std::vector<float> out(static_cast<size_t>(n * kHeads * kV));
    be->MlaAttention(*rope, p, tq, tc, tk, Tensor{out.data(), DType::kF32, 2, {n, kHeads * kV, 0, 0}});
    row = 0;
    for (auto& [first, len, blocks, tokens] : seqs)
      for (int32_t i = 0; i < len; ++i, ++row) {
        const std::vector<double> want =
            ExpandedRef(q_in.data() + row * kHeads * (kNope + kRope), first + i, *tokens, kv_b, p.scale);
        double num = 0, den = 0;
        for (int64_t j = 0; j < kHeads * kV; ++j) {
          const double d = out[static_cast<size_t>(row * kHeads * kV + j)] - want[static_cast<size_t>(j)];
          num += d * d;
          den += want[static_cast<size_t>(j)] * want[static_cast<size_t>(j)];
        }
        EXPECT_LT(std::sqrt(num / den), 1e-5) << "row " << row << " at position " << first + i;
      }
  };
  step({{0, 6, blocks_a, &seq_a}, {0, 5, blocks_b, &seq_b}}, 10);  // two prefills
  step({{5, 1, blocks_b, &seq_b}, {6, 2, blocks_a, &seq_a}}, 20);  // a decode row, a chunk
}

}  // namespace
}  // namespace ember
