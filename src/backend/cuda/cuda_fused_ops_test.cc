// The CUDA backend's fused operations (MatMulGroup, RopeWriteKv, RopeWriteKvAttention,
// GateUpActivation) against their CPU twins (the CPU backend's default compositions of the unfused
// ops), on the launches each takes by step shape; and decode steps of them replayed from captured
// CUDA graphs against op-by-op launches.
// Tolerances (relative L2): f32 compute mode 1e-5; bf16 mode 1e-2 vs the unrounded reference
// and 1e-5 vs a reference over bf16-rounded operands. Skips when no CUDA device is present (CI
// has none). One of the sources of the cuda_ops_test binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_test_util.h"
#include "backend/cuda/gemm_skinny.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/step_recorder.h"
#include "backend/moe_route.h"
#include "backend/rope_table.h"
#include "util/half.h"

namespace ember {
namespace {

using namespace cuda_test;  // the fixture and helpers shared with the other GPU test sources

// Decode steps replayed from CUDA graphs give bit-identical results to op-by-op launches, with
// fresh inputs each step (the graph reads the re-uploaded plan and activations).
TEST_F(CudaOpsTest, GraphReplayMatchesEager) {
  const int32_t heads = 8, kv_heads = 2, D = 64, hidden = heads * D;
  const std::vector<float> wq = Random(static_cast<size_t>(hidden * hidden), 20, 0.05f);
  const std::vector<float> wq2 = Random(static_cast<size_t>(hidden * hidden), 22, 0.05f);
  const std::vector<float> norm_w = Random(static_cast<size_t>(hidden), 21);
  RopeSpec spec;
  spec.head_dim = D;
  spec.rotary_dim = D;
  spec.max_positions = 256;
  // 3 rows: the tensor-core decode GEMM; 24: the skinny GEMM, a MatMulGroup of h as one op on two
  // streams (captured with the fork and join). Both: the RoPE-fused decode attention.
  for (const int32_t seqs : {3, 24}) {
    SCOPED_TRACE(testing::Message() << "rows " << seqs);
    std::vector<std::vector<float>> outputs[2];
    CudaGraphStats stats[2];
    for (int graphs = 0; graphs < 2; ++graphs) {
      CudaBackendOptions options;
      options.cuda_graphs = graphs == 1;
      auto created = CreateCudaBackend(0, options);
      ASSERT_TRUE(created.ok());
      Backend& b = **created;
      Tensor w = Weight(b, wq, {hidden, hidden}), w2 = Weight(b, wq2, {hidden, hidden});
      Tensor nw = Weight(b, norm_w, {hidden});
      ASSERT_TRUE(b.AllocateKvPool(1, seqs * 16, 16, kv_heads, D).ok());
      const int32_t rope = b.CreateRope(spec).value();
      for (int32_t step = 0; step < 8; ++step) {
        BatchPlan plan;
        for (int32_t s = 0; s < seqs; ++s) {
          std::vector<int32_t> blocks(16);
          std::iota(blocks.begin(), blocks.end(), s * 16);
          plan.AddSequence({1}, step + s, blocks, true);
        }
        ASSERT_TRUE(b.BeginStep(plan).ok());
        Tensor x =
            Upload(b, Random(static_cast<size_t>(seqs * hidden), 100 + step), {seqs, hidden});
        Tensor k = Upload(b, Random(static_cast<size_t>(seqs * kv_heads * D), 200 + step),
                          {seqs, kv_heads, D});
        Tensor v = Upload(b, Random(static_cast<size_t>(seqs * kv_heads * D), 300 + step),
                          {seqs, kv_heads, D});
        Tensor q = b.Alloc({seqs, hidden}), attn = b.Alloc({seqs, hidden});
        Tensor h = b.Alloc({seqs, hidden}), logits = b.Alloc({seqs, hidden});
        Tensor q2 = b.Alloc({seqs, hidden});
        b.RmsNorm(x, nw, 1e-6f, RmsNormKind::kPlain, h);
        const MatMulPart group[] = {{&w, nullptr, q}, {&w2, nullptr, q2}};
        b.MatMulGroup(h, group);
        AttentionParams p{0, heads, kv_heads, D, 0.125f, 0, 0.f};
        b.RopeWriteKvAttention(rope, p, q.Reshape({seqs, heads, D}), k, v, attn);
        b.AddRmsNorm(x, attn, nw, 1e-6f, RmsNormKind::kPlain, h);
        b.GatherLogitsRows(h, logits);
        outputs[graphs].push_back(Download(b, logits));
        outputs[graphs].push_back(Download(b, q2));
      }
      stats[graphs] = CudaGetGraphStats(b);
    }
    EXPECT_EQ(stats[0].captures + stats[0].replays, 0);
    EXPECT_GE(stats[1].replays, 6) << "captures " << stats[1].captures;
    for (size_t i = 0; i < outputs[0].size(); ++i)
      EXPECT_EQ(outputs[0][i], outputs[1][i]) << "step " << i / 2 << (i % 2 ? " q2" : " logits");
  }
}


// One layer's named fused ops on the CUDA backend (bf16 mode) and on the CPU backend (f32, the
// unfused ops in order): q/k/v, the attention output and gate/up/act agree within the bf16
// tolerance, for a one-row decode step (the GEMV: gate/up and the activation as one launch; the
// RoPE-fused decode attention), a 4-row step of four sequences (the tensor-core GEMM; folded
// attention) and a 40-row prompt (cuBLAS / the skinny GEMM, two streams; RopeWriteKv then
// Attention). The profile shows the fused launches where the step shape takes them.
TEST_F(CudaOpsTest, NamedFusedOpsMatchCpuTwin) {
  constexpr int64_t kHidden = 512, kHeads = 8, kKvHeads = 2, kD = 64, kInter = 1024;
  const std::vector<float> wq = Random(kHeads * kD * kHidden, 1, 0.05f);
  const std::vector<float> wk = Random(kKvHeads * kD * kHidden, 2, 0.05f);
  const std::vector<float> wv = Random(kKvHeads * kD * kHidden, 3, 0.05f);
  const std::vector<float> bq = Random(kHeads * kD, 4);
  const std::vector<float> w_gate = Random(kInter * kHidden, 5, 0.05f);
  const std::vector<float> w_up = Random(kInter * kHidden, 6, 0.05f);
  struct Case {
    int32_t seqs, rows;  // rows per sequence
    const char* rope_op;
    const char* gate_up_op;
  };
  for (const Case c : {Case{1, 1, "RopeAttention", "MatMul(gemv)+act"},
                       Case{4, 1, "RopeAttention", "MatMul(gemm)"},
                       Case{1, 40, "RopeWriteKv", "MatMul(cublas)"}}) {
    for (const GateActivation act : {GateActivation::kSilu, GateActivation::kGeluTanh}) {
      SCOPED_TRACE(testing::Message() << "seqs " << c.seqs << " rows " << c.rows << " gelu "
                                      << (act == GateActivation::kGeluTanh));
      std::vector<std::vector<float>> got[2];
      std::vector<CudaOpTime> profile;
      for (int cuda = 0; cuda < 2; ++cuda) {
        std::unique_ptr<Backend> be;
        if (cuda == 1) {
          CudaBackendOptions options;
          options.profile_ops = true;
          be = std::move(CreateCudaBackend(0, options)).value();
        } else {
          be = MakeCpuBackend({});
        }
        Backend& b = *be;
        const Tensor twq = Weight(b, wq, {kHeads * kD, kHidden});
        const Tensor twk = Weight(b, wk, {kKvHeads * kD, kHidden});
        const Tensor twv = Weight(b, wv, {kKvHeads * kD, kHidden});
        const Tensor tbq = Weight(b, bq, {kHeads * kD});
        const Tensor tg = Weight(b, w_gate, {kInter, kHidden});
        const Tensor tu = Weight(b, w_up, {kInter, kHidden});
        ASSERT_TRUE(b.AllocateKvPool(1, 4 * c.seqs, 16, kKvHeads, kD).ok());
        RopeSpec spec;
        spec.head_dim = kD;
        spec.rotary_dim = kD;
        spec.max_positions = 128;
        const int32_t rope = b.CreateRope(spec).value();
        BatchPlan plan;
        for (int32_t s = 0; s < c.seqs; ++s)
          plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(c.rows), 1), 0,
                           {4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3}, true);
        ASSERT_TRUE(b.BeginStep(plan).ok());
        const int64_t n = plan.num_tokens();
        const std::vector<float> xh = Random(static_cast<size_t>(n * kHidden), 7);
        Tensor x = b.Alloc({n, kHidden});
        if (cuda == 1) {
          ASSERT_TRUE(CudaCopyFromHost(b, xh, x).ok());
        } else {
          std::copy(xh.begin(), xh.end(), static_cast<float*>(x.data));
        }
        Tensor q = b.Alloc({n, kHeads * kD}), k = b.Alloc({n, kKvHeads * kD});
        Tensor v = b.Alloc({n, kKvHeads * kD}), att = b.Alloc({n, kHeads * kD});
        Tensor gate = b.AllocMatMulOutput({n, kInter}), up = b.AllocMatMulOutput({n, kInter});
        Tensor out = b.AllocMatMulInput({n, kInter});
        const MatMulPart qkv[] = {{&twq, &tbq, q}, {&twk, nullptr, k}, {&twv, nullptr, v}};
        b.MatMulGroup(x, qkv);
        for (const Tensor* t : {&q, &k, &v}) got[cuda].push_back(Download(b, *t));
        AttentionParams ap{0, kHeads, kKvHeads, kD, 0.125f, 0, 0.f};
        b.RopeWriteKvAttention(rope, ap, q.Reshape({n, kHeads, kD}), k, v, att);
        got[cuda].push_back(Download(b, att));
        b.GateUpActivation(x, tg, tu, act, gate, up, out);
        for (const Tensor* t : {&gate, &up, &out}) got[cuda].push_back(Download(b, *t));
        if (cuda == 1) profile = CudaGetOpProfile(b);
      }
      const char* const names[] = {"q", "k", "v", "attention", "gate", "up", "act"};
      for (size_t i = 0; i < got[0].size(); ++i) {
        const std::vector<double> want(got[0][i].begin(), got[0][i].end());
        EXPECT_LT(RelL2(got[1][i], want), 2e-2) << names[i];
      }
      auto calls = [&](const char* op) {
        for (const CudaOpTime& t : profile)
          if (t.op == op) return t.calls;
        return int64_t{0};
      };
      EXPECT_EQ(calls(c.rope_op), 1);
      EXPECT_GE(calls(c.gate_up_op), 1);
      if (std::string(c.gate_up_op) == "MatMul(gemv)+act") {
        EXPECT_EQ(calls("SiluMul") + calls("GeluTanhMul"), 0);
      }
    }
  }
}

}  // namespace
}  // namespace ember
