// Each logits processor against a hand-computed example; logprob helpers against double.
#include "sampling/processors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace ember {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(ProcessorsTest, LogitBiasAddsToListedIds) {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const std::vector<std::pair<int32_t, float>> bias = {{0, 5.0f}, {2, -100.0f}, {0, 1.0f}};
  ApplyLogitBias(logits, bias);
  EXPECT_EQ(logits, (std::vector<float>{7.0f, 2.0f, -97.0f}));
}

TEST(ProcessorsTest, PenaltiesMatchHandComputedValues) {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
  // id 0 seen only in the prompt; id 1 output twice; id 3 output once.
  const std::vector<int32_t> seen = {0, 1, 3};
  const std::vector<int32_t> counts = {0, 2, 1};
  ApplyPenalties(logits, seen, counts, /*repetition=*/2.0f, /*presence=*/0.5f,
                 /*frequency=*/0.25f);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);   // 2 / 2, no output count
  EXPECT_FLOAT_EQ(logits[1], -5.0f);  // -2 * 2 - (0.25 * 2 + 0.5)
  EXPECT_FLOAT_EQ(logits[2], 1.0f);   // unseen
  EXPECT_FLOAT_EQ(logits[3], -0.5f);  // 0.5 / 2 - (0.25 * 1 + 0.5)
  EXPECT_FLOAT_EQ(logits[4], 3.0f);   // unseen
}

TEST(ProcessorsTest, NegativePenaltiesRewardRepeats) {
  std::vector<float> logits = {0.0f, 0.0f};
  const std::vector<int32_t> seen = {1};
  const std::vector<int32_t> counts = {3};
  ApplyPenalties(logits, seen, counts, 1.0f, -1.0f, -0.5f);
  EXPECT_FLOAT_EQ(logits[0], 0.0f);
  EXPECT_FLOAT_EQ(logits[1], 2.5f);  // 0 - (-0.5 * 3 + -1)
}

TEST(ProcessorsTest, MaskTokensSetsMinusInfinity) {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const std::vector<int32_t> ids = {2};
  MaskTokens(logits, ids);
  EXPECT_EQ(logits[2], -kInf);
  EXPECT_EQ(Argmax(logits), 1);
}

TEST(ProcessorsTest, ArgmaxTiesGoToLowestIdAndSkipsNaN) {
  EXPECT_EQ(Argmax(std::vector<float>{1.0f, 5.0f, 5.0f, -1.0f}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{NAN, 0.0f, NAN, 2.0f, 2.0f}), 3);
  EXPECT_EQ(Argmax(std::vector<float>{-kInf, -kInf}), 0);
}

TEST(ProcessorsTest, LogSumExpAndTopLogprobsMatchDoubleReference) {
  std::mt19937 gen(7);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> logits(3000);
  for (float& x : logits) x = dist(gen);
  logits[10] = logits[20] = 30.0f;  // a tie at the top: lower id first
  double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - max);
  const double reference_lse = max + std::log(sum);
  const double lse = LogSumExp(logits);
  EXPECT_NEAR(lse, reference_lse, 1e-6);

  const auto top = TopLogprobs(logits, lse, 20);
  ASSERT_EQ(top.size(), 20u);
  EXPECT_EQ(top[0].token_id, 10);
  EXPECT_EQ(top[1].token_id, 20);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (size_t i = 0; i < top.size(); ++i) {
    EXPECT_EQ(top[i].token_id, order[i]) << i;
    EXPECT_NEAR(top[i].logprob, logits[order[i]] - reference_lse, 1e-5) << i;
  }
  EXPECT_TRUE(TopLogprobs(logits, lse, 0).empty());
  EXPECT_EQ(TopLogprobs(std::vector<float>{1.0f, 2.0f}, 0.0, 5).size(), 2u);
}

// LogprobRank is the 1-based place in TopLogprobs' order: ties by lower id, NaN last.
TEST(ProcessorsTest, LogprobRankIsThePlaceInTopLogprobsOrder) {
  const std::vector<float> logits = {1.0f, 5.0f, 5.0f, -kInf, NAN, 3.0f};
  const auto top = TopLogprobs(logits, LogSumExp(std::vector<float>{1.0f, 5.0f, 5.0f, 3.0f}), 6);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(LogprobRank(logits, top[i].token_id), int32_t(i) + 1);
  EXPECT_EQ(LogprobRank(logits, 1), 1);
  EXPECT_EQ(LogprobRank(logits, 2), 2);
  EXPECT_EQ(LogprobRank(logits, 5), 3);
  EXPECT_EQ(LogprobRank(logits, 0), 4);
  EXPECT_EQ(LogprobRank(logits, 3), 5);
}

}  // namespace
}  // namespace ember
