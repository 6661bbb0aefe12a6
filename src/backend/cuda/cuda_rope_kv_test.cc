// Op-level tests of the CUDA backend's RoPE (every RopeSpec type against the CPU table) and of
// its fused RopeWriteKv and RopeWriteKvAttention against the unfused ops they stand for.
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

TEST_F(CudaOpsTest, RopeAllTypes) {
  const int32_t n = 6, heads = 4, kv_heads = 2, head_dim = 64;
  for (auto type : {RopeSpec::Type::kDefault, RopeSpec::Type::kLinear, RopeSpec::Type::kLlama3}) {
    for (int32_t rotary : {64, 32}) {
      RopeSpec spec;
      spec.type = type;
      spec.head_dim = head_dim;
      spec.rotary_dim = rotary;
      spec.theta = 10000.0;
      spec.factor = type == RopeSpec::Type::kDefault ? 1.0 : 4.0;
      spec.original_max_positions = 64;
      spec.max_positions = 2048;
      auto b = Make(true);
      auto id = b->CreateRope(spec);
      ASSERT_TRUE(id.ok()) << id.status().message();
      const std::vector<float> q = Random(static_cast<size_t>(n * heads * head_dim), 10);
      const std::vector<float> k = Random(static_cast<size_t>(n * kv_heads * head_dim), 11);
      BatchPlan plan = SimplePlan(n, 1500);
      ASSERT_TRUE(b->BeginStep(plan).ok());
      Tensor qt = Upload(*b, q, {n, heads, head_dim});
      Tensor kt = Upload(*b, k, {n, kv_heads, head_dim});
      b->Rope(*id, qt, kt);
      const std::vector<float> inv = RopeInvFreq(spec);
      auto rotate = [&](const std::vector<float>& x, int32_t nh) {
        std::vector<double> out(x.begin(), x.end());
        for (int32_t t = 0; t < n; ++t)
          for (int32_t h = 0; h < nh; ++h)
            for (int32_t i = 0; i < rotary / 2; ++i) {
              const double angle = static_cast<float>(plan.positions[static_cast<size_t>(t)]) *
                                   inv[static_cast<size_t>(i)];
              const size_t base = static_cast<size_t>((t * nh + h) * head_dim);
              const double x1 = x[base + static_cast<size_t>(i)];
              const double x2 = x[base + static_cast<size_t>(i + rotary / 2)];
              out[base + static_cast<size_t>(i)] = x1 * std::cos(angle) - x2 * std::sin(angle);
              out[base + static_cast<size_t>(i + rotary / 2)] =
                  x2 * std::cos(angle) + x1 * std::sin(angle);
            }
        return out;
      };
      EXPECT_LT(RelL2(Download(*b, qt), rotate(q, heads)), 1e-5);
      EXPECT_LT(RelL2(Download(*b, kt), rotate(k, kv_heads)), 1e-5);
    }
  }
}

// RopeWriteKv (one launch) gives the q, k and pool bits of Rope then WriteKv (two launches; the
// pool seen through attention), for full and partial rotary, bf16 and f32 pools, decode and
// prefill steps.
TEST_F(CudaOpsTest, RopeWriteKvEqualsRopeThenWriteKv) {
  const int32_t heads = 4, kv_heads = 2, D = 64;
  for (int32_t rotary : {64, 32}) {
    for (bool kv_f32 : {false, true}) {
      for (int32_t n : {1, 9}) {
        std::vector<float> got[2][3];
        for (int fused = 0; fused < 2; ++fused) {
          CudaBackendOptions options;
          options.kv_f32 = kv_f32;
          options.profile_ops = true;
          auto created = CreateCudaBackend(0, options);
          ASSERT_TRUE(created.ok()) << created.status().message();
          Backend& b = **created;
          ASSERT_TRUE(b.AllocateKvPool(1, 8, 16, kv_heads, D).ok());
          RopeSpec spec;
          spec.head_dim = D;
          spec.rotary_dim = rotary;
          spec.max_positions = 256;
          const int32_t rope = b.CreateRope(spec).value();
          ASSERT_TRUE(b.BeginStep(SimplePlan(n, 40)).ok());
          Tensor q = Upload(b, Random(static_cast<size_t>(n * heads * D), 50), {n, heads, D});
          Tensor k = Upload(b, Random(static_cast<size_t>(n * kv_heads * D), 51), {n, kv_heads, D});
          Tensor v = Upload(b, Random(static_cast<size_t>(n * kv_heads * D), 52), {n, kv_heads, D});
          if (fused == 1) {
            b.RopeWriteKv(rope, 0, q, k, v);
          } else {
            b.Rope(rope, q, k);
            b.WriteKv(0, k, v);
          }
          got[fused][1] = Download(b, k);
          got[fused][2] = Download(b, q);
          Tensor out = b.Alloc({n, heads * D});
          b.Attention(AttentionParams{0, heads, kv_heads, D, 0.125f, 0, 0.f}, q, out);
          got[fused][0] = Download(b, out);
          bool saw_fused = false;
          for (const CudaOpTime& t : CudaGetOpProfile(b)) saw_fused |= t.op == "RopeWriteKv";
          EXPECT_EQ(saw_fused, fused == 1);
        }
        for (int i = 0; i < 3; ++i) {
          EXPECT_EQ(got[0][i], got[1][i])
              << "output " << i << " rotary " << rotary << " kv_f32 " << kv_f32 << " n " << n;
        }
      }
    }
  }
}

// A decode step's RopeWriteKvAttention is one "RopeAttention" launch: the same output bits as
// RopeWriteKv then Attention, and the same K/V in the pool, seen through a later step's attention
// over every position; head dims 64 and 128, GQA, contexts in one key split and in several (split
// mode), a graph-replayed repeat; without and with attention sinks. A step of two rows per
// sequence is not folded.
TEST_F(CudaOpsTest, RopeWriteKvFoldsIntoDecodeAttention) {
  const int32_t heads = 8, kv_heads = 2, seqs = 3, bs = 16;
  const std::vector<float> sink_values = {-30.f, 30.f, 0.f, 2.5f, -2.f, 8.f, 1.f, -0.5f};
  for (int config = 0; config < 4; ++config) {
    const bool with_sinks = config >= 2;
    const int32_t D = config % 2 == 0 ? 64 : 128;
    for (int32_t ctx : {37, 700}) {
      const int32_t blocks_per_seq = (ctx + 3 + bs - 1) / bs;
      std::vector<float> got[2][3];
      for (int fold = 0; fold < 2; ++fold) {
        CudaBackendOptions options;
        options.profile_ops = fold == 1;  // (profiling flushes eagerly: no graphs)
        auto created = CreateCudaBackend(0, options);
        ASSERT_TRUE(created.ok()) << created.status().message();
        Backend& b = **created;
        ASSERT_TRUE(b.AllocateKvPool(1, seqs * blocks_per_seq, bs, kv_heads, D).ok());
        RopeSpec spec;
        spec.head_dim = D;
        spec.rotary_dim = D;
        spec.max_positions = 1024;
        const int32_t rope = b.CreateRope(spec).value();
        const Tensor sinks = Weight(b, sink_values, {heads});
        AttentionParams ap{0, heads, kv_heads, D, 1.0f / 8, 0, 0.f};
        if (with_sinks) ap.sinks = &sinks;
        auto table = [&](int32_t s) {
          std::vector<int32_t> t;
          for (int32_t i = 0; i < blocks_per_seq; ++i) t.push_back(s * blocks_per_seq + i);
          return t;
        };
        // One step: len[s] tokens of sequence s from position first[s]; returns the attention.
        auto step = [&](const std::vector<int32_t>& first, const std::vector<int32_t>& len,
                        uint32_t seed, bool fused) {
          BatchPlan plan;
          plan.block_size = bs;
          for (int32_t s = 0; s < seqs; ++s)
            plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(len[s]), 1), first[s],
                             table(s), true);
          EXPECT_TRUE(b.BeginStep(plan).ok());
          const int64_t n = plan.num_tokens();
          Tensor q = Upload(b, Random(static_cast<size_t>(n * heads * D), seed), {n, heads, D});
          Tensor k =
              Upload(b, Random(static_cast<size_t>(n * kv_heads * D), seed + 1), {n, kv_heads, D});
          Tensor v =
              Upload(b, Random(static_cast<size_t>(n * kv_heads * D), seed + 2), {n, kv_heads, D});
          Tensor out = b.Alloc({n, heads * D});
          if (fused) {
            b.RopeWriteKvAttention(rope, ap, q, k, v, out);
          } else {
            b.RopeWriteKv(rope, 0, q, k, v);
            b.Attention(ap, q, out);
          }
          return Download(b, out);
        };
        // The context (the same in both runs), then two decode steps and a 2-token step.
        std::vector<int32_t> at = {ctx - 4, ctx - 1, ctx - 9};
        const std::vector<int32_t> ones(seqs, 1), twos(seqs, 2);
        (void)step(std::vector<int32_t>(seqs, 0), at, 60, false);
        got[fold][0] = step(at, ones, 70, fold == 1);
        for (int32_t& p : at) ++p;
        got[fold][1] = step(at, ones, 80, fold == 1);
        for (int32_t& p : at) ++p;
        got[fold][2] = step(at, twos, 90, fold == 1);  // two rows per sequence: never folded
        if (fold == 1) {
          int64_t folded = 0;
          for (const CudaOpTime& t : CudaGetOpProfile(b))
            if (t.op == "RopeAttention") folded = t.calls;
          EXPECT_EQ(folded, 2) << "D " << D << " sinks " << with_sinks;
        }
      }
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(got[0][i], got[1][i])
            << "D " << D << " ctx " << ctx << " step " << i << " sinks " << with_sinks;
    }
  }
}

}  // namespace
}  // namespace ember
