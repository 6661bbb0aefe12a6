// Backend's fused operations (MatMulGroup, RopeWriteKv, RopeWriteKvAttention, GateUpActivation):
// their default implementations, as the CPU backend runs them, give bitwise the results of the
// unfused ops they are named for, called in order on a second backend with the same inputs.
// Decode and prefill steps, q/k/v with and without biases, both gated activations. Also the CPU's
// grouped LoraDelta against the default.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace ember {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> Read(Backend& be, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  EXPECT_TRUE(be.CopyToHost(t, out).ok());
  return out;
}

Tensor Input(Backend& be, const std::vector<float>& v, std::initializer_list<int64_t> shape) {
  Tensor t = be.Alloc(shape);
  std::copy(v.begin(), v.end(), static_cast<float*>(t.data));  // the CPU backend's host memory
  return t;
}

constexpr int64_t kHidden = 64, kHeads = 4, kKvHeads = 2, kHeadDim = 16, kInter = 96;

// The weights of one attention block and MLP, as host floats (the CPU backend keeps pointers).
struct HostLayer {
  std::vector<float> wq = Random(kHeads * kHeadDim * kHidden, 1);
  std::vector<float> wk = Random(kKvHeads * kHeadDim * kHidden, 2);
  std::vector<float> wv = Random(kKvHeads * kHeadDim * kHidden, 3);
  std::vector<float> bq = Random(kHeads * kHeadDim, 4);
  std::vector<float> bv = Random(kKvHeads * kHeadDim, 5);
  std::vector<float> w_gate = Random(kInter * kHidden, 6);
  std::vector<float> w_up = Random(kInter * kHidden, 7);
};

struct Layer {
  Tensor wq, wk, wv, bq, bv, w_gate, w_up;
  int32_t rope_id = 0;
};

Layer Upload(Backend& be, const HostLayer& h) {
  auto up = [&](const std::vector<float>& v, std::vector<int64_t> shape) {
    auto t = be.UploadWeight("w", DType::kF32, shape, v.data());
    EXPECT_TRUE(t.ok());
    return *t;
  };
  Layer l;
  l.wq = up(h.wq, {kHeads * kHeadDim, kHidden});
  l.wk = up(h.wk, {kKvHeads * kHeadDim, kHidden});
  l.wv = up(h.wv, {kKvHeads * kHeadDim, kHidden});
  l.bq = up(h.bq, {kHeads * kHeadDim});
  l.bv = up(h.bv, {kKvHeads * kHeadDim});
  l.w_gate = up(h.w_gate, {kInter, kHidden});
  l.w_up = up(h.w_up, {kInter, kHidden});
  RopeSpec spec;
  spec.head_dim = kHeadDim;
  spec.rotary_dim = kHeadDim;
  spec.max_positions = 64;
  l.rope_id = *be.CreateRope(spec);
  EXPECT_TRUE(be.AllocateKvPool(1, 8, 16, kKvHeads, kHeadDim).ok());
  return l;
}

// Two sequences of `len` tokens from position `pos` each.
BatchPlan Plan(int32_t len0, int32_t pos0, int32_t len1, int32_t pos1) {
  BatchPlan plan;
  plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(len0), 1), pos0, {0, 1}, true);
  plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(len1), 1), pos1, {2, 3}, true);
  return plan;
}

// Runs one step through the named ops (fused) or through the ops they stand for; returns q, k, v
// (before RoPE), the attention output, gate, up and act.
std::vector<std::vector<float>> RunStep(Backend& be, const Layer& l, const BatchPlan& plan,
                                        bool fused, GateActivation activation) {
  EXPECT_TRUE(be.BeginStep(plan).ok());
  const int64_t n = plan.num_tokens();
  const Tensor x = Input(be, Random(static_cast<size_t>(n * kHidden), 10), {n, kHidden});
  Tensor q = be.Alloc({n, kHeads * kHeadDim}), k = be.Alloc({n, kKvHeads * kHeadDim});
  Tensor v = be.Alloc({n, kKvHeads * kHeadDim}), att = be.Alloc({n, kHeads * kHeadDim});
  Tensor gate = be.Alloc({n, kInter}), up = be.Alloc({n, kInter}), act = be.Alloc({n, kInter});
  AttentionParams ap;
  ap.num_heads = kHeads;
  ap.num_kv_heads = kKvHeads;
  ap.head_dim = kHeadDim;
  ap.scale = 0.25f;
  std::vector<std::vector<float>> out;
  if (fused) {
    const MatMulPart qkv[] = {{&l.wq, &l.bq, q}, {&l.wk, nullptr, k}, {&l.wv, &l.bv, v}};
    be.MatMulGroup(x, qkv);
    for (const Tensor* t : {&q, &k, &v}) out.push_back(Read(be, *t));
    be.RopeWriteKvAttention(l.rope_id, ap, q.Reshape({n, kHeads, kHeadDim}), k, v, att);
    out.push_back(Read(be, att));
    be.GateUpActivation(x, l.w_gate, l.w_up, activation, gate, up, act);
  } else {
    be.MatMul(x, l.wq, &l.bq, q);
    be.MatMul(x, l.wk, nullptr, k);
    be.MatMul(x, l.wv, &l.bv, v);
    for (const Tensor* t : {&q, &k, &v}) out.push_back(Read(be, *t));
    be.Rope(l.rope_id, q.Reshape({n, kHeads, kHeadDim}), k);
    be.WriteKv(0, k, v);
    be.Attention(ap, q.Reshape({n, kHeads, kHeadDim}), att);
    out.push_back(Read(be, att));
    be.MatMul(x, l.w_gate, nullptr, gate);
    be.MatMul(x, l.w_up, nullptr, up);
    if (activation == GateActivation::kSilu) {
      be.SiluMul(gate, up, act);
    } else {
      be.GeluTanhMul(gate, up, act);
    }
  }
  for (const Tensor* t : {&gate, &up, &act}) out.push_back(Read(be, *t));
  return out;
}

TEST(FusedOpsTest, CpuDefaultsEqualTheUnfusedOps) {
  const HostLayer host;
  std::unique_ptr<Backend> backends[2] = {MakeCpuBackend({}), MakeCpuBackend({})};
  const Layer layers[2] = {Upload(*backends[0], host), Upload(*backends[1], host)};
  const char* const names[] = {"q", "k", "v", "attention", "gate", "up", "act"};
  // A prompt beside a first token, then a decode step that attends over what the first wrote.
  const BatchPlan plans[] = {Plan(9, 0, 1, 0), Plan(1, 9, 1, 1)};
  for (const GateActivation activation : {GateActivation::kSilu, GateActivation::kGeluTanh}) {
    for (const BatchPlan& plan : plans) {
      const auto unfused = RunStep(*backends[0], layers[0], plan, false, activation);
      const auto fused = RunStep(*backends[1], layers[1], plan, true, activation);
      ASSERT_EQ(fused.size(), unfused.size());
      for (size_t i = 0; i < fused.size(); ++i) {
        EXPECT_EQ(fused[i], unfused[i]) << names[i] << " rows " << plan.num_tokens();
        double sum = 0;
        for (float f : fused[i]) sum += std::fabs(f);
        EXPECT_GT(sum, 0.0) << names[i];
      }
    }
  }
}

// LoraDelta: the CPU's grouped override (one product per adapter over its rows gathered) gives
// bitwise the default's per-segment MatMul, MatMul, Add, with two adapters' segments interleaved.
TEST(FusedOpsTest, CpuGroupedLoraDeltaEqualsTheDefault) {
  std::unique_ptr<Backend> be = MakeCpuBackend({});
  constexpr int64_t kRank = 4, kOut = 48, kRows = 7;
  const std::vector<float> a0 = Random(kRank * kHidden, 20), b0 = Random(kOut * kRank, 21);
  const std::vector<float> a1 = Random(kRank * kHidden, 22), b1 = Random(kOut * kRank, 23);
  auto up = [&](const std::vector<float>& v, std::vector<int64_t> shape) {
    return *be->UploadWeight("lora", DType::kF32, shape, v.data());
  };
  const Tensor ta0 = up(a0, {kRank, kHidden}), tb0 = up(b0, {kOut, kRank});
  const Tensor ta1 = up(a1, {kRank, kHidden}), tb1 = up(b1, {kOut, kRank});
  ASSERT_TRUE(be->AllocateKvPool(1, 4, 16, kKvHeads, kHeadDim).ok());
  BatchPlan plan;
  plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(kRows), 1), 0, {0}, true);
  ASSERT_TRUE(be->BeginStep(plan).ok());
  const Tensor x = Input(*be, Random(kRows * kHidden, 24), {kRows, kHidden});
  const std::vector<float> base = Random(kRows * kOut, 25);
  // Rows 0-1 and 4 adapter 0, rows 2 and 5-6 adapter 1, row 3 none.
  const LoraSegment segments[] = {{0, 2, &ta0, &tb0}, {2, 1, &ta1, &tb1}, {4, 1, &ta0, &tb0},
                                  {5, 2, &ta1, &tb1}};
  Tensor grouped = Input(*be, base, {kRows, kOut}), plain = Input(*be, base, {kRows, kOut});
  be->LoraDelta(x, segments, grouped);
  be->Backend::LoraDelta(x, segments, plain);
  const std::vector<float> g = Read(*be, grouped), p = Read(*be, plain);
  EXPECT_EQ(g, p);
  for (size_t j = 3 * kOut; j < 4 * kOut; ++j) EXPECT_EQ(g[j], base[j]);  // row 3: no adapter
  EXPECT_NE(g, base);
}

}  // namespace
}  // namespace ember
