// MoeRoute: softmax, top k with the lower index first on ties, ids in ascending order, weights
// renormalised only when asked.
#include "backend/moe_route.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace ember {
namespace {

TEST(MoeRouteTest, TopKSoftmaxWeightsInExpertOrder) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.5f};
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v));
  int32_t ids[2];
  float w[2];
  MoeRoute(logits, 2, /*normalize=*/false, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  EXPECT_NEAR(w[0], std::exp(2.0) / sum, 1e-6);
  EXPECT_NEAR(w[1], std::exp(1.5) / sum, 1e-6);
  MoeRoute(logits, 2, /*normalize=*/true, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  EXPECT_NEAR(w[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.5)), 1e-6);
  EXPECT_NEAR(w[0] + w[1], 1.0, 1e-6);
  // The chosen ids come back ascending even when the higher id ranks first.
  MoeRoute(std::vector<float>{3.0f, 0.0f, 4.0f}, 2, true, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 2);
  EXPECT_GT(w[1], w[0]);
}

TEST(MoeRouteTest, TiesTakeTheLowerIndexAndKCanBeAll) {
  int32_t ids[3];
  float w[3];
  MoeRoute(std::vector<float>{1.0f, 2.0f, 2.0f, 2.0f}, 2, true, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[1], 0.5f);
  MoeRoute(std::vector<float>{0.0f, -1.0f, 1.0f}, 3, false, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(ids[2], 2);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-6);
}

// deepseek_v3's router: groups ranked by the sum of their two best biased scores (not their
// best one), experts chosen by biased score inside the kept groups, weighted by the unbiased
// sigmoid, renormalised when asked, times the scale.
TEST(MoeRouteTest, GroupedSigmoidRouting) {
  const std::vector<float> logits = {3.0f, -3.0f, -3.0f, -3.0f, 1.0f, 1.2f, -2.0f, 0.5f};
  const auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  std::vector<float> bias(8, 0.0f);
  int32_t ids[2];
  float w[2];
  // Group 0 holds the best expert (0) but group 1 the best pair: group 1 is kept.
  MoeRouteGrouped(logits, 2, true, {bias, 2, 1, 2.5f}, ids, w);
  EXPECT_EQ(ids[0], 4);
  EXPECT_EQ(ids[1], 5);
  EXPECT_NEAR(w[0], 2.5 * sig(1.0) / (sig(1.0) + sig(1.2)), 1e-6);
  EXPECT_NEAR(w[1], 2.5 * sig(1.2) / (sig(1.0) + sig(1.2)), 1e-6);
  // The bias moves the choice (expert 7 over 4) but not the weights.
  bias[7] = 1.0f;
  MoeRouteGrouped(logits, 2, true, {bias, 2, 1, 2.5f}, ids, w);
  EXPECT_EQ(ids[0], 5);
  EXPECT_EQ(ids[1], 7);
  EXPECT_NEAR(w[0], 2.5 * sig(1.2) / (sig(1.2) + sig(0.5)), 1e-6);
  EXPECT_NEAR(w[1], 2.5 * sig(0.5) / (sig(1.2) + sig(0.5)), 1e-6);
  // Both groups kept, no renormalisation: the best two overall, raw sigmoid times the scale.
  MoeRouteGrouped(logits, 2, false, {bias, 2, 2, 1.5f}, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 7);
  EXPECT_NEAR(w[0], 1.5 * sig(3.0), 1e-6);
  EXPECT_NEAR(w[1], 1.5 * sig(0.5), 1e-6);
}

}  // namespace
}  // namespace ember
