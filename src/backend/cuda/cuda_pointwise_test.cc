// Op-level tests of the CUDA backend's pointwise and row-wise ops against CPU twins (plain
// double-precision reference code written from the Backend interface's definitions): embedding,
// RMSNorm and AddRmsNorm (also over a bf16 delta), the elementwise ops; and the step recorder's
// launch closures (host only).
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

TEST_F(CudaOpsTest, EmbeddingBothModes) {
  const int64_t vocab = 50, d = 96;
  const std::vector<float> table = Random(static_cast<size_t>(vocab * d), 1);
  for (bool f32 : {true, false}) {
    auto b = Make(f32);
    Tensor w = Weight(*b, table, {vocab, d});
    EXPECT_EQ(w.dtype, f32 ? DType::kF32 : DType::kBF16);
    BatchPlan plan = SimplePlan(7, 0, static_cast<int32_t>(vocab));
    ASSERT_TRUE(b->BeginStep(plan).ok());
    Tensor out = b->Alloc({7, d});
    b->Embedding(w, 2.5f, out);
    std::vector<float> got = Download(*b, out);
    for (int32_t i = 0; i < 7; ++i)
      for (int64_t c = 0; c < d; ++c) {
        float v = table[static_cast<size_t>(plan.token_ids[static_cast<size_t>(i)] * d + c)];
        if (!f32) v = RoundBf16(v);
        ASSERT_EQ(got[static_cast<size_t>(i * d + c)], v * 2.5f) << i << "," << c;
      }
  }
}

TEST_F(CudaOpsTest, RmsNormAndAddRmsNorm) {
  const int64_t rows = 5, d = 300;
  const float eps = 1e-6f;
  const std::vector<float> x = Random(static_cast<size_t>(rows * d), 2);
  const std::vector<float> delta = Random(static_cast<size_t>(rows * d), 3);
  const std::vector<float> w = Random(static_cast<size_t>(d), 4);
  for (RmsNormKind kind : {RmsNormKind::kPlain, RmsNormKind::kOnePlusWeight}) {
    auto b = Make(false);
    Tensor wt = Weight(*b, w, {d});
    ASSERT_EQ(wt.dtype, DType::kF32);  // norms stay f32 in bf16 mode
    ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(rows))).ok());
    Tensor xt = Upload(*b, x, {rows, d});
    Tensor out = b->Alloc({rows, d});
    b->RmsNorm(xt, wt, eps, kind, out);
    Tensor res = Upload(*b, x, {rows, d});
    Tensor dt = Upload(*b, delta, {rows, d});
    Tensor out2 = b->Alloc({rows, d});
    b->AddRmsNorm(res, dt, wt, eps, kind, out2);
    std::vector<double> ref(x.size()), ref_res(x.size()), ref2(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0, ss2 = 0;
      for (int64_t c = 0; c < d; ++c) {
        const size_t i = static_cast<size_t>(r * d + c);
        ref_res[i] = static_cast<double>(x[i]) + delta[i];
        ss += static_cast<double>(x[i]) * x[i];
        ss2 += ref_res[i] * ref_res[i];
      }
      const double inv = 1 / std::sqrt(ss / d + eps), inv2 = 1 / std::sqrt(ss2 / d + eps);
      for (int64_t c = 0; c < d; ++c) {
        const size_t i = static_cast<size_t>(r * d + c);
        const double wc = kind == RmsNormKind::kPlain ? w[static_cast<size_t>(c)]
                                                      : 1.0 + w[static_cast<size_t>(c)];
        ref[i] = x[i] * inv * wc;
        ref2[i] = ref_res[i] * inv2 * wc;
      }
    }
    EXPECT_LT(RelL2(Download(*b, out), ref), 1e-5);
    EXPECT_LT(RelL2(Download(*b, res), ref_res), 1e-6);
    EXPECT_LT(RelL2(Download(*b, out2), ref2), 1e-5);
  }
}

// RMSNorm rows are batch-invariant: rows of a 70-row launch (RmsNormRowsKernel, 256 threads per
// row) equal the same rows normalised alone (one thread per vector), bit for bit, residual
// included: widths whose one-row block has 7, 8, 16, 20 and 32 warps, 1,000 with padding threads.
TEST_F(CudaOpsTest, RmsNormManyRowsEqualSolo) {
  for (int64_t d : {896, 1000, 2048, 2560, 4096}) {
    const int64_t rows = 70;
    const std::vector<float> x = Random(static_cast<size_t>(rows * d), 50);
    const std::vector<float> delta = Random(static_cast<size_t>(rows * d), 51);
    const std::vector<float> w = Random(static_cast<size_t>(d), 52);
    auto b = Make(false);
    Tensor wt = Weight(*b, w, {d});
    ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(rows))).ok());
    Tensor xt = Upload(*b, x, {rows, d}), dt = Upload(*b, delta, {rows, d});
    Tensor res = Upload(*b, x, {rows, d});
    Tensor out = b->Alloc({rows, d}), out_add = b->Alloc({rows, d});
    b->RmsNorm(xt, wt, 1e-5f, RmsNormKind::kPlain, out);
    b->AddRmsNorm(res, dt, wt, 1e-5f, RmsNormKind::kOnePlusWeight, out_add);
    const std::vector<float> all = Download(*b, out), all_add = Download(*b, out_add);
    const std::vector<float> all_res = Download(*b, res);
    for (int64_t r : {int64_t{0}, int64_t{33}, rows - 1}) {
      const size_t off = static_cast<size_t>(r * d), len = static_cast<size_t>(d);
      const std::vector<float> xr(x.begin() + off, x.begin() + off + len);
      const std::vector<float> dr(delta.begin() + off, delta.begin() + off + len);
      Tensor x1 = Upload(*b, xr, {1, d}), d1 = Upload(*b, dr, {1, d});
      Tensor r1 = Upload(*b, xr, {1, d});
      Tensor o1 = b->Alloc({1, d}), o1_add = b->Alloc({1, d});
      b->RmsNorm(x1, wt, 1e-5f, RmsNormKind::kPlain, o1);
      b->AddRmsNorm(r1, d1, wt, 1e-5f, RmsNormKind::kOnePlusWeight, o1_add);
      const std::vector<float> solo = Download(*b, o1), solo_add = Download(*b, o1_add);
      const std::vector<float> solo_res = Download(*b, r1);
      for (size_t i = 0; i < len; ++i) {
        ASSERT_EQ(all_res[off + i], solo_res[i]) << "residual: d " << d << " row " << r;
        ASSERT_EQ(all[off + i], solo[i]) << "d " << d << " row " << r << " col " << i;
        ASSERT_EQ(all_add[off + i], solo_add[i]) << "add: d " << d << " row " << r << " col " << i;
      }
    }
  }
}

// AddRmsNorm over a bf16 delta (AllocMatMulOutput, written by cuBLAS) gives the bits of the same
// values as an f32 delta: residual and output, one-row and rows kernels, float4 and scalar paths.
TEST_F(CudaOpsTest, AddRmsNormBf16Delta) {
  auto b = Make(false);
  const int64_t k = 128;
  for (int64_t d : {256, 258}) {
    for (int64_t rows : {33, 100}) {
      SCOPED_TRACE(testing::Message() << "d " << d << " rows " << rows);
      const std::vector<float> xin = Random(static_cast<size_t>(rows * k), 60);
      const std::vector<float> wm = Random(static_cast<size_t>(d * k), 61, 0.1f);
      const std::vector<float> x = Random(static_cast<size_t>(rows * d), 62);
      const std::vector<float> w = Random(static_cast<size_t>(d), 63);
      Tensor wmt = Weight(*b, wm, {d, k}), wt = Weight(*b, w, {d});
      ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(rows))).ok());
      Tensor delta = b->AllocMatMulOutput({rows, d});
      b->MatMul(Upload(*b, xin, {rows, k}), wmt, nullptr, delta);
      const std::vector<float> delta_values = Download(*b, delta);
      Tensor delta32 = Upload(*b, delta_values, {rows, d});
      Tensor res_a = Upload(*b, x, {rows, d}), res_b = Upload(*b, x, {rows, d});
      Tensor out_a = b->AllocMatMulInput({rows, d}), out_b = b->AllocMatMulInput({rows, d});
      Tensor f32_a = b->Alloc({rows, d}), f32_b = b->Alloc({rows, d});
      b->AddRmsNorm(res_a, delta, wt, 1e-6f, RmsNormKind::kPlain, out_a);
      b->AddRmsNorm(res_b, delta32, wt, 1e-6f, RmsNormKind::kPlain, out_b);
      EXPECT_EQ(Download(*b, res_a), Download(*b, res_b));
      EXPECT_EQ(Download(*b, out_a), Download(*b, out_b));
      b->AddRmsNorm(res_a, delta, wt, 1e-6f, RmsNormKind::kOnePlusWeight, f32_a);
      b->AddRmsNorm(res_b, delta32, wt, 1e-6f, RmsNormKind::kOnePlusWeight, f32_b);
      EXPECT_EQ(Download(*b, res_a), Download(*b, res_b));
      EXPECT_EQ(Download(*b, f32_a), Download(*b, f32_b));
    }
  }
}

TEST_F(CudaOpsTest, ElementwiseOps) {
  const int64_t rows = 3, d = 1000;
  const std::vector<float> g = Random(static_cast<size_t>(rows * d), 12, 3.0f);
  const std::vector<float> u = Random(static_cast<size_t>(rows * d), 13);
  auto b = Make(false);
  BatchPlan plan = SimplePlan(static_cast<int32_t>(rows));
  plan.logits_rows = {2, 0};
  ASSERT_TRUE(b->BeginStep(plan).ok());
  Tensor gt = Upload(*b, g, {rows, d}), ut = Upload(*b, u, {rows, d});
  Tensor silu = b->Alloc({rows, d}), gelu = b->Alloc({rows, d}), sum = Upload(*b, g, {rows, d});
  b->SiluMul(gt, ut, silu);
  b->GeluTanhMul(gt, ut, gelu);
  b->Add(sum, ut, sum);  // out aliases a
  Tensor capped = Upload(*b, g, {rows, d});
  b->Softcap(capped, 2.0f);
  Tensor gathered = b->Alloc({2, d});
  b->GatherLogitsRows(gt, gathered);
  std::vector<double> r_silu(g.size()), r_gelu(g.size()), r_sum(g.size()), r_cap(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const double x = g[i];
    r_silu[i] = x / (1 + std::exp(-x)) * u[i];
    r_gelu[i] = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    r_sum[i] = x + u[i];
    r_cap[i] = 2.0 * std::tanh(x / 2.0);
  }
  EXPECT_LT(RelL2(Download(*b, silu), r_silu), 1e-5);
  EXPECT_LT(RelL2(Download(*b, gelu), r_gelu), 1e-5);
  EXPECT_LT(RelL2(Download(*b, sum), r_sum), 1e-6);
  EXPECT_LT(RelL2(Download(*b, capped), r_cap), 1e-5);
  std::vector<float> got = Download(*b, gathered);
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + d, g.begin() + 2 * d));
  EXPECT_TRUE(std::equal(got.begin() + d, got.end(), g.begin()));
}

// Host only (runs without a GPU): the step recorder's in-place closures call, move and destroy
// their captures exactly once, also captures larger than std::function's small buffer.
TEST(InlineOpTest, CallsMovesAndDestroysCapturesOnce) {
  auto alive = std::make_shared<int>(0);  // use_count() counts the live captures
  std::array<int, 48> big{};               // 192 bytes
  big[47] = 7;
  int sum = 0;
  {
    std::vector<cuda::InlineOp> ops;
    for (int i = 0; i < 40; ++i) {  // the vector's growth moves every op recorded so far
      ops.emplace_back([alive, big, &sum, i](cudaStream_t st) {
        sum += big[47] + i + (st == nullptr ? 0 : 1000);
      });
    }
    EXPECT_EQ(alive.use_count(), 41);
    for (cuda::InlineOp& op : ops) op(nullptr);
    EXPECT_EQ(sum, 40 * 7 + 39 * 40 / 2);
    cuda::InlineOp moved = std::move(ops[0]);
    moved(nullptr);
    EXPECT_EQ(sum, 40 * 7 + 39 * 40 / 2 + 7);
    ops.back() = std::move(moved);  // destroys the closure it replaces
    EXPECT_EQ(alive.use_count(), 40);
    ops.back()(nullptr);
    EXPECT_EQ(sum, 40 * 7 + 39 * 40 / 2 + 14);
  }
  EXPECT_EQ(alive.use_count(), 1);
}

}  // namespace
}  // namespace ember
