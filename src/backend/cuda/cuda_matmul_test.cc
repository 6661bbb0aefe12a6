// Op-level tests of the CUDA backend's MatMul and MatMulGroup against CPU twins: the batch-1 GEMV,
// the batch-invariant tensor-core GEMM, cuBLAS and the skinny wgmma GEMM, their operand types
// (bf16 AllocMatMulInput / AllocMatMulOutput), groups of parts over one x, graph replay.
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

TEST_F(CudaOpsTest, MatMulOperandTypes) {
  {
    auto f32 = Make(true);
    auto inv = MakeInvariant();
    for (Backend* be : {f32.get(), inv.get()}) {
      ASSERT_TRUE(be->BeginStep(SimplePlan(64)).ok());
      EXPECT_EQ(be->AllocMatMulInput({64, 32}).dtype, DType::kF32);
      EXPECT_EQ(be->AllocMatMulOutput({64, 32}).dtype, DType::kF32);
    }
  }
  auto b = Make(false);
  ASSERT_TRUE(b->BeginStep(SimplePlan(64)).ok());
  // 8 rows: the GEMV / decode GEMM rows.
  EXPECT_EQ(b->AllocMatMulInput({8, 32}).dtype, DType::kF32);
  EXPECT_EQ(b->AllocMatMulInput({9, 32}).dtype, DType::kBF16);
  EXPECT_EQ(b->AllocMatMulOutput({8, 32}).dtype, DType::kF32);
  EXPECT_EQ(b->AllocMatMulOutput({9, 32}).dtype, DType::kBF16);
}

// AllocMatMulInput's writers (RmsNorm, AddRmsNorm, SiluMul, GeluTanhMul) store the bf16 rounding
// (RN) of the f32 result, and MatMul over it gives the bits of MatMul over the f32 buffer (which
// converts x itself).
TEST_F(CudaOpsTest, MatMulInputBf16) {
  auto b = Make(false);
  // d = 300: the float4 paths; 301 (RMSNorm) and 33 x 7 (activations): the scalar ones.
  for (int64_t d : {300, 301}) {
    const int64_t rows = 33, m = 72;
    const std::vector<float> x = Random(static_cast<size_t>(rows * d), 40);
    const std::vector<float> delta = Random(static_cast<size_t>(rows * d), 41);
    const std::vector<float> w = Random(static_cast<size_t>(d), 42);
    const std::vector<float> wm = Random(static_cast<size_t>(m * d), 43, 0.05f);
    auto be = Make(false);
    Tensor wt = Weight(*be, w, {d});
    Tensor wmt = Weight(*be, wm, {m, d});
    ASSERT_TRUE(be->BeginStep(SimplePlan(static_cast<int32_t>(rows))).ok());
    Tensor xt = Upload(*be, x, {rows, d});
    Tensor f32_out = be->Alloc({rows, d});
    Tensor bf16_out = be->AllocMatMulInput({rows, d});
    ASSERT_EQ(bf16_out.dtype, DType::kBF16);
    be->RmsNorm(xt, wt, 1e-6f, RmsNormKind::kPlain, f32_out);
    be->RmsNorm(xt, wt, 1e-6f, RmsNormKind::kPlain, bf16_out);
    Tensor mm_f32 = be->Alloc({rows, m}), mm_bf16 = be->Alloc({rows, m});
    be->MatMul(f32_out, wmt, nullptr, mm_f32);
    be->MatMul(bf16_out, wmt, nullptr, mm_bf16);
    // AddRmsNorm twice over the same residual: the second adds delta again, so each starts from
    // its own copy.
    Tensor res_a = Upload(*be, x, {rows, d}), res_b = Upload(*be, x, {rows, d});
    Tensor dt = Upload(*be, delta, {rows, d});
    Tensor add_f32 = be->Alloc({rows, d});
    Tensor add_bf16 = be->AllocMatMulInput({rows, d});
    be->AddRmsNorm(res_a, dt, wt, 1e-6f, RmsNormKind::kOnePlusWeight, add_f32);
    be->AddRmsNorm(res_b, dt, wt, 1e-6f, RmsNormKind::kOnePlusWeight, add_bf16);
    const std::vector<float> want = Download(*be, f32_out), got = Download(*be, bf16_out);
    const std::vector<float> want_add = Download(*be, add_f32), got_add = Download(*be, add_bf16);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i], RoundBf16(want[i])) << "RmsNorm d " << d << " element " << i;
      ASSERT_EQ(got_add[i], RoundBf16(want_add[i])) << "AddRmsNorm d " << d << " element " << i;
    }
    EXPECT_EQ(Download(*be, res_a), Download(*be, res_b));
    const std::vector<float> want_mm = Download(*be, mm_f32), got_mm = Download(*be, mm_bf16);
    for (size_t i = 0; i < want_mm.size(); ++i) ASSERT_EQ(got_mm[i], want_mm[i]) << i;
  }
  for (std::array<int64_t, 2> shape : {std::array<int64_t, 2>{33, 7}, {40, 256}}) {
    const int64_t rows = shape[0], cols = shape[1];
    const std::vector<float> gate = Random(static_cast<size_t>(rows * cols), 44, 3.0f);
    const std::vector<float> up = Random(static_cast<size_t>(rows * cols), 45);
    for (bool gelu : {false, true}) {
      ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(rows))).ok());
      Tensor g = Upload(*b, gate, {rows, cols}), u = Upload(*b, up, {rows, cols});
      Tensor f32_out = b->Alloc({rows, cols});
      Tensor bf16_out = b->AllocMatMulInput({rows, cols});
      ASSERT_EQ(bf16_out.dtype, DType::kBF16);
      if (gelu) {
        b->GeluTanhMul(g, u, f32_out);
        b->GeluTanhMul(g, u, bf16_out);
      } else {
        b->SiluMul(g, u, f32_out);
        b->SiluMul(g, u, bf16_out);
      }
      const std::vector<float> want = Download(*b, f32_out), got = Download(*b, bf16_out);
      for (size_t i = 0; i < want.size(); ++i) {
        const double a = gelu ? 0.5 * gate[i] *
                                    (1 + std::tanh(0.7978845608028654 *
                                                   (gate[i] + 0.044715 * std::pow(gate[i], 3))))
                              : gate[i] / (1 + std::exp(-static_cast<double>(gate[i])));
        ASSERT_NEAR(want[i], a * up[i], 1e-5 * (1 + std::fabs(a * up[i]))) << i;
        ASSERT_EQ(got[i], RoundBf16(want[i])) << (gelu ? "gelu " : "silu ") << i;
      }
    }
  }
}

// cuBLAS writes a bf16 AllocMatMulOutput gate/up (within a rounding of the f32 result) and the
// gated activations read them: act(g) * u over the stored bf16 values, for the float4 (m 72) and
// the scalar (m 75) paths, into f32 and bf16 outputs.
TEST_F(CudaOpsTest, MatMulGateUpBf16) {
  const DType wide = DType::kBF16;
  auto b = Make(false);
  const int64_t k = 256;
  for (int64_t m : {72, 75}) {
    for (int64_t rows : {33, 300}) {
      SCOPED_TRACE(testing::Message() << "m " << m << " rows " << rows);
      const std::vector<float> x = Random(static_cast<size_t>(rows * k), 50);
      const std::vector<float> wg = Random(static_cast<size_t>(m * k), 51, 0.2f);
      const std::vector<float> wu = Random(static_cast<size_t>(m * k), 52, 0.1f);
      Tensor wgt = Weight(*b, wg, {m, k}), wut = Weight(*b, wu, {m, k});
      ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(rows))).ok());
      Tensor xt = Upload(*b, x, {rows, k});
      Tensor g32 = b->Alloc({rows, m});
      Tensor g = b->AllocMatMulOutput({rows, m}), u = b->AllocMatMulOutput({rows, m});
      ASSERT_EQ(g.dtype, wide);
      b->MatMul(xt, wgt, nullptr, g32);
      b->MatMul(xt, wgt, nullptr, g);
      b->MatMul(xt, wut, nullptr, u);
      Tensor silu = b->Alloc({rows, m}), gelu = b->Alloc({rows, m});
      Tensor silu16 = b->AllocMatMulInput({rows, m});
      b->SiluMul(g, u, silu);
      b->GeluTanhMul(g, u, gelu);
      b->SiluMul(g, u, silu16);
      const std::vector<float> want_g = Download(*b, g32), got_g = Download(*b, g);
      const std::vector<float> got_u = Download(*b, u);
      const std::vector<float> got_silu = Download(*b, silu), got_gelu = Download(*b, gelu);
      const std::vector<float> got_silu16 = Download(*b, silu16);
      for (size_t i = 0; i < want_g.size(); ++i) {
        ASSERT_NEAR(got_g[i], want_g[i], std::ldexp(std::fabs(want_g[i]), -8) + 1e-6) << i;
        if (wide == DType::kBF16) {
          ASSERT_EQ(got_g[i], RoundBf16(got_g[i])) << i;
        }
        const double gi = got_g[i], ui = got_u[i];
        const double s = gi / (1 + std::exp(-gi)) * ui;
        const double t =
            0.5 * gi * (1 + std::tanh(0.7978845608028654 * (gi + 0.044715 * gi * gi * gi))) * ui;
        ASSERT_NEAR(got_silu[i], s, 1e-5 * (1 + std::fabs(s))) << i;
        ASSERT_NEAR(got_gelu[i], t, 1e-5 * (1 + std::fabs(t))) << i;
        ASSERT_EQ(got_silu16[i], RoundBf16(got_silu[i])) << i;
      }
    }
  }
}

// A MatMulGroup of one x past the decode GEMMs (q/k/v, gate/up) runs as one op on two streams:
// every output is bitwise that of the same MatMul alone, for an f32 and a bf16 x, skinny
// (m <= 1,024, up to 256 rows) and cuBLAS parts, a bias, a bf16 output, and a fourth MatMul of
// the same x after the group.
TEST_F(CudaOpsTest, MatMulSharedXGroupsEqualSingles) {
  auto b = Make(false);
  const int64_t k = 512;
  const int64_t ms[4] = {2048, 512, 320, 1024};
  std::vector<Tensor> ws;
  for (int i = 0; i < 4; ++i)
    ws.push_back(Weight(*b, Random(static_cast<size_t>(ms[i] * k), 70 + i, 0.05f), {ms[i], k}));
  const Tensor bias = Weight(*b, Random(static_cast<size_t>(ms[2]), 75), {ms[2]});
  for (int64_t rows : {128, 300}) {
    for (bool bf16_x : {false, true}) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " bf16 x " << bf16_x);
      const std::vector<float> x = Random(static_cast<size_t>(rows * k), 80);
      ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(rows))).ok());
      auto upload_x = [&] {
        Tensor t = bf16_x ? b->AllocMatMulInput({rows, k}) : b->Alloc({rows, k});
        EXPECT_TRUE(CudaCopyFromHost(*b, x, t).ok());
        return t;
      };
      auto outs = [&] {
        return std::vector<Tensor>{b->Alloc({rows, ms[0]}), b->Alloc({rows, ms[1]}),
                                   b->Alloc({rows, ms[2]}), b->AllocMatMulOutput({rows, ms[3]})};
      };
      const Tensor xg = upload_x();
      ASSERT_EQ(xg.dtype, bf16_x ? DType::kBF16 : DType::kF32);
      const std::vector<Tensor> grouped = outs(), single = outs();
      const MatMulPart group[] = {{&ws[0], nullptr, grouped[0]},
                                  {&ws[1], nullptr, grouped[1]},
                                  {&ws[2], &bias, grouped[2]}};
      b->MatMulGroup(xg, group);
      b->MatMul(xg, ws[3], nullptr, grouped[3]);
      for (int i = 0; i < 4; ++i) b->MatMul(upload_x(), ws[i], i == 2 ? &bias : nullptr, single[i]);
      for (int i = 0; i < 4; ++i) {
        const std::vector<float> want = Download(*b, single[i]);
        EXPECT_EQ(Download(*b, grouped[i]), want) << "part " << i;
        double sum = 0;
        for (float v : want) sum += std::fabs(v);
        EXPECT_GT(sum, 0.0) << "part " << i;
      }
    }
  }
}

TEST_F(CudaOpsTest, MatMulF32AndBf16) {
  const int64_t n = 7, k = 257, m = 129;
  const std::vector<float> x = Random(static_cast<size_t>(n * k), 5);
  const std::vector<float> w = Random(static_cast<size_t>(m * k), 6, 0.05f);
  const std::vector<float> bias = Random(static_cast<size_t>(m), 7);
  for (bool f32 : {true, false}) {
    auto b = Make(f32);
    Tensor wt = Weight(*b, w, {m, k});
    Tensor bt = Weight(*b, bias, {m});
    ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
    Tensor xt = Upload(*b, x, {n, k});
    Tensor out = b->Alloc({n, m});
    b->MatMul(xt, wt, &bt, out);
    std::vector<float> got = Download(*b, out);
    std::vector<double> ref(static_cast<size_t>(n * m)), ref_rounded(ref.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double acc = bias[static_cast<size_t>(j)], acc_r = acc;
        for (int64_t c = 0; c < k; ++c) {
          const float xv = x[static_cast<size_t>(i * k + c)], wv = w[static_cast<size_t>(j * k + c)];
          acc += static_cast<double>(xv) * wv;
          acc_r += static_cast<double>(RoundBf16(xv)) * RoundBf16(wv);
        }
        ref[static_cast<size_t>(i * m + j)] = acc;
        ref_rounded[static_cast<size_t>(i * m + j)] = acc_r;
      }
    if (f32) {
      EXPECT_LT(RelL2(got, ref), 1e-5);
    } else {
      EXPECT_LT(RelL2(got, ref), 1e-2);
      EXPECT_LT(RelL2(got, ref_rounded), 1e-5);
    }
  }
}

// The x operand a default-mode bf16 MatMul of n rows multiplies: f32 for one row (the GEMV), bf16
// for more (the tensor-core GEMM).
double XOperand(float x, int64_t n) { return n == 1 ? x : RoundBf16(x); }

// Decode-sized MatMul (n <= 8, k % 8 == 0) with batch invariance off: one row takes the bf16 GEMV,
// which keeps x in f32; 2..8 rows take the tensor-core GEMM (gemm_invariant.cu), which rounds x to
// bf16 (RN) and accumulates exact bf16 products in f32. The reference rounds the same operands.
TEST_F(CudaOpsTest, MatMulSkinnyBf16) {
  const int64_t k = 512, m = 300;
  const std::vector<float> w = Random(static_cast<size_t>(m * k), 30, 0.05f);
  const std::vector<float> bias = Random(static_cast<size_t>(m), 31);
  auto b = Make(false);
  Tensor wt = Weight(*b, w, {m, k});
  Tensor bt = Weight(*b, bias, {m});
  for (int64_t n : {1, 2, 5, 8}) {
    const std::vector<float> x = Random(static_cast<size_t>(n * k), 32 + static_cast<uint32_t>(n));
    ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
    Tensor xt = Upload(*b, x, {n, k});
    Tensor out = b->Alloc({n, m});
    b->MatMul(xt, wt, &bt, out);
    std::vector<double> ref(static_cast<size_t>(n * m));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double acc = bias[static_cast<size_t>(j)];
        for (int64_t c = 0; c < k; ++c)
          acc += XOperand(x[static_cast<size_t>(i * k + c)], n) *
                 RoundBf16(w[static_cast<size_t>(j * k + c)]);
        ref[static_cast<size_t>(i * m + j)] = acc;
      }
    EXPECT_LT(RelL2(Download(*b, out), ref), 1e-5) << "n=" << n;
  }
}

// Consecutive decode MatMuls of one x (q/k/v) run as one multi-weight launch (batch invariance
// off; the GEMV for one row, the tensor-core GEMM for more, as above); k = 4,096 and 4,136 rows in
// all, so the GEMV splits each row over two warps.
TEST_F(CudaOpsTest, MatMulSkinnyFusedParts) {
  const int64_t k = 4096;
  const int64_t ms[3] = {4000, 100, 36};
  std::vector<std::vector<float>> w, bias;
  auto b = Make(false);
  std::vector<Tensor> wt, bt;
  for (int i = 0; i < 3; ++i) {
    w.push_back(Random(static_cast<size_t>(ms[i] * k), 40 + i, 0.05f));
    bias.push_back(Random(static_cast<size_t>(ms[i]), 50 + i));
    wt.push_back(Weight(*b, w.back(), {ms[i], k}));
    bt.push_back(Weight(*b, bias.back(), {ms[i]}));
  }
  for (int64_t n : {1, 3, 8}) {
    const std::vector<float> x = Random(static_cast<size_t>(n * k), 60 + static_cast<uint32_t>(n));
    ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
    Tensor xt = Upload(*b, x, {n, k});
    std::vector<Tensor> outs;
    std::vector<MatMulPart> parts;
    for (int i = 0; i < 3; ++i) {
      outs.push_back(b->Alloc({n, ms[i]}));
      parts.push_back({&wt[static_cast<size_t>(i)],
                       i == 1 ? nullptr : &bt[static_cast<size_t>(i)], outs.back()});
    }
    b->MatMulGroup(xt, parts);
    for (int i = 0; i < 3; ++i) {
      const int64_t m = ms[i];
      std::vector<double> ref(static_cast<size_t>(n * m));
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < m; ++j) {
          double acc = i == 1 ? 0.0 : bias[static_cast<size_t>(i)][static_cast<size_t>(j)];
          for (int64_t c = 0; c < k; ++c)
            acc += XOperand(x[static_cast<size_t>(r * k + c)], n) *
                   RoundBf16(w[static_cast<size_t>(i)][static_cast<size_t>(j * k + c)]);
          ref[static_cast<size_t>(r * m + j)] = acc;
        }
      EXPECT_LT(RelL2(Download(*b, outs[static_cast<size_t>(i)]), ref), 1e-5)
          << "n=" << n << " part " << i;
    }
  }
}

// The one-row GEMV (gemv.cu) over the shapes that exercise its edges: k below one lane's 16-byte
// load per warp (k = 8), k whose last load batch is partial (1,016, 8,200), rows that do not fill
// the last block, and the decode shapes' k (2,048 to 16,384); launches of >= 4,096 rows of
// k >= 4,096 split each row over two warps (8,200: unevenly).
TEST_F(CudaOpsTest, MatMulGemvShapes) {
  struct Shape {
    int64_t k, m;
  };
  for (const Shape sh : {Shape{8, 3}, Shape{1016, 7}, Shape{2048, 1001}, Shape{8200, 301},
                         Shape{8200, 4099}, Shape{14336, 611}, Shape{16384, 250}}) {
    const std::vector<float> w = Random(static_cast<size_t>(sh.m * sh.k), 70, 0.05f);
    const std::vector<float> bias = Random(static_cast<size_t>(sh.m), 71);
    const std::vector<float> x = Random(static_cast<size_t>(sh.k), 72);
    auto b = Make(false);
    Tensor wt = Weight(*b, w, {sh.m, sh.k});
    Tensor bt = Weight(*b, bias, {sh.m});
    ASSERT_TRUE(b->BeginStep(SimplePlan(1)).ok());
    Tensor xt = Upload(*b, x, {1, sh.k});
    Tensor out = b->Alloc({1, sh.m});
    b->MatMul(xt, wt, &bt, out);
    std::vector<double> ref(static_cast<size_t>(sh.m));
    for (int64_t j = 0; j < sh.m; ++j) {
      double acc = bias[static_cast<size_t>(j)];
      for (int64_t c = 0; c < sh.k; ++c)
        acc += static_cast<double>(x[static_cast<size_t>(c)]) *
               RoundBf16(w[static_cast<size_t>(j * sh.k + c)]);
      ref[static_cast<size_t>(j)] = acc;
    }
    EXPECT_LT(RelL2(Download(*b, out), ref), 1e-5) << "k=" << sh.k << " m=" << sh.m;
  }
}

// The batch-1 MLP's gate and up GEMV followed by its gated activation (SiluMul / GeluTanhMul): the
// backend records one launch that writes gate, up and the activation (gemv.cu's ring kernel), or
// the GEMV and the activation kernel where the ring kernel is off or cannot take the shape. All
// three outputs against the double twin: rows split over 1, 2 and 8 warps (k 2,048, 4,096,
// 14,336), an odd row count per block, a partial last chunk (k 1,016), biases.
TEST_F(CudaOpsTest, MatMulGemvGatedActivation) {
  struct Shape {
    int64_t k, m;
    bool gelu, bias;
  };
  for (const Shape sh : {Shape{2048, 1000, false, false}, Shape{4096, 301, true, false},
                         Shape{14336, 140, false, true}, Shape{1016, 37, true, true}}) {
    const std::vector<float> wg = Random(static_cast<size_t>(sh.m * sh.k), 80, 0.05f);
    const std::vector<float> wu = Random(static_cast<size_t>(sh.m * sh.k), 81, 0.05f);
    const std::vector<float> bg = Random(static_cast<size_t>(sh.m), 82);
    const std::vector<float> bu = Random(static_cast<size_t>(sh.m), 83);
    const std::vector<float> x = Random(static_cast<size_t>(sh.k), 84);
    auto b = Make(false);
    Tensor wgt = Weight(*b, wg, {sh.m, sh.k});
    Tensor wut = Weight(*b, wu, {sh.m, sh.k});
    Tensor bgt = Weight(*b, bg, {sh.m});
    Tensor but = Weight(*b, bu, {sh.m});
    ASSERT_TRUE(b->BeginStep(SimplePlan(1)).ok());
    Tensor xt = Upload(*b, x, {1, sh.k});
    Tensor gate = b->Alloc({1, sh.m}), up = b->Alloc({1, sh.m}), act = b->Alloc({1, sh.m});
    if (sh.bias) {  // (GateUpActivation takes no biases: the group, then the activation)
      const MatMulPart parts[] = {{&wgt, &bgt, gate}, {&wut, &but, up}};
      b->MatMulGroup(xt, parts);
      if (sh.gelu) {
        b->GeluTanhMul(gate, up, act);
      } else {
        b->SiluMul(gate, up, act);
      }
    } else {
      b->GateUpActivation(xt, wgt, wut, sh.gelu ? GateActivation::kGeluTanh : GateActivation::kSilu,
                          gate, up, act);
    }
    std::vector<double> ref_g(static_cast<size_t>(sh.m)), ref_u(ref_g.size()), ref_a(ref_g.size());
    for (int64_t j = 0; j < sh.m; ++j) {
      double g = sh.bias ? bg[static_cast<size_t>(j)] : 0.0;
      double u = sh.bias ? bu[static_cast<size_t>(j)] : 0.0;
      for (int64_t c = 0; c < sh.k; ++c) {
        const double xv = x[static_cast<size_t>(c)];
        g += xv * RoundBf16(wg[static_cast<size_t>(j * sh.k + c)]);
        u += xv * RoundBf16(wu[static_cast<size_t>(j * sh.k + c)]);
      }
      const double a =
          sh.gelu ? 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
                  : g / (1.0 + std::exp(-g));
      ref_g[static_cast<size_t>(j)] = g;
      ref_u[static_cast<size_t>(j)] = u;
      ref_a[static_cast<size_t>(j)] = a * u;
    }
    const std::string what = "k=" + std::to_string(sh.k) + " m=" + std::to_string(sh.m);
    EXPECT_LT(RelL2(Download(*b, gate), ref_g), 1e-5) << what << " gate";
    EXPECT_LT(RelL2(Download(*b, up), ref_u), 1e-5) << what << " up";
    EXPECT_LT(RelL2(Download(*b, act), ref_a), 1e-5) << what << " act";
  }
}

// A one-row RMSNorm (AddRmsNorm, or RmsNorm) followed by the batch-1 GEMVs of its output (q/k/v:
// three parts: one launch). The GEMV outputs, the updated residual and the normalised row against
// the double twin: rows split over 1 and 2 warps (k 2,048, 4,096), a partial last chunk (k
// 1,016), the (1 + w) weights, biases. (The norm stays its own kernel: a GEMV prologue that
// computes it measured slower, docs/perf.md.)
TEST_F(CudaOpsTest, MatMulGemvAfterRmsNorm) {
  struct Shape {
    int64_t k;
    bool add, one_plus;
  };
  const std::vector<int64_t> ms = {300, 77, 77};
  for (const Shape sh :
       {Shape{2048, true, false}, Shape{4096, false, true}, Shape{1016, true, true}}) {
    const std::vector<float> res = Random(static_cast<size_t>(sh.k), 90);
    const std::vector<float> delta = Random(static_cast<size_t>(sh.k), 91);
    const std::vector<float> nw = Random(static_cast<size_t>(sh.k), 92);
    auto b = Make(false);
    std::vector<std::vector<float>> ws, bs;
    std::vector<Tensor> wts, bts;
    for (size_t i = 0; i < ms.size(); ++i) {
      ws.push_back(Random(static_cast<size_t>(ms[i] * sh.k), 93 + static_cast<int>(i), 0.05f));
      bs.push_back(Random(static_cast<size_t>(ms[i]), 96 + static_cast<int>(i)));
      wts.push_back(Weight(*b, ws.back(), {ms[i], sh.k}));
      bts.push_back(Weight(*b, bs.back(), {ms[i]}));
    }
    Tensor nwt = Weight(*b, nw, {sh.k});
    const float eps = 1e-5f;
    const RmsNormKind kind = sh.one_plus ? RmsNormKind::kOnePlusWeight : RmsNormKind::kPlain;
    ASSERT_TRUE(b->BeginStep(SimplePlan(1)).ok());
    Tensor rt = Upload(*b, res, {1, sh.k});
    Tensor dt = Upload(*b, delta, {1, sh.k});
    Tensor xn = b->Alloc({1, sh.k});
    if (sh.add) {
      b->AddRmsNorm(rt, dt, nwt, eps, kind, xn);
    } else {
      b->RmsNorm(rt, nwt, eps, kind, xn);
    }
    std::vector<Tensor> outs;
    std::vector<MatMulPart> parts;
    for (size_t i = 0; i < ms.size(); ++i) {
      outs.push_back(b->Alloc({1, ms[i]}));
      parts.push_back({&wts[i], i != 1 ? &bts[i] : nullptr, outs.back()});
    }
    b->MatMulGroup(xn, parts);
    std::vector<double> v(static_cast<size_t>(sh.k)), xr(v.size());
    double ss = 0;
    for (int64_t c = 0; c < sh.k; ++c) {
      v[static_cast<size_t>(c)] =
          res[static_cast<size_t>(c)] + (sh.add ? delta[static_cast<size_t>(c)] : 0.f);
      ss += v[static_cast<size_t>(c)] * v[static_cast<size_t>(c)];
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(sh.k) + eps);
    for (int64_t c = 0; c < sh.k; ++c) {
      const double w = nw[static_cast<size_t>(c)];
      xr[static_cast<size_t>(c)] = v[static_cast<size_t>(c)] * inv * (sh.one_plus ? 1.0 + w : w);
    }
    const std::string what = "k=" + std::to_string(sh.k);
    EXPECT_LT(RelL2(Download(*b, rt), sh.add ? v : std::vector<double>(res.begin(), res.end())),
              1e-6)
        << what << " residual";
    EXPECT_LT(RelL2(Download(*b, xn), xr), 1e-5) << what << " normalised row";
    for (size_t i = 0; i < ms.size(); ++i) {
      std::vector<double> ref(static_cast<size_t>(ms[i]));
      for (int64_t j = 0; j < ms[i]; ++j) {
        double acc = i != 1 ? bs[i][static_cast<size_t>(j)] : 0.0;
        for (int64_t c = 0; c < sh.k; ++c)
          acc += xr[static_cast<size_t>(c)] * RoundBf16(ws[i][static_cast<size_t>(j * sh.k + c)]);
        ref[static_cast<size_t>(j)] = acc;
      }
      EXPECT_LT(RelL2(Download(*b, outs[i]), ref), 1e-5) << what << " part " << i;
    }
  }
}

// Backend contract (bf16 mode with batch_invariant): each output element is computed in an order
// independent of n. The f32 parity mode makes no such promise (cuBLAS picks its kernel by n; on
// the H200 n = 1, 3 and 64 differ in the last bits).
TEST_F(CudaOpsTest, MatMulBatchInvariant) {
  const int64_t k = 2048, m = 512;
  const std::vector<float> x = Random(static_cast<size_t>(64 * k), 8);
  const std::vector<float> w = Random(static_cast<size_t>(m * k), 9, 0.02f);
  auto b = MakeInvariant();
  Tensor wt = Weight(*b, w, {m, k});
  std::vector<std::vector<float>> rows0;
  for (int64_t n : {1, 3, 64}) {
    ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
    Tensor xt = Upload(*b, std::vector<float>(x.begin(), x.begin() + n * k), {n, k});
    Tensor out = b->Alloc({n, m});
    b->MatMul(xt, wt, nullptr, out);
    std::vector<float> got = Download(*b, out);
    rows0.emplace_back(got.begin(), got.begin() + m);
  }
  EXPECT_EQ(rows0[0], rows0[1]) << "n=1 vs n=3 differ";
  EXPECT_EQ(rows0[0], rows0[2]) << "n=1 vs n=64 differ";
}

// CPU twin of the bf16 MatMul: out[r, j] = sum_c bf16(x[r, c]) bf16(w[j, c]) (+ bias[j]) in
// double, for rows r = 0, step, 2 * step, ... < rows (row-major [rows / step rounded up, m]).
std::vector<double> TwinMatMulBf16(const std::vector<float>& x, const std::vector<float>& w,
                                   const std::vector<float>* bias, int64_t rows, int64_t m,
                                   int64_t k, int64_t step, bool round_x = true) {
  std::vector<double> out;
  std::vector<double> wr(w.size());
  for (size_t i = 0; i < w.size(); ++i) wr[i] = RoundBf16(w[i]);
  for (int64_t r = 0; r < rows; r += step)
    for (int64_t j = 0; j < m; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < k; ++c) {
        const float xv = x[static_cast<size_t>(r * k + c)];
        acc += (round_x ? RoundBf16(xv) : xv) * wr[static_cast<size_t>(j * k + c)];
      }
      out.push_back(acc + (bias != nullptr ? (*bias)[static_cast<size_t>(j)] : 0.0));
    }
  return out;
}

// bf16 MatMuls of 9..256 rows against small weights take the wgmma skinny GEMM (gemm_skinny.cu):
// every row count bucket, a k split over a cluster (small m, long k) and persistent row tiles, the
// same bits twice, and the bf16 twin within 1e-5.
TEST_F(CudaOpsTest, MatMulSkinnyGemm) {
  struct Case {
    int64_t n, m, k;
  };
  for (const Case& c :
       {Case{9, 192, 512}, Case{16, 64, 4096}, Case{37, 1024, 2048}, Case{64, 1024, 4096},
        Case{128, 512, 1024}, Case{200, 1024, 512}, Case{256, 512, 2048}}) {
    SCOPED_TRACE(testing::Message() << "n " << c.n << " m " << c.m << " k " << c.k);
    ASSERT_TRUE(cuda::SkinnyGemmPreferred(c.n, c.m, c.k));
    const std::vector<float> x = Random(static_cast<size_t>(c.n * c.k), 11);
    const std::vector<float> w = Random(static_cast<size_t>(c.m * c.k), 12, 0.05f);
    const std::vector<float> bias = Random(static_cast<size_t>(c.m), 13);
    auto b = Make(false);
    Tensor wt = Weight(*b, w, {c.m, c.k});
    Tensor bt = Weight(*b, bias, {c.m});
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(c.n))).ok());
      Tensor xt = Upload(*b, x, {c.n, c.k});
      Tensor out = b->Alloc({c.n, c.m});
      b->MatMul(xt, wt, &bt, out);
      runs.push_back(Download(*b, out));
    }
    EXPECT_EQ(runs[0], runs[1]);
    EXPECT_LT(RelL2(runs[0], TwinMatMulBf16(x, w, &bias, c.n, c.m, c.k, 1)), 1e-5);
  }
}

// The batch-invariant GEMM (bf16, batch_invariant): every row of an n-row MatMul, n from 1 to
// 1000, is bitwise the row computed alone (n = 1), for fused parts (q/k/v-style: consecutive
// MatMuls of one x), tails in m and k, an odd k (the generic kernel) and x at an address that is
// not 16-byte aligned (the generic kernel against the fast ones); values match the CPU twin.
TEST_F(CudaOpsTest, MatMulInvariantRowsEqualSolo) {
  struct Case {
    std::vector<int64_t> ms;  // parts sharing x; parts 0 and 2 have a bias
    int64_t k;
    bool misaligned;  // also run every n from an unaligned copy of x
  };
  const Case cases[] = {{{512}, 2048, true},
                        {{300, 100, 36}, 256, true},
                        {{32}, 64, false},
                        {{129}, 72, false},
                        {{64}, 257, false}};
  const int64_t ns[] = {1, 2, 3, 7, 8, 9, 16, 33, 64, 100, 128, 300, 1000};
  constexpr int64_t kPool = 1000;
  auto b = MakeInvariant();
  uint32_t seed = 100;
  for (const Case& cs : cases) {
    const int64_t k = cs.k;
    const size_t parts = cs.ms.size();
    std::vector<std::vector<float>> w, bias;
    std::vector<Tensor> wt, bt;
    for (size_t p = 0; p < parts; ++p) {
      w.push_back(Random(static_cast<size_t>(cs.ms[p] * k), seed++, 0.05f));
      bias.push_back(Random(static_cast<size_t>(cs.ms[p]), seed++));
      wt.push_back(Weight(*b, w.back(), {cs.ms[p], k}));
      bt.push_back(Weight(*b, bias.back(), {cs.ms[p]}));
    }
    auto matmul = [&](const Tensor& x, std::vector<Tensor>& outs) {
      std::vector<MatMulPart> group;
      for (size_t p = 0; p < parts; ++p) group.push_back({&wt[p], p == 1 ? nullptr : &bt[p], outs[p]});
      b->MatMulGroup(x, group);
    };
    auto poisoned_outs = [&](int64_t n) {
      std::vector<Tensor> outs;
      for (size_t p = 0; p < parts; ++p) {
        outs.push_back(b->Alloc({n, cs.ms[p]}));
        const std::vector<float> nan(static_cast<size_t>(n * cs.ms[p]), NAN);
        EXPECT_TRUE(CudaCopyFromHost(*b, nan, outs.back()).ok());
      }
      return outs;
    };
    const std::vector<float> x = Random(static_cast<size_t>(kPool * k), seed++);

    // Each row alone: n = 1 views of one uploaded pool.
    std::vector<std::vector<float>> solo(parts);
    {
      ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(kPool))).ok());
      Tensor xt = Upload(*b, x, {kPool, k});
      std::vector<Tensor> outs = poisoned_outs(kPool);
      for (int64_t r = 0; r < kPool; ++r) {
        std::vector<Tensor> row_outs;
        for (size_t p = 0; p < parts; ++p) row_outs.push_back(outs[p].RowSlice(r, 1));
        matmul(xt.RowSlice(r, 1), row_outs);
      }
      for (size_t p = 0; p < parts; ++p) solo[p] = Download(*b, outs[p]);
    }
    // The CPU twin on every 7th row.
    for (size_t p = 0; p < parts; ++p) {
      const std::vector<float>* bp = p == 1 ? nullptr : &bias[p];
      std::vector<float> got;
      for (int64_t r = 0; r < kPool; r += 7)
        got.insert(got.end(), solo[p].begin() + r * cs.ms[p], solo[p].begin() + (r + 1) * cs.ms[p]);
      EXPECT_LT(RelL2(got, TwinMatMulBf16(x, w[p], bp, kPool, cs.ms[p], k, 7)), 1e-5)
          << "k=" << k << " part " << p;
      EXPECT_LT(RelL2(got, TwinMatMulBf16(x, w[p], bp, kPool, cs.ms[p], k, 7, false)), 1e-2)
          << "k=" << k << " part " << p;
    }
    for (int64_t n : ns) {
      for (bool misaligned : {false, true}) {
        if (misaligned && !cs.misaligned) continue;
        ASSERT_TRUE(b->BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
        Tensor xt;
        if (misaligned) {
          std::vector<float> shifted(static_cast<size_t>(n * k + 1), 0.0f);
          std::copy(x.begin(), x.begin() + n * k, shifted.begin() + 1);
          Tensor flat = Upload(*b, shifted, {n * k + 1});
          xt = flat.Reshape({n * k + 1});
          xt.data = static_cast<float*>(flat.data) + 1;  // 4 bytes past a 16-byte boundary
          xt.ndim = 2;
          xt.shape = {n, k, 0, 0};
        } else {
          xt = Upload(*b, std::vector<float>(x.begin(), x.begin() + n * k), {n, k});
        }
        std::vector<Tensor> outs = poisoned_outs(n);
        matmul(xt, outs);
        for (size_t p = 0; p < parts; ++p) {
          const std::vector<float> got = Download(*b, outs[p]);
          int64_t bad_rows = 0, first_bad = -1;
          for (int64_t r = 0; r < n; ++r) {
            const size_t off = static_cast<size_t>(r * cs.ms[p]);
            if (std::memcmp(got.data() + off, solo[p].data() + off,
                            static_cast<size_t>(cs.ms[p]) * sizeof(float)) != 0) {
              if (first_bad < 0) first_bad = r;
              ++bad_rows;
            }
          }
          EXPECT_EQ(bad_rows, 0) << "k=" << k << " part " << p << " m=" << cs.ms[p] << " n=" << n
                                 << (misaligned ? " (unaligned x)" : "") << ": first bad row "
                                 << first_bad;
        }
      }
    }
  }
}

// A decode-shaped step (graph-replayed) and a prefill-shaped step give the same rows.
TEST_F(CudaOpsTest, MatMulInvariantGraphReplay) {
  const int64_t k = 1024, m = 768, n = 4;
  const std::vector<float> w = Random(static_cast<size_t>(m * k), 70, 0.05f);
  const std::vector<float> x = Random(static_cast<size_t>(64 * k), 71);
  auto b = MakeInvariant();
  Tensor wt = Weight(*b, w, {m, k});
  std::vector<std::vector<float>> results;
  for (int64_t rows : {n, n, n, int64_t{64}}) {
    BatchPlan plan;
    if (rows == n) {
      // n single-token sequences: a decode step (captured once, then replayed).
      for (int32_t s = 0; s < n; ++s) plan.AddSequence(std::vector<int32_t>{0}, 5, {s}, true);
    } else {
      plan = SimplePlan(static_cast<int32_t>(rows));
    }
    ASSERT_TRUE(b->BeginStep(plan).ok());
    Tensor xt = Upload(*b, std::vector<float>(x.begin(), x.begin() + rows * k), {rows, k});
    Tensor out = b->Alloc({rows, m});
    b->MatMul(xt, wt, nullptr, out);
    std::vector<float> got = Download(*b, out);
    results.emplace_back(got.begin(), got.begin() + n * m);
  }
  for (size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[0], results[i]) << "run " << i;
  EXPECT_LT(RelL2(results[0], TwinMatMulBf16(x, w, nullptr, n, m, k, 1)), 1e-5);
}

// A backend of the default mode runs a step whose plan asks for it (BatchPlan::batch_invariant,
// `--batch-invariant auto` with speculation) on the batch-invariant GEMM: its rows are bitwise
// the rows computed alone in such steps, decode-shaped steps (graph-replayed) included, while
// the steps between them take the default paths (GEMV, cuBLAS: same values to bf16 rounding).
TEST_F(CudaOpsTest, MatMulInvariantPerStep) {
  const int64_t k = 2048, m = 512, pool = 300;
  const std::vector<float> w = Random(static_cast<size_t>(m * k), 80, 0.05f);
  const std::vector<float> x = Random(static_cast<size_t>(pool * k), 81);
  auto b = Make(false);
  Tensor wt = Weight(*b, w, {m, k});
  // rows [0, n) of x in one step of n single-token sequences (decode) or one n-token sequence.
  auto run = [&](int64_t n, bool decode, bool invariant) {
    BatchPlan plan;
    if (decode) {
      for (int32_t s = 0; s < n; ++s) plan.AddSequence(std::vector<int32_t>{0}, 5, {s}, true);
    } else {
      plan = SimplePlan(static_cast<int32_t>(n));
    }
    plan.batch_invariant = invariant;
    EXPECT_TRUE(b->BeginStep(plan).ok());
    Tensor xt = Upload(*b, std::vector<float>(x.begin(), x.begin() + n * k), {n, k});
    Tensor out = b->Alloc({n, m});
    b->MatMul(xt, wt, nullptr, out);
    return Download(*b, out);
  };
  std::vector<float> solo;  // each row alone, in invariant steps
  for (int64_t r = 0; r < pool; r += 37) {
    BatchPlan plan = SimplePlan(1);
    plan.batch_invariant = true;
    ASSERT_TRUE(b->BeginStep(plan).ok());
    Tensor xt = Upload(*b, std::vector<float>(x.begin() + r * k, x.begin() + (r + 1) * k), {1, k});
    Tensor out = b->Alloc({1, m});
    b->MatMul(xt, wt, nullptr, out);
    const std::vector<float> row = Download(*b, out);
    solo.insert(solo.end(), row.begin(), row.end());
  }
  auto sampled_rows = [&](const std::vector<float>& all, int64_t n) {
    std::vector<float> rows;
    for (int64_t r = 0; r < n; r += 37)
      rows.insert(rows.end(), all.begin() + r * m, all.begin() + (r + 1) * m);
    return rows;
  };
  const std::vector<double> twin = TwinMatMulBf16(x, w, nullptr, pool, m, k, 37);
  auto twin_rows = [&](size_t count) {
    return std::vector<double>(twin.begin(), twin.begin() + static_cast<int64_t>(count));
  };
  // Alternating modes, twice over: invariant steps equal the solo rows bitwise; default steps
  // (one row: the GEMV; 300: cuBLAS) are the same products to bf16 rounding.
  for (int round = 0; round < 2; ++round) {
    for (const auto& [n, decode] : {std::pair<int64_t, bool>{pool, false}, {38, true}}) {
      const std::vector<float> inv = sampled_rows(run(n, decode, true), n);
      const std::vector<float> solo_rows(solo.begin(), solo.begin() + static_cast<int64_t>(inv.size()));
      EXPECT_EQ(inv, solo_rows) << "n=" << n << " round " << round;
      const std::vector<float> fast = sampled_rows(run(n, decode, false), n);
      EXPECT_LT(RelL2(fast, twin_rows(fast.size())), 1e-2)
          << "n=" << n << " round " << round;
    }
    const std::vector<float> one = run(1, true, false);
    EXPECT_LT(RelL2(one, twin_rows(static_cast<size_t>(m))), 1e-2);
  }
}

}  // namespace
}  // namespace ember
