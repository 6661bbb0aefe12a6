// The quantized CPU matmul (Q8_0, Q4_0 weights) against a dequantize-then-double reference for
// decode- and prefill-sized x and awkward shapes (m tails of the column tiles, row-group tails,
// k of 1 to 64 blocks), with the stated tolerances: the float32-x kernel within
// 1e-5 * sum|w x| + 1e-6 of the exact product; the int8-x kernel (x quantized per block of 32)
// within its quantization bound sum_b (max|x_b| / 254) sum_j |w_j| (+ the same float slack), and
// within 1e-5 * sum|w x| of the double product of the int8 x it used. Also: a row's result never
// depends on its batch-mates or the thread count (per kernel), the int8-x outputs are bitwise
// equal for every integer-dot ISA the CPU has, and the quantizers follow ggml's reference rules.
#include "backend/cpu/matmul_quant.h"

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "util/half.h"

namespace ember::cpu {
namespace {

struct Case {
  int64_t n, k, m;
};

const Case kCases[] = {{1, 32, 1},   {1, 64, 67},   {2, 96, 13},    {3, 32, 5},
                       {5, 128, 131}, {8, 256, 70},  {9, 64, 3},     {13, 320, 67},
                       {37, 96, 131}, {4, 2048, 64}, {1, 2048, 200}, {17, 2048, 200}};

std::vector<float> Random(int64_t count, std::mt19937& rng, float sigma) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> Quantize(DType dtype, const std::vector<float>& w, int64_t m, int64_t k) {
  const size_t row_bytes = DTypeRowBytes(dtype, k);
  std::vector<uint8_t> q(row_bytes * static_cast<size_t>(m));
  for (int64_t r = 0; r < m; ++r) QuantizeRow(dtype, w.data() + r * k, k, q.data() + r * row_bytes);
  return q;
}

std::vector<float> Dequantize(DType dtype, const std::vector<uint8_t>& q, int64_t m, int64_t k) {
  const size_t row_bytes = DTypeRowBytes(dtype, k);
  std::vector<float> w(static_cast<size_t>(m * k));
  for (int64_t r = 0; r < m; ++r) DequantizeQuantRow(dtype, q.data() + r * row_bytes, k, w.data() + r * k);
  return w;
}

// x as the prefill kernel quantizes it: per block d = max|x| / 127, q = nearest-even(x / d).
std::vector<double> QuantizedActivations(const std::vector<float>& x) {
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0.0f;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    for (size_t j = 0; j < 32; ++j) out[b + j] = std::nearbyint(x[b + j] * inv) * double(d);
  }
  return out;
}

void RunMatMul(const std::vector<float>& x, const Case& c, const std::vector<uint8_t>& q, DType dtype,
         const std::vector<float>& bias, ThreadPool& pool, std::vector<float>* out) {
  out->assign(static_cast<size_t>(c.n * c.m), NAN);
  MatMulQuant(x.data(), c.n, c.k, q.data(), dtype, c.m, bias.data(), out->data(), pool);
}

TEST(MatMulQuantTest, MatchesDequantizedReferenceWithinStatedTolerance) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " n=" + std::to_string(c.n) +
                   " k=" + std::to_string(c.k) + " m=" + std::to_string(c.m));
      const std::vector<float> x = Random(c.n * c.k, rng, 1.0f);
      const std::vector<uint8_t> q = Quantize(dtype, Random(c.m * c.k, rng, 0.05f), c.m, c.k);
      const std::vector<float> w = Dequantize(dtype, q, c.m, c.k);
      const std::vector<float> bias = Random(c.m, rng, 1.0f);
      const std::vector<double> xq = QuantizedActivations(x);
      std::vector<float> out, out_float_x;
      RunMatMul(x, c, q, dtype, bias, pool, &out);
      SetQuantKernel(QuantKernel::kFloatX, QuantIsa::kAuto);
      RunMatMul(x, c, q, dtype, bias, pool, &out_float_x);
      SetQuantKernel(QuantKernel::kInt8X, QuantIsa::kAuto);
      for (int64_t i = 0; i < c.n; ++i) {
        for (int64_t j = 0; j < c.m; ++j) {
          double exact = bias[size_t(j)], exact_q = bias[size_t(j)], magnitude = 0, bound = 0;
          for (int64_t b = 0; b < c.k; b += 32) {
            float amax = 0.0f;
            double wabs = 0;
            for (int64_t t = b; t < b + 32; ++t) {
              const size_t xi = size_t(i * c.k + t), wi = size_t(j * c.k + t);
              exact += double(x[xi]) * w[wi];
              exact_q += xq[xi] * w[wi];
              magnitude += std::fabs(double(x[xi]) * w[wi]);
              amax = std::max(amax, std::fabs(x[xi]));
              wabs += std::fabs(w[wi]);
            }
            bound += amax / 254.0 * wabs;
          }
          const double got = out[size_t(i * c.m + j)];
          const double slack = 1e-5 * magnitude + 1e-6;
          ASSERT_NEAR(got, exact_q, slack) << "int8 x: row " << i << " col " << j;
          ASSERT_NEAR(got, exact, bound * 1.0001 + slack) << "int8 x: row " << i << " col " << j;
          ASSERT_NEAR(out_float_x[size_t(i * c.m + j)], exact, slack)
              << "float x: row " << i << " col " << j;
        }
      }
    }
  }
}

// Row i of an n-row product on two threads equals the 1-row product of row i on one thread,
// bit for bit, within each kernel (n = 23: the float-x kernel's groups of 8 and a tail of 7).
TEST(MatMulQuantTest, RowsAreIndependentOfBatchAndThreads) {
  std::mt19937 rng(5);
  ThreadPool one(1), two(2);
  for (QuantKernel kernel : {QuantKernel::kFloatX, QuantKernel::kInt8X}) {
    SetQuantKernel(kernel, QuantIsa::kAuto);
    for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
      const Case c{23, 2048, 300};
      const std::vector<float> x = Random(c.n * c.k, rng, 1.0f);
      const std::vector<uint8_t> q = Quantize(dtype, Random(c.m * c.k, rng, 0.05f), c.m, c.k);
      const std::vector<float> bias = Random(c.m, rng, 1.0f);
      std::vector<float> all;
      RunMatMul(x, c, q, dtype, bias, two, &all);
      for (int64_t i = 0; i < c.n; ++i) {
        const std::vector<float> xi(x.begin() + i * c.k, x.begin() + (i + 1) * c.k);
        std::vector<float> alone;
        RunMatMul(xi, Case{1, c.k, c.m}, q, dtype, bias, one, &alone);
        ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + i * c.m, sizeof(float) * c.m))
            << DTypeName(dtype) << " row " << i;
      }
    }
  }
  SetQuantKernel(QuantKernel::kInt8X, QuantIsa::kAuto);
}

// Odd block counts (the 512-bit kernel's pair tail; its decode tile's groups of 8 blocks, then
// pairs, then a last block), decode and prefill row counts, odd column counts.
TEST(MatMulQuantTest, PrefillIsBitwiseEqualAcrossIntegerDotIsas) {
  std::mt19937 rng(9);
  ThreadPool pool(2);
  for (const Case& c : {Case{19, 640, 70}, Case{1, 608, 37}, Case{6, 96, 9}, Case{2, 32, 5},
                        Case{2, 1056, 21}, Case{1, 2048, 67}, Case{5, 544, 11}}) {
    for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
      const std::vector<float> x = Random(c.n * c.k, rng, 1.0f);
      const std::vector<uint8_t> q = Quantize(dtype, Random(c.m * c.k, rng, 0.05f), c.m, c.k);
      const std::vector<float> bias = Random(c.m, rng, 1.0f);
      SetQuantKernel(QuantKernel::kInt8X, QuantIsa::kAvx2);
      std::vector<float> reference;
      RunMatMul(x, c, q, dtype, bias, pool, &reference);
      int compared = 0;
      for (QuantIsa isa : {QuantIsa::kAvxVnni, QuantIsa::kAvx512Vnni}) {
        if (!CpuHasQuantIsa(isa)) continue;
        SetQuantKernel(QuantKernel::kInt8X, isa);
        std::vector<float> got;
        RunMatMul(x, c, q, dtype, bias, pool, &got);
        EXPECT_EQ(0, std::memcmp(reference.data(), got.data(), sizeof(float) * got.size()))
            << DTypeName(dtype) << " isa " << int(isa) << " n " << c.n << " k " << c.k;
        ++compared;
      }
      if (compared == 0) GTEST_LOG_(INFO) << "no VNNI on this CPU: only the AVX2 dot ran";
    }
  }
  SetQuantKernel(QuantKernel::kInt8X, QuantIsa::kAuto);
}

// ggml's reference quantizers on hand-made blocks.
TEST(MatMulQuantTest, QuantizersFollowGgmlReferenceRules) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[size_t(j)] = (j - 12) * 0.25f;  // max |x| = 19 * 0.25 = 4.75
  std::vector<uint8_t> q8(34), q4(18);
  QuantizeRow(DType::kQ8_0, x.data(), 32, q8.data());
  uint16_t h;
  std::memcpy(&h, q8.data(), 2);
  EXPECT_EQ(h, F32ToF16(4.75f / 127.0f));
  const float inv8 = 1.0f / (4.75f / 127.0f);
  for (int j = 0; j < 32; ++j)
    EXPECT_EQ(static_cast<int8_t>(q8[size_t(2 + j)]), int(std::roundf(x[size_t(j)] * inv8))) << j;
  QuantizeRow(DType::kQ4_0, x.data(), 32, q4.data());
  std::memcpy(&h, q4.data(), 2);
  const float d4 = 4.75f / -8.0f;  // the signed max is +4.75
  EXPECT_EQ(h, F32ToF16(d4));
  const float inv4 = 1.0f / d4;
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, int(int8_t(x[size_t(j)] * inv4 + 8.5f)));
    const int hi = std::min(15, int(int8_t(x[size_t(j + 16)] * inv4 + 8.5f)));
    EXPECT_EQ(q4[size_t(2 + j)], lo | (hi << 4)) << j;
  }
  // A tie that fused multiply-add rounding would break: 0.703125 / (0.75 / -8) = -7.5 exactly in
  // two float steps (x * (1 / d) rounds to -7.5), so q = trunc(-7.5 + 8.5) = 1, as llama-quantize
  // writes it (one fma gives 0.99999978 and q = 0).
  std::vector<float> tie(32, 0.0f);
  tie[0] = 0.75f;
  tie[1] = 0.703125f;
  QuantizeRow(DType::kQ4_0, tie.data(), 32, q4.data());
  EXPECT_EQ(q4[3] & 0x0f, 1);
  QuantizeRow(DType::kQ4_0, x.data(), 32, q4.data());
  std::vector<float> back(32);
  DequantizeQuantRow(DType::kQ4_0, q4.data(), 32, back.data());
  EXPECT_FLOAT_EQ(back[31], -8 * F16ToF32(h));  // the max maps to q = 0: (0 - 8) * d
  DequantizeQuantRow(DType::kQ8_0, q8.data(), 32, back.data());
  for (int j = 0; j < 32; ++j) EXPECT_NEAR(back[size_t(j)], x[size_t(j)], 4.75f / 127.0f) << j;
}

}  // namespace
}  // namespace ember::cpu
