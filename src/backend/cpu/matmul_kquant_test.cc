// The k-quant CPU matmul (Q4_K, Q5_K, Q6_K weights kept packed) on random super-blocks (random
// quant bytes, random f16 scales): its dequantization bit for bit against ggml's (ember_gguf's
// DequantizeRow); MatMulKQuant against a double product of the dequantized weights within
// 1e-5 * sum|w x| + 1e-6 for decode (n = 1) and prefill (n > 8, row-group tails) x, odd and
// tile-tail m, k of 1 to 8 super-blocks, with and without bias, on 1 and 3 threads; a row's
// result bitwise independent of its batch-mates and the thread count; MatMulQuant dispatching
// the k-quants to it under QuantKernel::kFloatX; the packed row sizes. The int8-x kernel
// (MatMulQuant's default): within 1e-5 * sum|w x| + 1e-6 of the double product of the int8 x it
// used (x quantized per 256, round to nearest even) and within its quantization bound
// sum_sb (max|x_sb| / 254) sum |w| of the exact product; rows independent of batch-mates and
// threads; bitwise equal for every integer-dot ISA the CPU has.
#include "backend/cpu/matmul_kquant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/matmul_quant.h"
#include "model/gguf_quants.h"
#include "util/half.h"

namespace ember::cpu {
namespace {

const DType kTypes[] = {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

GgmlType ToGgml(DType t) {
  return t == DType::kQ4_K ? GgmlType::kQ4_K : t == DType::kQ5_K ? GgmlType::kQ5_K : GgmlType::kQ6_K;
}

// m rows of k values: random bytes, with each super-block's f16 scales set to finite values of
// either sign (Q4_K / Q5_K: d at 0, dmin at 2; Q6_K: d at 208).
std::vector<uint8_t> RandomMatrix(DType t, int64_t m, int64_t k, std::mt19937& rng) {
  const size_t row_bytes = DTypeRowBytes(t, k), block_bytes = DTypeRowBytes(t, 256);
  std::vector<uint8_t> w(row_bytes * static_cast<size_t>(m));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  auto put = [&](uint8_t* p) {
    const uint16_t h = F32ToF16(scale(rng));
    std::memcpy(p, &h, 2);
  };
  for (size_t off = 0; off < w.size(); off += block_bytes) {
    if (t == DType::kQ6_K) {
      put(w.data() + off + 208);
    } else {
      put(w.data() + off);
      put(w.data() + off + 2);
    }
  }
  return w;
}

std::vector<float> RandomFloats(int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(MatMulKQuantTest, DequantizationIsBitExactWithGgml) {
  std::mt19937 rng(7);
  for (DType t : kTypes) {
    const int64_t k = 256 * 6;
    const std::vector<uint8_t> w = RandomMatrix(t, 3, k, rng);
    std::vector<float> ours(static_cast<size_t>(3 * k)), ggml(ours.size());
    DequantizeQuantRow(t, w.data(), 3 * k, ours.data());  // the backend's entry point
    DequantizeRow(ToGgml(t), w.data(), 3 * k, ggml.data());
    ASSERT_EQ(0, std::memcmp(ours.data(), ggml.data(), ours.size() * sizeof(float)))
        << DTypeName(t);
  }
}

TEST(MatMulKQuantTest, RowBytesAreGgmls) {
  EXPECT_EQ(DTypeRowBytes(DType::kQ4_K, 512), 2u * 144);
  EXPECT_EQ(DTypeRowBytes(DType::kQ5_K, 512), 2u * 176);
  EXPECT_EQ(DTypeRowBytes(DType::kQ6_K, 512), 2u * 210);
  for (DType t : kTypes) {
    EXPECT_EQ(DTypeBlockValues(t), 256);
    EXPECT_EQ(DTypeRowBytes(t, 256), static_cast<size_t>(GgmlTraits(ToGgml(t)).type_size));
  }
}

struct Case {
  int64_t n, k, m;
};
const Case kCases[] = {{1, 256, 1},  {1, 512, 67},   {2, 256, 5},    {3, 768, 13},
                       {9, 256, 3},  {17, 1024, 70}, {33, 512, 131}, {1, 2048, 200},
                       {8, 2048, 64}, {40, 2048, 9}};

TEST(MatMulKQuantTest, MatchesDequantizedReferenceWithinStatedTolerance) {
  std::mt19937 rng(1);
  ThreadPool one(1), three(3);
  for (DType t : kTypes) {
    for (const Case& c : kCases) {
      const std::vector<uint8_t> w = RandomMatrix(t, c.m, c.k, rng);
      std::vector<float> wf(static_cast<size_t>(c.m * c.k));
      DequantizeRow(ToGgml(t), w.data(), c.m * c.k, wf.data());
      const std::vector<float> x = RandomFloats(c.n * c.k, rng), bias = RandomFloats(c.m, rng);
      for (ThreadPool* pool : {&one, &three}) {
        for (bool with_bias : {false, true}) {
          std::vector<float> out(static_cast<size_t>(c.n * c.m), NAN);
          MatMulKQuant(x.data(), c.n, c.k, w.data(), t, c.m, with_bias ? bias.data() : nullptr,
                       out.data(), *pool);
          for (int64_t r = 0; r < c.n; ++r)
            for (int64_t j = 0; j < c.m; ++j) {
              double exact = with_bias ? bias[j] : 0.0, magnitude = 0.0;
              for (int64_t i = 0; i < c.k; ++i) {
                const double p = double(x[r * c.k + i]) * double(wf[j * c.k + i]);
                exact += p;
                magnitude += std::fabs(p);
              }
              ASSERT_NEAR(out[r * c.m + j], exact, 1e-5 * magnitude + 1e-6)
                  << DTypeName(t) << " n " << c.n << " k " << c.k << " m " << c.m << " row " << r
                  << " col " << j << " threads " << pool->num_threads();
            }
        }
      }
    }
  }
}

TEST(MatMulKQuantTest, RowsAreIndependentOfBatchAndThreadsAndMatMulQuantDispatches) {
  std::mt19937 rng(3);
  ThreadPool one(1), two(2);
  const Case c{37, 1024, 131};
  for (DType t : kTypes) {
    const std::vector<uint8_t> w = RandomMatrix(t, c.m, c.k, rng);
    const std::vector<float> x = RandomFloats(c.n * c.k, rng);
    std::vector<float> all(static_cast<size_t>(c.n * c.m)), via_quant(all.size());
    MatMulKQuant(x.data(), c.n, c.k, w.data(), t, c.m, nullptr, all.data(), two);
    SetQuantKernel(QuantKernel::kFloatX, QuantIsa::kAuto);
    MatMulQuant(x.data(), c.n, c.k, w.data(), t, c.m, nullptr, via_quant.data(), two);
    SetQuantKernel(QuantKernel::kInt8X, QuantIsa::kAuto);
    ASSERT_EQ(0, std::memcmp(all.data(), via_quant.data(), all.size() * sizeof(float)));
    for (int64_t i : {int64_t{0}, int64_t{5}, int64_t{16}, c.n - 1}) {
      std::vector<float> alone(static_cast<size_t>(c.m));
      MatMulKQuant(x.data() + i * c.k, 1, c.k, w.data(), t, c.m, nullptr, alone.data(), one);
      ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + i * c.m, sizeof(float) * c.m))
          << DTypeName(t) << " row " << i;
    }
  }
}

// x as the int8-x kernel sees it: per super-block of 256, round-to-nearest-even(x / d) * d with
// d = max|x| / 127 (float32 d, as the kernel).
std::vector<double> Int8Activations(const std::vector<float>& x) {
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size(); b += 256) {
    float amax = 0.0f;
    for (size_t j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    for (size_t j = 0; j < 256; ++j) out[b + j] = std::nearbyint(x[b + j] * inv) * double(d);
  }
  return out;
}

void RunInt8(const std::vector<float>& x, const Case& c, const std::vector<uint8_t>& w, DType t,
             const float* bias, ThreadPool& pool, std::vector<float>* out) {
  out->assign(static_cast<size_t>(c.n * c.m), NAN);
  MatMulQuant(x.data(), c.n, c.k, w.data(), t, c.m, bias, out->data(), pool);
}

TEST(MatMulKQuantTest, Int8XMatchesReferenceWithinStatedTolerance) {
  std::mt19937 rng(13);
  ThreadPool two(2);
  for (DType t : kTypes) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " n=" + std::to_string(c.n) +
                   " k=" + std::to_string(c.k) + " m=" + std::to_string(c.m));
      const std::vector<uint8_t> w = RandomMatrix(t, c.m, c.k, rng);
      std::vector<float> wf(static_cast<size_t>(c.m * c.k));
      DequantizeRow(ToGgml(t), w.data(), c.m * c.k, wf.data());
      const std::vector<float> x = RandomFloats(c.n * c.k, rng), bias = RandomFloats(c.m, rng);
      const std::vector<double> xq = Int8Activations(x);
      std::vector<float> out;
      RunInt8(x, c, w, t, bias.data(), two, &out);
      for (int64_t r = 0; r < c.n; ++r)
        for (int64_t j = 0; j < c.m; ++j) {
          double exact = bias[j], exact_q = bias[j], magnitude = 0.0, bound = 0.0;
          for (int64_t b = 0; b < c.k; b += 256) {
            float amax = 0.0f;
            double wabs = 0.0;
            for (int64_t i = b; i < b + 256; ++i) {
              const double wi = wf[j * c.k + i], xi = x[r * c.k + i];
              exact += xi * wi;
              exact_q += xq[r * c.k + i] * wi;
              magnitude += std::fabs(xi * wi);
              amax = std::max(amax, std::fabs(x[r * c.k + i]));
              wabs += std::fabs(wi);
            }
            bound += amax / 254.0 * wabs;
          }
          const double got = out[r * c.m + j], slack = 1e-5 * magnitude + 1e-6;
          ASSERT_NEAR(got, exact_q, slack) << "row " << r << " col " << j;
          ASSERT_NEAR(got, exact, bound * 1.0001 + slack) << "row " << r << " col " << j;
        }
    }
  }
}

TEST(MatMulKQuantTest, Int8XRowsAreIndependentAndBitwiseEqualAcrossIsas) {
  std::mt19937 rng(17);
  ThreadPool one(1), two(2);
  const Case c{21, 1024, 131};
  for (DType t : kTypes) {
    const std::vector<uint8_t> w = RandomMatrix(t, c.m, c.k, rng);
    const std::vector<float> x = RandomFloats(c.n * c.k, rng), bias = RandomFloats(c.m, rng);
    SetQuantKernel(QuantKernel::kInt8X, QuantIsa::kAvx2);
    std::vector<float> reference;
    RunInt8(x, c, w, t, bias.data(), two, &reference);
    for (QuantIsa isa : {QuantIsa::kAvx2, QuantIsa::kAvxVnni, QuantIsa::kAvx512Vnni}) {
      if (!CpuHasQuantIsa(isa)) continue;
      SetQuantKernel(QuantKernel::kInt8X, isa);
      std::vector<float> all;
      RunInt8(x, c, w, t, bias.data(), two, &all);
      ASSERT_EQ(0, std::memcmp(reference.data(), all.data(), sizeof(float) * all.size()))
          << DTypeName(t) << " isa " << int(isa);
      for (int64_t i : {int64_t{0}, int64_t{4}, int64_t{8}, c.n - 1}) {
        const std::vector<float> xi(x.begin() + i * c.k, x.begin() + (i + 1) * c.k);
        std::vector<float> alone;
        RunInt8(xi, Case{1, c.k, c.m}, w, t, bias.data(), one, &alone);
        ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + i * c.m, sizeof(float) * c.m))
            << DTypeName(t) << " isa " << int(isa) << " row " << i;
      }
    }
  }
  SetQuantKernel(QuantKernel::kInt8X, QuantIsa::kAuto);
}

}  // namespace
}  // namespace ember::cpu
