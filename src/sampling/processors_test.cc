// Each logits processor and filter against a hand-computed example, and the weighted
// quickselect draw against a plain sorted scan.
#include "sampling/processors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>

namespace ember {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits whose softmax is exactly `probs` (up to float rounding).
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::set<int32_t> Kept(std::vector<float> logits, float temperature, int32_t top_k, float top_p,
                       float min_p) {
  Candidates candidates;
  FilterCandidates(logits, temperature, top_k, top_p, min_p, candidates);
  return {candidates.ids.begin(), candidates.ids.end()};
}

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
  EXPECT_FLOAT_EQ(logits[0], 1.0f);    // 2 / 2, no output count
  EXPECT_FLOAT_EQ(logits[1], -5.0f);   // -2 * 2 - (0.25 * 2 + 0.5)
  EXPECT_FLOAT_EQ(logits[2], 1.0f);    // unseen
  EXPECT_FLOAT_EQ(logits[3], -0.5f);   // 0.5 / 2 - (0.25 * 1 + 0.5)
  EXPECT_FLOAT_EQ(logits[4], 3.0f);    // unseen
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
  EXPECT_NEAR(lse, reference_lse, 1e-9);

  std::vector<int32_t> scratch;
  const auto top = TopLogprobs(logits, lse, 20, scratch);
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
  EXPECT_TRUE(TopLogprobs(logits, lse, 0, scratch).empty());
}

// probs: id0 0.1, id1 0.4, id2 0.2, id3 0.3 -> rank order 1, 3, 2, 0.
const std::vector<double> kProbs = {0.1, 0.4, 0.2, 0.3};

TEST(ProcessorsTest, TopKKeepsTheKLargest) {
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 1, 1.0f, 0.0f), (std::set<int32_t>{1}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 2, 1.0f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 4, 1.0f, 0.0f), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 99, 1.0f, 0.0f), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(ProcessorsTest, TopPKeepsSmallestPrefixReachingP) {
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.3f, 0.0f), (std::set<int32_t>{1}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.05f, 0.0f), (std::set<int32_t>{1}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.65f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.8f, 0.0f), (std::set<int32_t>{1, 2, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.95f, 0.0f), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(ProcessorsTest, TopPRenormalisesAfterTopK) {
  // top-3 mass 0.9 -> 0.444, 0.333, 0.222; the mass above id 2 is 0.777 >= 0.7: dropped.
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 3, 0.7f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 3, 0.8f, 0.0f), (std::set<int32_t>{1, 2, 3}));
}

TEST(ProcessorsTest, TemperatureAppliesBeforeTopP) {
  // T = 0.5 squares the probs: 0.01, 0.16, 0.04, 0.09 -> 0.533 (id1), 0.3 (id3), ...; the mass
  // above id 2 is 0.833 >= 0.8, so id 2 goes, while at T = 1 it stays (mass above it 0.7).
  EXPECT_EQ(Kept(LogitsOf(kProbs), 0.5f, 0, 0.8f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.8f, 0.0f), (std::set<int32_t>{1, 2, 3}));
}

TEST(ProcessorsTest, MinPDropsTokensBelowFractionOfMax) {
  // max prob 0.4: min_p 0.45 -> threshold 0.18 keeps 0.4, 0.3, 0.2; 0.6 -> 0.24 keeps 0.4, 0.3.
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 1.0f, 0.45f), (std::set<int32_t>{1, 2, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 1.0f, 0.6f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 1.0f, 1.0f), (std::set<int32_t>{1}));
  // Temperature 0.5: probs ~ p^2, max 0.16; min_p 0.3 -> 0.048 keeps 0.16, 0.09 only.
  EXPECT_EQ(Kept(LogitsOf(kProbs), 0.5f, 0, 1.0f, 0.3f), (std::set<int32_t>{1, 3}));
}

TEST(ProcessorsTest, MinPAppliesAfterTopP) {
  // top_p 0.75 keeps {1, 3, 2}; then min_p 0.6 (threshold 0.24) drops id 2.
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.75f, 0.6f), (std::set<int32_t>{1, 3}));
  // Where the order matters: top_p 0.72 on the full row keeps {1, 3, 2} (mass above id 2 is
  // 0.7) and min_p 0.45 (threshold 0.18) keeps all three. Min-p first would renormalise
  // {1, 3, 2} to 0.444, 0.333, 0.222, and top_p 0.72 would then drop id 2 (0.777 above it).
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.72f, 0.45f), (std::set<int32_t>{1, 2, 3}));
}

TEST(ProcessorsTest, MaskedTokensAreNeverCandidates) {
  std::vector<float> logits = {-kInf, 0.0f, -kInf, 0.0f};
  EXPECT_EQ(Kept(logits, 1.0f, 0, 1.0f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(logits, 2.0f, 0, 0.99f, 0.0f), (std::set<int32_t>{1, 3}));
}

// Reference inverse CDF: sort by (weight desc, id asc), scan in double.
int32_t ReferenceDraw(const std::vector<int32_t>& ids, std::span<const float> weight, double u) {
  std::vector<int32_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) {
    return weight[a] > weight[b] || (weight[a] == weight[b] && a < b);
  });
  double total = 0.0;
  for (int32_t id : sorted) total += weight[id];
  double target = u * total;
  for (int32_t id : sorted) {
    if (target < weight[id]) return id;
    target -= weight[id];
  }
  return sorted.back();
}

TEST(ProcessorsTest, DrawMatchesSortedInverseCdf) {
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(5000);
    for (float& x : logits) x = dist(gen);
    // Repeated values exercise the id tie-break.
    for (size_t i = 0; i < logits.size(); i += 7) logits[i] = 1.0f;
    const bool sorted_path = trial % 2 == 1;
    Candidates candidates;
    FilterCandidates(logits, 1.0f, sorted_path ? 3000 : 0, 1.0f, 0.0f, candidates);
    ASSERT_EQ(candidates.sorted, sorted_path);
    const std::vector<int32_t> kept = candidates.ids;
    for (int draw = 0; draw < 50; ++draw) {
      const double u = draw == 0 ? 0.0 : (draw == 1 ? 1.0 - 0x1.0p-53 : uniform(gen));
      candidates.ids = kept;
      EXPECT_EQ(DrawCandidate(candidates, u), ReferenceDraw(kept, candidates.weight, u))
          << "trial " << trial << " u " << u;
    }
  }
}

TEST(ProcessorsTest, DrawOfZeroIsTheTopToken) {
  std::vector<float> logits = LogitsOf(kProbs);
  Candidates candidates;
  FilterCandidates(logits, 1.0f, 0, 1.0f, 0.0f, candidates);
  EXPECT_EQ(DrawCandidate(candidates, 0.0), 1);
  // u just below 0.4 is still id 1; just above goes to id 3 (next in rank order).
  EXPECT_EQ(DrawCandidate(candidates, 0.399), 1);
  EXPECT_EQ(DrawCandidate(candidates, 0.401), 3);
  EXPECT_EQ(DrawCandidate(candidates, 0.95), 0);
}

}  // namespace
}  // namespace ember
