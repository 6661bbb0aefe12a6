// Op-level tests of the CUDA backend against CPU twins (plain double-precision reference code
// in this file, written from the Backend interface's definitions). Tolerances (relative L2):
// f32 compute mode 1e-5; bf16 mode 1e-2 vs the unrounded reference and 1e-5 vs a reference over
// bf16-rounded operands. Skips when no CUDA device is present (CI has none).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/rope_table.h"
#include "util/half.h"

namespace ember {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double RelL2(const std::vector<float>& got, const std::vector<double>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

float RoundBf16(float x) { return Bf16ToF32(F32ToBf16(x)); }

// Double-precision attention of one query head at position `pos` over keys [lo, pos]: q(d),
// k(j, d), v(j, d) give the operands; soft-capping when softcap > 0. Returns [head_dim].
template <typename Q, typename K, typename V>
std::vector<double> ReferenceHead(int32_t head_dim, int32_t lo, int32_t pos, double scale,
                                  double softcap, Q q, K k, V v) {
  std::vector<double> s;
  for (int32_t j = lo; j <= pos; ++j) {
    double dot = 0;
    for (int32_t d = 0; d < head_dim; ++d) dot += static_cast<double>(q(d)) * k(j, d);
    dot *= scale;
    if (softcap > 0) dot = softcap * std::tanh(dot / softcap);
    s.push_back(dot);
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(static_cast<size_t>(head_dim));
  for (int32_t d = 0; d < head_dim; ++d) {
    double acc = 0;
    for (int32_t j = lo; j <= pos; ++j) acc += s[static_cast<size_t>(j - lo)] * v(j, d);
    out[static_cast<size_t>(d)] = acc / sum;
  }
  return out;
}

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device present; CUDA op tests skipped";
  }
  std::unique_ptr<Backend> Make(bool f32) {
    auto r = CreateCudaBackend(0, f32);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }
  // bf16 mode with the batch-invariant GEMM on (the default is the GEMV / cuBLAS paths).
  std::unique_ptr<Backend> MakeInvariant() {
    CudaBackendOptions options;
    options.batch_invariant = true;
    auto r = CreateCudaBackend(0, options);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }
  Tensor Upload(Backend& b, const std::vector<float>& host, std::initializer_list<int64_t> shape) {
    Tensor t = b.Alloc(shape);
    Status st = CudaCopyFromHost(b, host, t);
    EXPECT_TRUE(st.ok()) << st.message();
    return t;
  }
  Tensor Weight(Backend& b, const std::vector<float>& host, std::vector<int64_t> shape) {
    auto r = b.UploadWeight("w", DType::kF32, shape, host.data());
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.value();
  }
  std::vector<float> Download(Backend& b, const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()), NAN);
    Status st = b.CopyToHost(t, out);
    EXPECT_TRUE(st.ok()) << st.message();
    return out;
  }
  // A plan of one sequence of n tokens at positions [first_pos, first_pos + n).
  static BatchPlan SimplePlan(int32_t n, int32_t first_pos = 0, int32_t vocab = 1) {
    BatchPlan plan;
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = (i * 7 + 3) % vocab;
    std::vector<int32_t> blocks((first_pos + n) / plan.block_size + 1);
    std::iota(blocks.begin(), blocks.end(), 0);
    plan.AddSequence(tokens, first_pos, blocks, true);
    return plan;
  }
};

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
    for (int i = 0; i < 3; ++i) {
      outs.push_back(b->Alloc({n, ms[i]}));
      b->MatMul(xt, wt[static_cast<size_t>(i)], i == 1 ? nullptr : &bt[static_cast<size_t>(i)],
                outs.back());
    }
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
      for (size_t p = 0; p < parts; ++p)
        b->MatMul(x, wt[p], p == 1 ? nullptr : &bt[p], outs[p]);
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

// The table builder's inverse frequencies against an independent double-precision formula.
TEST(RopeTableTest, InvFreqMatchesFormula) {
  RopeSpec spec;
  spec.head_dim = 128;
  spec.rotary_dim = 128;
  spec.theta = 500000.0;
  spec.max_positions = 16;
  for (auto type : {RopeSpec::Type::kDefault, RopeSpec::Type::kLinear, RopeSpec::Type::kLlama3}) {
    spec.type = type;
    spec.factor = type == RopeSpec::Type::kDefault ? 1.0 : 8.0;
    const std::vector<float> inv = cuda::RopeInvFreq(spec);
    ASSERT_EQ(inv.size(), 64u);
    for (size_t i = 0; i < inv.size(); ++i) {
      double f = 1.0 / std::pow(spec.theta, 2.0 * static_cast<double>(i) / spec.rotary_dim);
      if (type == RopeSpec::Type::kLinear) f /= spec.factor;
      if (type == RopeSpec::Type::kLlama3) {
        const double wavelen = 2 * M_PI / f;
        const double low_wl = spec.original_max_positions / spec.low_freq_factor;
        const double high_wl = spec.original_max_positions / spec.high_freq_factor;
        if (wavelen > low_wl) {
          f /= spec.factor;
        } else if (wavelen >= high_wl) {
          const double smooth = (spec.original_max_positions / wavelen - spec.low_freq_factor) /
                                (spec.high_freq_factor - spec.low_freq_factor);
          f = (1 - smooth) * f / spec.factor + smooth * f;
        }
      }
      EXPECT_NEAR(inv[i], f, 2e-6 * f) << "type " << static_cast<int>(type) << " i " << i;
    }
  }
  spec.rotary_dim = 7;
  EXPECT_FALSE(cuda::BuildRopeTable(spec).ok());
}

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
      const std::vector<float> inv = cuda::RopeInvFreq(spec);
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

// The backend runs a Rope followed by a WriteKv of its k as one RopeWriteKv launch; with a flush
// in between (a download) they run as two. Both give the same q, k and pool bits (the pool seen
// through attention), for full and partial rotary, bf16 and f32 pools, decode and prefill steps.
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
          b.Rope(rope, q, k);
          if (fused == 0) got[0][1] = Download(b, k);  // flushes: WriteKv records on its own
          b.WriteKv(0, k, v);
          Tensor out = b.Alloc({n, heads * D});
          b.Attention(AttentionParams{0, heads, kv_heads, D, 0.125f, 0, 0.f}, q, out);
          got[fused][0] = Download(b, out);
          if (fused == 1) got[1][1] = Download(b, k);
          got[fused][2] = Download(b, q);
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

// Decode steps replayed from CUDA graphs give bit-identical results to op-by-op launches, with
// fresh inputs each step (the graph reads the re-uploaded plan and activations).
TEST_F(CudaOpsTest, GraphReplayMatchesEager) {
  const int32_t heads = 8, kv_heads = 2, D = 64, hidden = heads * D, seqs = 3;
  const std::vector<float> wq = Random(static_cast<size_t>(hidden * hidden), 20, 0.05f);
  const std::vector<float> norm_w = Random(static_cast<size_t>(hidden), 21);
  RopeSpec spec;
  spec.head_dim = D;
  spec.rotary_dim = D;
  spec.max_positions = 256;
  std::vector<std::vector<float>> outputs[2];
  CudaGraphStats stats[2];
  for (int graphs = 0; graphs < 2; ++graphs) {
    CudaBackendOptions options;
    options.cuda_graphs = graphs == 1;
    auto created = CreateCudaBackend(0, options);
    ASSERT_TRUE(created.ok());
    Backend& b = **created;
    Tensor w = Weight(b, wq, {hidden, hidden});
    Tensor nw = Weight(b, norm_w, {hidden});
    ASSERT_TRUE(b.AllocateKvPool(1, 64, 16, kv_heads, D).ok());
    const int32_t rope = b.CreateRope(spec).value();
    for (int32_t step = 0; step < 8; ++step) {
      BatchPlan plan;
      for (int32_t s = 0; s < seqs; ++s) {
        std::vector<int32_t> blocks(16);
        std::iota(blocks.begin(), blocks.end(), s * 16);
        plan.AddSequence({1}, step + s, blocks, true);
      }
      ASSERT_TRUE(b.BeginStep(plan).ok());
      Tensor x = Upload(b, Random(static_cast<size_t>(seqs * hidden), 100 + step), {seqs, hidden});
      Tensor k = Upload(b, Random(static_cast<size_t>(seqs * kv_heads * D), 200 + step),
                        {seqs, kv_heads, D});
      Tensor v = Upload(b, Random(static_cast<size_t>(seqs * kv_heads * D), 300 + step),
                        {seqs, kv_heads, D});
      Tensor q = b.Alloc({seqs, hidden}), attn = b.Alloc({seqs, hidden});
      Tensor h = b.Alloc({seqs, hidden}), logits = b.Alloc({seqs, hidden});
      b.RmsNorm(x, nw, 1e-6f, RmsNormKind::kPlain, h);
      b.MatMul(h, w, nullptr, q);
      b.Rope(rope, q.Reshape({seqs, heads, D}), k);
      b.WriteKv(0, k, v);
      AttentionParams p{0, heads, kv_heads, D, 0.125f, 0, 0.f};
      b.Attention(p, q, attn);
      b.AddRmsNorm(x, attn, nw, 1e-6f, RmsNormKind::kPlain, h);
      b.GatherLogitsRows(h, logits);
      outputs[graphs].push_back(Download(b, logits));
    }
    stats[graphs] = CudaGetGraphStats(b);
  }
  EXPECT_EQ(stats[0].captures + stats[0].replays, 0);
  EXPECT_GE(stats[1].replays, 6) << "captures " << stats[1].captures;
  for (size_t step = 0; step < outputs[0].size(); ++step)
    EXPECT_EQ(outputs[0][step], outputs[1][step]) << "step " << step;
}

// ---- paged attention ----

struct AttnCase {
  int32_t head_dim, num_heads, num_kv_heads, window;
  float softcap;
};

std::string AttnCaseName(const ::testing::TestParamInfo<AttnCase>& info) {
  const AttnCase& c = info.param;
  char name[96];
  std::snprintf(name, sizeof(name), "D%d_H%d_KV%d_W%d_cap%d", c.head_dim, c.num_heads,
                c.num_kv_heads, c.window, static_cast<int>(c.softcap));
  return std::string(name);
}

// Host K/V per sequence and position: [pos][num_kv_heads * head_dim].
using SeqKv = std::vector<std::vector<float>>;

class AttentionTest : public CudaOpsTest, public ::testing::WithParamInterface<AttnCase> {
 protected:
  static constexpr int32_t kBlocks = 256, kLayers = 2, kLayer = 1;

  // Runs one step: each entry (seq id, first_pos, n) adds n rows. Returns the rel-L2 error.
  double Step(Backend& b, const std::vector<std::array<int32_t, 3>>& rows, uint32_t seed) {
    const AttnCase c = GetParam();
    BatchPlan plan;
    for (const auto& [seq, first, n] : rows) {
      std::vector<int32_t> tokens(static_cast<size_t>(n), 1);
      plan.AddSequence(tokens, first, blocks_[static_cast<size_t>(seq)], false);
    }
    EXPECT_TRUE(b.BeginStep(plan).ok());
    const int32_t T = plan.num_tokens(), D = c.head_dim;
    const int64_t kvw = static_cast<int64_t>(c.num_kv_heads) * D;
    const std::vector<float> q = Random(static_cast<size_t>(T * c.num_heads * D), seed);
    const std::vector<float> k = Random(static_cast<size_t>(T * kvw), seed + 1);
    const std::vector<float> v = Random(static_cast<size_t>(T * kvw), seed + 2);
    Tensor qt = Upload(b, q, {T, c.num_heads, D});
    Tensor kt = Upload(b, k, {T, c.num_kv_heads, D});
    Tensor vt = Upload(b, v, {T, c.num_kv_heads, D});
    b.WriteKv(kLayer, kt, vt);
    AttentionParams p{kLayer, c.num_heads, c.num_kv_heads, D, 1.0f / std::sqrt(float(D)),
                      c.window, c.softcap};
    Tensor out = b.Alloc({T, c.num_heads * D});
    b.Attention(p, qt, out);
    // Reference: append this step's K/V, then attend.
    int32_t row = 0;
    for (const auto& [seq, first, n] : rows)
      for (int32_t i = 0; i < n; ++i, ++row) {
        SeqKv& ks = k_[static_cast<size_t>(seq)];
        SeqKv& vs = v_[static_cast<size_t>(seq)];
        EXPECT_EQ(static_cast<int32_t>(ks.size()), first + i);
        ks.emplace_back(k.begin() + row * kvw, k.begin() + (row + 1) * kvw);
        vs.emplace_back(v.begin() + row * kvw, v.begin() + (row + 1) * kvw);
      }
    std::vector<double> ref(static_cast<size_t>(T * c.num_heads * D));
    row = 0;
    for (const auto& [seq, first, n] : rows)
      for (int32_t i = 0; i < n; ++i, ++row) {
        const int32_t pos = first + i;
        const int32_t lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
        for (int32_t h = 0; h < c.num_heads; ++h) {
          const int32_t kvh = h / (c.num_heads / c.num_kv_heads);
          const float* qh = &q[static_cast<size_t>((row * c.num_heads + h) * D)];
          const SeqKv& ks = k_[static_cast<size_t>(seq)];
          const SeqKv& vs = v_[static_cast<size_t>(seq)];
          const std::vector<double> head = ReferenceHead(
              D, lo, pos, p.scale, c.softcap, [&](int32_t d) { return qh[d]; },
              [&](int32_t j, int32_t d) { return ks[static_cast<size_t>(j)][static_cast<size_t>(kvh * D + d)]; },
              [&](int32_t j, int32_t d) { return vs[static_cast<size_t>(j)][static_cast<size_t>(kvh * D + d)]; });
          std::copy(head.begin(), head.end(), ref.begin() + (row * c.num_heads + h) * D);
        }
      }
    return RelL2(Download(b, out), ref);
  }

  // f32: the parity mode (f32 kernels: split-K decode, f32 prefill); else bf16 mode, whose
  // attention is always the batch-invariant kernel. Tolerance: 1e-5 / 2e-2 relative L2.
  std::unique_ptr<Backend> Setup(int32_t num_seqs, bool f32) {
    const AttnCase c = GetParam();
    CudaBackendOptions options;
    options.f32_compute = f32;
    auto created = CreateCudaBackend(0, options);
    EXPECT_TRUE(created.ok()) << created.status().message();
    auto b = std::move(created).value();
    EXPECT_TRUE(b->AllocateKvPool(kLayers, kBlocks, 16, c.num_kv_heads, c.head_dim).ok());
    // Shuffled, disjoint block ids per sequence so a wrong block table shows.
    std::vector<int32_t> ids(kBlocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(42));
    const size_t per_seq = kBlocks / static_cast<size_t>(num_seqs);
    blocks_.clear();
    for (int32_t s = 0; s < num_seqs; ++s)
      blocks_.emplace_back(ids.begin() + static_cast<int64_t>(s * per_seq),
                           ids.begin() + static_cast<int64_t>((s + 1) * per_seq));
    k_.assign(static_cast<size_t>(num_seqs), {});
    v_.assign(static_cast<size_t>(num_seqs), {});
    return b;
  }

  std::vector<std::vector<int32_t>> blocks_;
  std::vector<SeqKv> k_, v_;
};

// mode 0: f32, 1: bf16 (the batch-invariant kernel).
TEST_P(AttentionTest, PrefillMixedAndDecode) {
  for (int mode : {0, 1}) {
    auto b = Setup(3, mode == 0);
    const double tol = mode == 0 ? 1e-5 : 2e-2;
    EXPECT_LT(Step(*b, {{0, 0, 40}, {1, 0, 23}}, 100), tol) << "prefill, mode " << mode;
    EXPECT_LT(Step(*b, {{0, 40, 1}, {1, 23, 9}, {2, 0, 5}}, 200), tol) << "mixed, mode " << mode;
    EXPECT_LT(Step(*b, {{0, 41, 1}, {1, 32, 1}, {2, 5, 1}}, 300), tol) << "decode, mode " << mode;
    EXPECT_LT(Step(*b, {{0, 42, 1}, {1, 33, 1}, {2, 6, 1}}, 400), tol) << "decode 2";
    // A chunk continuing a long history (its first rows see keys of earlier steps).
    EXPECT_LT(Step(*b, {{0, 43, 100}, {2, 7, 70}}, 450), tol) << "chunk, mode " << mode;
  }
}

TEST_P(AttentionTest, LongContextSplitK) {
  for (int mode : {0, 1}) {
    auto b = Setup(2, mode == 0);
    const double tol = mode == 0 ? 1e-5 : 2e-2;
    EXPECT_LT(Step(*b, {{0, 0, 1300}}, 500), tol) << "long prefill, mode " << mode;
    EXPECT_LT(Step(*b, {{0, 1300, 1}}, 600), tol) << "split-K decode, mode " << mode;
    EXPECT_LT(Step(*b, {{0, 1301, 1}, {1, 0, 1}}, 700), tol) << "split-K decode, short + long";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(AttnCase{64, 8, 2, 0, 0.f}, AttnCase{128, 8, 8, 16, 0.f},
                      AttnCase{80, 4, 1, 0, 30.f}, AttnCase{256, 4, 2, 100, 50.f},
                      AttnCase{96, 6, 3, 0, 0.f}, AttnCase{128, 32, 2, 0, 0.f},
                      AttnCase{256, 8, 1, 0, 0.f}, AttnCase{64, 4, 2, 24, 20.f}),
    AttnCaseName);

// ---- the bf16 KV pool ----

TEST_F(CudaOpsTest, KvElementBytes) {
  EXPECT_EQ(Make(false)->KvElementBytes(128), 2);  // bf16 mode, batch-invariant kernel: bf16
  EXPECT_EQ(Make(false)->KvElementBytes(72), 4);   // no invariant kernel: the f32 kernels
  EXPECT_EQ(Make(true)->KvElementBytes(128), 4);   // parity mode
  CudaBackendOptions options;
  options.kv_f32 = true;
  EXPECT_EQ(CreateCudaBackend(0, options).value()->KvElementBytes(128), 4);
}

// WriteKv stores V rounded to bf16 to nearest even, as the kernel's staging of an f32 pool does:
// a row at position 0 attends to its own key only (weight exactly 1), so its output is the
// stored V. Ties and near-ties of both mantissa parities, then random values.
TEST_F(CudaOpsTest, KvPoolStoresBf16RoundedToNearestEven) {
  const int32_t heads = 4, kv_heads = 2, D = 64, kvw = kv_heads * D;
  std::vector<float> v = Random(static_cast<size_t>(kvw), 77);
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u,
                              0xbf808000u, 0xbf818000u, 0x40490fdbu, 0x3eaaaaabu,
                              0x477fffffu, 0x00000001u, 0xc0a00001u, 0x41200000u};
  for (size_t i = 0; i < std::size(special); ++i) std::memcpy(&v[i], &special[i], 4);
  size_t rn_differs_from_truncation = 0;
  for (float x : v) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    float truncated;
    const uint32_t t = u & 0xffff0000u;
    std::memcpy(&truncated, &t, 4);
    rn_differs_from_truncation += RoundBf16(x) != truncated;
  }
  ASSERT_GT(rn_differs_from_truncation, 20u);  // the data can tell RN from truncation
  const std::vector<float> k = Random(static_cast<size_t>(kvw), 78);
  const std::vector<float> q = Random(static_cast<size_t>(heads * D), 79);
  for (bool kv_f32 : {false, true}) {
    CudaBackendOptions options;
    options.kv_f32 = kv_f32;
    auto created = CreateCudaBackend(0, options);
    ASSERT_TRUE(created.ok()) << created.status().message();
    Backend& b = **created;
    ASSERT_TRUE(b.AllocateKvPool(1, 4, 16, kv_heads, D).ok());
    ASSERT_TRUE(b.BeginStep(SimplePlan(1)).ok());
    Tensor qt = Upload(b, q, {1, heads, D});
    b.WriteKv(0, Upload(b, k, {1, kv_heads, D}), Upload(b, v, {1, kv_heads, D}));
    Tensor out = b.Alloc({1, heads * D});
    b.Attention(AttentionParams{0, heads, kv_heads, D, 0.125f, 0, 0.f}, qt, out);
    const std::vector<float> got = Download(b, out);
    size_t mismatches = 0;
    for (int32_t h = 0; h < heads; ++h)
      for (int32_t d = 0; d < D; ++d) {
        const float want = RoundBf16(v[static_cast<size_t>(h / (heads / kv_heads) * D + d)]);
        const float g = got[static_cast<size_t>(h * D + d)];
        if (g != want && ++mismatches <= 5)
          ADD_FAILURE() << "kv_f32 " << kv_f32 << " head " << h << " d " << d << ": " << g
                        << " != " << want;
      }
    EXPECT_EQ(mismatches, 0u) << "kv_f32 " << kv_f32;
  }
}

// ---- batch-invariant attention (issue 6) ----

using InvCase = AttnCase;

// Deterministic values for (kind, seq, pos, index): the same row gets the same Q/K/V whichever
// step computes it.
float HashValue(uint64_t kind, uint64_t seq, uint64_t pos, uint64_t idx) {
  uint64_t z = (kind << 60) ^ (seq << 44) ^ (pos << 20) ^ idx;
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

// The same query rows computed in different steps (decode alone, decode among 127 others, a
// prefill chunk among other chunks, prefills split at different chunk boundaries) are bitwise
// equal in the bf16 mode, across fixed key splits, and within tolerance of a double reference.
class AttentionInvariantTest : public CudaOpsTest,
                               public ::testing::WithParamInterface<InvCase> {
 protected:
  static constexpr int32_t kTargetPos = 1100;  // spans three 512-key splits
  static constexpr int32_t kTargetBlocks = 80, kOtherBlocks = 8, kOthers = 130;

  std::vector<int32_t> Blocks(int32_t seq) const {
    std::vector<int32_t> ids(static_cast<size_t>(seq == 0 ? kTargetBlocks : kOtherBlocks));
    std::iota(ids.begin(), ids.end(), seq == 0 ? 0 : kTargetBlocks + (seq - 1) * kOtherBlocks);
    std::reverse(ids.begin(), ids.end());  // non-contiguous order shows a wrong table
    return ids;
  }

  // The pool every case uses: the target's blocks and kOthers other sequences' blocks.
  static Status AllocatePool(Backend& b) {
    const InvCase c = GetParam();
    return b.AllocateKvPool(1, kTargetBlocks + kOthers * kOtherBlocks, 16, c.num_kv_heads,
                            c.head_dim);
  }

  // One step of (seq, first_pos, n) entries; returns out [num_tokens, heads * D].
  std::vector<float> Run(Backend& b, const std::vector<std::array<int32_t, 3>>& entries) {
    const InvCase c = GetParam();
    const int32_t D = c.head_dim;
    BatchPlan plan;
    std::vector<float> q, k, v;
    for (const auto& [seq, first, n] : entries) {
      plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(n), 1), first, Blocks(seq),
                       false);
      for (int32_t pos = first; pos < first + n; ++pos) {
        for (int32_t i = 0; i < c.num_heads * D; ++i) q.push_back(HashValue(1, seq, pos, i));
        for (int32_t i = 0; i < c.num_kv_heads * D; ++i) {
          k.push_back(HashValue(2, seq, pos, i));
          v.push_back(HashValue(3, seq, pos, i));
        }
      }
    }
    EXPECT_TRUE(b.BeginStep(plan).ok());
    const int32_t T = plan.num_tokens();
    Tensor qt = Upload(b, q, {T, c.num_heads, D});
    Tensor kt = Upload(b, k, {T, c.num_kv_heads, D});
    Tensor vt = Upload(b, v, {T, c.num_kv_heads, D});
    b.WriteKv(0, kt, vt);
    AttentionParams p{0, c.num_heads, c.num_kv_heads, D, 1.0f / std::sqrt(float(D)), c.window,
                      c.softcap};
    Tensor out = b.Alloc({T, c.num_heads * D});
    b.Attention(p, qt, out);
    return Download(b, out);
  }

  // Row `index` of a step's output.
  std::vector<float> Row(const std::vector<float>& out, int32_t index) const {
    const size_t w = static_cast<size_t>(GetParam().num_heads * GetParam().head_dim);
    return std::vector<float>(out.begin() + static_cast<int64_t>(index * w),
                              out.begin() + static_cast<int64_t>((index + 1) * w));
  }

  // Double-precision attention of the target sequence's row at `pos` over keys [lo, pos].
  std::vector<double> Reference(int32_t pos) const {
    const InvCase c = GetParam();
    const int32_t D = c.head_dim, group = c.num_heads / c.num_kv_heads;
    const int32_t lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
    std::vector<double> ref(static_cast<size_t>(c.num_heads * D));
    for (int32_t h = 0; h < c.num_heads; ++h) {
      const int32_t kvh = h / group;
      const std::vector<double> head = ReferenceHead(
          D, lo, pos, 1.0 / std::sqrt(static_cast<double>(D)), c.softcap,
          [&](int32_t d) { return HashValue(1, 0, pos, h * D + d); },
          [&](int32_t j, int32_t d) { return HashValue(2, 0, j, kvh * D + d); },
          [&](int32_t j, int32_t d) { return HashValue(3, 0, j, kvh * D + d); });
      std::copy(head.begin(), head.end(), ref.begin() + h * D);
    }
    return ref;
  }
};

TEST_P(AttentionInvariantTest, RowsIndependentOfTheStep) {
  auto b = Make(false);
  ASSERT_TRUE(AllocatePool(*b).ok());
  const int32_t P = kTargetPos;
  // (d) The target's prompt [0, P] as one chunk, then split at other boundaries (the later
  // chunks attend to the cached earlier part): every row bitwise equal.
  const std::vector<float> whole = Run(*b, {{0, 0, P + 1}});
  const std::vector<std::vector<std::array<int32_t, 2>>> chunkings = {
      {{0, 700}, {700, P + 1}}, {{0, 64}, {64, 513}, {513, 1000}, {1000, P + 1}}};
  for (size_t ci = 0; ci < chunkings.size(); ++ci) {
    std::vector<float> joined;
    for (const auto& [begin, end] : chunkings[ci]) {
      const std::vector<float> part = Run(*b, {{0, begin, end - begin}});
      joined.insert(joined.end(), part.begin(), part.end());
    }
    ASSERT_EQ(joined.size(), whole.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < whole.size(); ++i) mismatches += joined[i] != whole[i];
    EXPECT_EQ(mismatches, 0u) << "chunking " << ci << " differs from the one-chunk prefill";
  }
  const std::vector<float> row_p = Row(whole, P);
  // (a) Decode alone (few blocks: the split-mode path with the combine kernel).
  EXPECT_EQ(Row(Run(*b, {{0, P, 1}}), 0), row_p) << "decode alone";
  // (b) Decode among 127 other sequences.
  std::vector<std::array<int32_t, 3>> batch;
  for (int32_t s = 1; s <= 127; ++s) batch.push_back({s, (s * 7) % 100, 1});
  batch.insert(batch.begin() + 60, {0, P, 1});
  EXPECT_EQ(Row(Run(*b, batch), 60), row_p) << "decode with 127 others";
  // (c) Inside a prefill chunk [P - 20, P] between other sequences' chunks.
  EXPECT_EQ(Row(Run(*b, {{128, 0, 30}, {0, P - 20, 21}, {129, 0, 50}}), 30 + 20), row_p)
      << "prefill chunk among others";
  // Against the double reference (the bf16 mode's tolerance), rows across the split bounds.
  for (int32_t pos : {0, 37, 511, 512, 700, 1023, 1024, P}) {
    EXPECT_LT(RelL2(Row(whole, pos), Reference(pos)), 2e-2) << "pos " << pos;
  }
}

// A prefill takes the kernel's two-m-tile block shape (Q in shared memory, mask-free whole tiles),
// a step of single rows the one-m-tile decode shape: every row lands in a different warp, m-tile
// and block position in the two, yet each row is bitwise the same. 128 decode rows of the target
// sequence (one step; the entries share its block table) against the one-chunk prefill: the first
// 48 rows (one tile), rows across the split and tile bounds, the last 64.
TEST_P(AttentionInvariantTest, PrefillRowsEqualDecodeRows) {
  auto b = Make(false);
  ASSERT_TRUE(AllocatePool(*b).ok());
  const int32_t P = kTargetPos;
  const std::vector<float> whole = Run(*b, {{0, 0, P + 1}});
  std::vector<int32_t> positions;
  for (int32_t pos = 0; pos < 48; ++pos) positions.push_back(pos);
  for (int32_t pos : {63, 64, 65, 127, 128, 200, 511, 512, 513, 575, 576, 700, 1023, 1024, 1025,
                      1030}) {
    positions.push_back(pos);
  }
  for (int32_t pos = P - 63; pos <= P; ++pos) positions.push_back(pos);
  ASSERT_EQ(positions.size(), 128u);
  std::vector<std::array<int32_t, 3>> batch;
  for (int32_t pos : positions) batch.push_back({0, pos, 1});
  const std::vector<float> decode = Run(*b, batch);
  size_t mismatched_rows = 0;
  for (size_t i = 0; i < positions.size(); ++i) {
    const bool same = Row(decode, static_cast<int32_t>(i)) == Row(whole, positions[i]);
    mismatched_rows += !same;
    EXPECT_TRUE(same) << "pos " << positions[i];
  }
  EXPECT_EQ(mismatched_rows, 0u);
}

// The bf16 pool (WriteKv rounds RN once) gives bitwise the attention of an f32 pool (the kernel
// rounds RN as it stages the tiles): prefill chunks, decode alone (split mode), decode in a batch.
TEST_P(AttentionInvariantTest, Bf16PoolMatchesF32Pool) {
  const InvCase c = GetParam();
  std::vector<std::vector<float>> outs[2];
  for (int f32_pool = 0; f32_pool < 2; ++f32_pool) {
    CudaBackendOptions options;
    options.kv_f32 = f32_pool == 1;
    auto created = CreateCudaBackend(0, options);
    ASSERT_TRUE(created.ok()) << created.status().message();
    Backend& b = **created;
    EXPECT_EQ(b.KvElementBytes(c.head_dim), f32_pool == 1 ? 4 : 2);
    ASSERT_TRUE(AllocatePool(b).ok());
    outs[f32_pool].push_back(Run(b, {{0, 0, 700}}));
    outs[f32_pool].push_back(Run(b, {{0, 700, kTargetPos + 1 - 700}, {1, 0, 40}}));
    outs[f32_pool].push_back(Run(b, {{0, kTargetPos, 1}}));
    std::vector<std::array<int32_t, 3>> batch;
    for (int32_t s = 2; s <= 127; ++s) batch.push_back({s, (s * 7) % 100, 1});
    batch.push_back({0, kTargetPos, 1});
    batch.push_back({1, 40, 1});
    outs[f32_pool].push_back(Run(b, batch));
  }
  ASSERT_EQ(outs[0].size(), outs[1].size());
  for (size_t step = 0; step < outs[0].size(); ++step) {
    ASSERT_EQ(outs[0][step].size(), outs[1][step].size());
    size_t mismatches = 0;
    for (size_t i = 0; i < outs[0][step].size(); ++i)
      mismatches += std::memcmp(&outs[0][step][i], &outs[1][step][i], 4) != 0;
    EXPECT_EQ(mismatches, 0u) << "step " << step << " of " << outs[0][step].size() << " values";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionInvariantTest,
    ::testing::Values(InvCase{16, 8, 1, 0, 0.f}, InvCase{16, 4, 4, 100, 30.f},
                      InvCase{32, 4, 2, 0, 50.f}, InvCase{32, 8, 1, 700, 0.f},
                      InvCase{64, 8, 2, 0, 0.f}, InvCase{64, 8, 8, 300, 20.f},
                      InvCase{128, 32, 8, 0, 0.f}, InvCase{128, 8, 1, 600, 30.f},
                      InvCase{256, 8, 4, 0, 50.f}, InvCase{256, 4, 4, 600, 0.f},
                      InvCase{256, 16, 2, 100, 30.f}, InvCase{80, 4, 1, 0, 0.f}),
    AttnCaseName);

}  // namespace
}  // namespace ember
