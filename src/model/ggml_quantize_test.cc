// QuantizeGgmlRows (ggml_quantize.h): Q5_0 / Q5_1 on a hand-worked block, their round trip through
// gguf_quants' dequantizer within half a step, and Q5_1 against llama-quantize's ts-q5_1.gguf
// (from ts-f32.gguf, no importance matrix) byte for byte. Skips the fixture part without it.
#include "model/ggml_quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "model/gguf.h"
#include "util/testing.h"

namespace ember {
namespace {

TEST(GgmlQuantizeTest, Q5BlocksByHand) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[size_t(j)] = static_cast<float>(j - 16);
  // Q5_0: the largest magnitude is -16, so d = 1 and q = trunc(x + 16.5) = j.
  const std::vector<uint8_t> q5_0 = QuantizeGgmlRows(x, 32, GgmlType::kQ5_0, 1);
  ASSERT_EQ(q5_0.size(), 22u);
  EXPECT_EQ(q5_0[0], 0x00);
  EXPECT_EQ(q5_0[1], 0x3C);  // f16 1.0
  uint32_t qh;
  std::memcpy(&qh, &q5_0[2], 4);
  EXPECT_EQ(qh, 0xFFFF0000u);  // elements 16..31 have the fifth bit
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q5_0[size_t(6 + j)], j | (j << 4)) << j;
  // Q5_1: min -16, d = 31 / 31 = 1, q = trunc(x + 16 + 0.5) = j.
  const std::vector<uint8_t> q5_1 = QuantizeGgmlRows(x, 32, GgmlType::kQ5_1, 1);
  ASSERT_EQ(q5_1.size(), 24u);
  EXPECT_EQ(q5_1[1], 0x3C);
  EXPECT_EQ(q5_1[2], 0x00);
  EXPECT_EQ(q5_1[3], 0xCC);  // f16 -16.0
  std::memcpy(&qh, &q5_1[4], 4);
  EXPECT_EQ(qh, 0xFFFF0000u);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q5_1[size_t(8 + j)], j | (j << 4)) << j;
}

TEST(GgmlQuantizeTest, RoundTripsWithinHalfAStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t cols = 256;
  std::vector<float> x(size_t(4 * cols));
  for (float& v : x) v = dist(rng);
  // Within about half a step over +-4 sigma (6 bits: 0.07, 5 bits: 0.14, 4 bits: 0.27).
  for (const auto& [type, bound] : {std::pair{GgmlType::kQ5_0, 0.15},
                                    {GgmlType::kQ5_1, 0.15},
                                    {GgmlType::kQ8_0, 0.02},
                                    {GgmlType::kQ4_K, 0.3},
                                    {GgmlType::kQ6_K, 0.08},
                                    {GgmlType::kF16, 0.002},
                                    {GgmlType::kBF16, 0.02},
                                    {GgmlType::kF32, 0.0}}) {
    const std::vector<uint8_t> q = QuantizeGgmlRows(x, cols, type, 2);
    auto row_bytes = GgmlRowBytes(type, cols);
    ASSERT_TRUE(row_bytes.ok());
    ASSERT_EQ(q.size(), 4 * *row_bytes) << GgmlTypeName(type);
    std::vector<float> back(x.size());
    for (size_t r = 0; r < 4; ++r)
      DequantizeRow(type, q.data() + r * *row_bytes, cols, back.data() + r * cols);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, double(std::fabs(back[i] - x[i])));
    EXPECT_LE(worst, bound) << GgmlTypeName(type);
  }
}

TEST(GgmlQuantizeTest, Q5_1EqualsLlamaQuantize) {
  const std::string dir = testing::FixturesDir() + "/gguf";
  EMBER_REQUIRE_DIR(dir);
  auto f32 = GgufFile::Open(dir + "/ts-f32.gguf");
  auto q5_1 = GgufFile::Open(dir + "/ts-q5_1.gguf");
  ASSERT_TRUE(f32.ok() && q5_1.ok());
  int compared = 0;
  for (const GgufTensorInfo& want : q5_1->tensors()) {
    if (want.type != GgmlType::kQ5_1) continue;
    const GgufTensorInfo* src = f32->FindTensor(want.name);
    ASSERT_TRUE(src != nullptr && src->type == GgmlType::kF32) << want.name;
    std::vector<float> values(static_cast<size_t>(src->num_elements()));
    std::memcpy(values.data(), src->data, values.size() * 4);
    const std::vector<uint8_t> got = QuantizeGgmlRows(values, src->row_length(), want.type, 2);
    ASSERT_EQ(got.size(), want.nbytes) << want.name;
    EXPECT_EQ(0, std::memcmp(got.data(), want.data, got.size())) << want.name;
    ++compared;
  }
  EXPECT_GT(compared, 0);
}

}  // namespace
}  // namespace ember
