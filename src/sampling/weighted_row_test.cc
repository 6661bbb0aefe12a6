// WeightedRow: temperature, top-k, top-p, min-p keep exactly the hand-computed sets; the bucketed
// filters and draw agree with a brute-force full sort; the fast exp is accurate.
#include "sampling/weighted_row.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "sampling/row_math.h"

namespace ember {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits whose softmax is `probs` (up to float rounding).
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::set<int32_t> Kept(std::vector<float> logits, float temperature, int32_t top_k, float top_p,
                       float min_p) {
  WeightedRow row;
  EXPECT_TRUE(row.Build(logits, temperature));
  row.ApplyTopK(top_k);
  row.ApplyTopP(top_p);
  row.ApplyMinP(min_p);
  const std::vector<int32_t> ids = row.KeptIds();
  EXPECT_EQ(static_cast<int64_t>(ids.size()), row.num_kept());
  // The id-order listing is the same set, sorted.
  std::vector<int32_t> by_id;
  row.KeptIdsByIdOrder(&by_id);
  std::vector<int32_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(by_id, sorted);
  return {ids.begin(), ids.end()};
}

// probs: id0 0.1, id1 0.4, id2 0.2, id3 0.3 -> rank order 1, 3, 2, 0.
const std::vector<double> kProbs = {0.1, 0.4, 0.2, 0.3};

TEST(WeightedRowTest, ExpIsAccurate) {
  EXPECT_EQ(ExpNonPositive(0.0f), 1.0f);
  EXPECT_EQ(ExpNonPositive(-kInf), 0.0f);
  EXPECT_EQ(ExpNonPositive(NAN), 0.0f);
  EXPECT_EQ(ExpNonPositive(-100.0f), 0.0f);
  for (float x = -86.9f; x <= 0.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(ExpNonPositive(x) / want, 1.0, 3e-7) << x;
  }
}

TEST(WeightedRowTest, WeightsAreRelativeToTheTopToken) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  WeightedRow row;
  ASSERT_TRUE(row.Build(logits, 0.5f));
  EXPECT_EQ(row.weights()[1], 1.0f);
  EXPECT_NEAR(row.weights()[2], std::exp(-2.0), 1e-7);
  EXPECT_NEAR(row.weights()[0], std::exp(-4.0), 1e-7);
  EXPECT_NEAR(row.kept_mass(), 1.0 + std::exp(-2.0) + std::exp(-4.0), 1e-6);
}

TEST(WeightedRowTest, RowWithoutFiniteMaxIsRejected) {
  std::vector<float> masked = {-kInf, -kInf};
  WeightedRow row;
  EXPECT_FALSE(row.Build(masked, 1.0f));
  EXPECT_EQ(masked[0], -kInf);
  std::vector<float> infinite = {0.0f, kInf};
  EXPECT_FALSE(row.Build(infinite, 1.0f));
}

TEST(WeightedRowTest, TopKKeepsTheKLargest) {
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 1, 1.0f, 0.0f), (std::set<int32_t>{1}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 2, 1.0f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 4, 1.0f, 0.0f), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 99, 1.0f, 0.0f), (std::set<int32_t>{0, 1, 2, 3}));
  // Ties at the k-th place go to the lower id.
  EXPECT_EQ(Kept({1.0f, 2.0f, 1.0f, 1.0f}, 1.0f, 2, 1.0f, 0.0f), (std::set<int32_t>{0, 1}));
}

TEST(WeightedRowTest, TopPKeepsSmallestPrefixReachingP) {
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.3f, 0.0f), (std::set<int32_t>{1}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.05f, 0.0f), (std::set<int32_t>{1}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.65f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.8f, 0.0f), (std::set<int32_t>{1, 2, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.95f, 0.0f), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(WeightedRowTest, TopPRenormalisesAfterTopK) {
  // top-3 mass 0.9 -> 0.444, 0.333, 0.222; the mass above id 2 is 0.777 >= 0.7: dropped.
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 3, 0.7f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 3, 0.8f, 0.0f), (std::set<int32_t>{1, 2, 3}));
}

TEST(WeightedRowTest, TemperatureAppliesBeforeTopP) {
  // T = 0.5 squares the probs: 0.01, 0.16, 0.04, 0.09 -> 0.533 (id1), 0.3 (id3), ...; the mass
  // above id 2 is 0.833 >= 0.8, so id 2 goes, while at T = 1 it stays (mass above it 0.7).
  EXPECT_EQ(Kept(LogitsOf(kProbs), 0.5f, 0, 0.8f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.8f, 0.0f), (std::set<int32_t>{1, 2, 3}));
}

TEST(WeightedRowTest, MinPDropsTokensBelowFractionOfMax) {
  // max prob 0.4: min_p 0.45 -> threshold 0.18 keeps 0.4, 0.3, 0.2; 0.6 -> 0.24 keeps 0.4, 0.3.
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 1.0f, 0.45f), (std::set<int32_t>{1, 2, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 1.0f, 0.6f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 1.0f, 1.0f), (std::set<int32_t>{1}));
  // Temperature 0.5: probs ~ p^2, max 0.16; min_p 0.3 -> 0.048 keeps 0.16, 0.09 only.
  EXPECT_EQ(Kept(LogitsOf(kProbs), 0.5f, 0, 1.0f, 0.3f), (std::set<int32_t>{1, 3}));
  // Ties with the maximum survive min_p = 1.
  EXPECT_EQ(Kept({2.0f, 0.0f, 2.0f}, 1.0f, 0, 1.0f, 1.0f), (std::set<int32_t>{0, 2}));
}

TEST(WeightedRowTest, MinPAppliesAfterTopP) {
  // top_p 0.75 keeps {1, 3, 2}; then min_p 0.6 (threshold 0.24) drops id 2.
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.75f, 0.6f), (std::set<int32_t>{1, 3}));
  // Where the order matters: top_p 0.72 on the full row keeps {1, 3, 2} (mass above id 2 is
  // 0.7) and min_p 0.45 (threshold 0.18) keeps all three. Min-p first would renormalise
  // {1, 3, 2} to 0.444, 0.333, 0.222, and top_p 0.72 would then drop id 2 (0.777 above it).
  EXPECT_EQ(Kept(LogitsOf(kProbs), 1.0f, 0, 0.72f, 0.45f), (std::set<int32_t>{1, 2, 3}));
}

TEST(WeightedRowTest, MaskedTokensAreNeverCandidates) {
  std::vector<float> logits = {-kInf, 0.0f, -kInf, 0.0f, NAN};
  EXPECT_EQ(Kept(logits, 1.0f, 0, 1.0f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(logits, 2.0f, 0, 0.99f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(Kept(logits, 2.0f, 10, 1.0f, 0.0f), (std::set<int32_t>{1, 3}));
}

// Brute force: full sort by (w desc, id asc), then top-k, top-p, min-p on the sorted list.
std::vector<int32_t> ReferenceKept(std::span<const float> w, int32_t top_k, float top_p,
                                   float min_p) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] >= std::numeric_limits<float>::min()) ids.push_back(static_cast<int32_t>(i));
  }
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
  if (top_k > 0 && static_cast<size_t>(top_k) < ids.size()) ids.resize(top_k);
  if (top_p < 1.0f) {
    double total = 0.0;
    for (int32_t id : ids) total += w[id];
    double above = 0.0;
    size_t keep = 0;
    while (keep < ids.size() && (keep == 0 || above < top_p * total)) above += w[ids[keep++]];
    ids.resize(keep);
  }
  if (min_p > 0.0f) {
    while (ids.size() > 1 && w[ids.back()] < min_p) ids.pop_back();
  }
  return ids;
}

int32_t ReferenceDraw(const std::vector<int32_t>& ranked, std::span<const float> w, double u) {
  double total = 0.0;
  for (int32_t id : ranked) total += w[id];
  double target = u * total;
  for (int32_t id : ranked) {
    if (target < w[id]) return id;
    target -= w[id];
  }
  return ranked.back();
}

TEST(WeightedRowTest, MatchesBruteForceOnRandomRows) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int mismatches = 0;
  size_t most_nodes = 0;
  for (int trial = 0; trial < 45; ++trial) {
    const float scale = trial % 3 == 0 ? 0.05f : (trial % 3 == 1 ? 2.0f : 8.0f);  // flat..peaked
    std::normal_distribution<float> dist(0.0f, scale);
    // Sizes that keep every band small, and ones whose bands are split and bucketed.
    const size_t sizes[] = {777, 5000, 40000};
    std::vector<float> logits(sizes[trial % 3 == 0 ? (trial / 3) % 3 : trial % 3]);
    for (float& x : logits) x = dist(gen);
    for (size_t i = 0; i < logits.size(); i += 7) logits[i] = logits[3];  // ties
    const float temperature = trial % 4 == 0 ? 0.3f : 1.0f;
    const int32_t top_k = trial % 5 == 0   ? 0
                          : trial % 5 == 1 ? static_cast<int32_t>(gen() % 300)
                                           : static_cast<int32_t>(gen() % 3000);
    const float top_p = trial % 3 == 0 ? 1.0f : static_cast<float>(uniform(gen));
    const float min_p = trial % 4 == 1 ? static_cast<float>(uniform(gen) * 0.5) : 0.0f;
    WeightedRow row;
    ASSERT_TRUE(row.Build(logits, temperature));
    row.ApplyTopK(top_k);
    row.ApplyTopP(top_p);
    row.ApplyMinP(min_p);
    const auto want = ReferenceKept(row.weights(), top_k, top_p, min_p);
    std::vector<int32_t> by_id, want_by_id = want;
    row.KeptIdsByIdOrder(&by_id);
    std::sort(want_by_id.begin(), want_by_id.end());
    ASSERT_EQ(by_id, want_by_id);
    ASSERT_EQ(row.KeptIds(), want)
        << "trial " << trial << " k " << top_k << " p " << top_p << " min_p " << min_p;
    for (int draw = 0; draw < 100; ++draw) {
      const double u = draw == 0 ? 0.0 : (draw == 1 ? 1.0 - 0x1.0p-53 : uniform(gen));
      // Group masses are summed in another order than the reference's rank order: a boundary
      // may differ by rounding (~1e-16), so allow a handful of mismatches in 4,500 draws.
      mismatches += row.Draw(u) != ReferenceDraw(want, row.weights(), u);
    }
    most_nodes = std::max(most_nodes, row.num_tree_nodes());
  }
  EXPECT_LE(mismatches, 2);
  EXPECT_GT(most_nodes, 40u) << "the large rows must exercise band splits and bucketing";
}

TEST(WeightedRowTest, LargeFlatBandsMatchBruteForce) {
  // 20k tokens in one narrow weight range: the band is split, its children bucketed, and only
  // the visited leaves sorted. Once in the top band, once deep in the tail band (w ~ 1e-9).
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> jitter(-0.5f, 0.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const float offset : {0.0f, -20.0f}) {
    std::vector<float> logits(20001);
    for (float& x : logits) x = offset + jitter(gen);
    logits[123] = 0.5f;  // the top token
    for (const float top_p : {1.0f, 0.9f, 0.2f}) {
      std::vector<float> row_logits = logits;
      WeightedRow row;
      ASSERT_TRUE(row.Build(row_logits, 1.0f));
      row.ApplyTopP(top_p);
      const auto want = ReferenceKept(row.weights(), 0, top_p, 0.0f);
      ASSERT_EQ(row.KeptIds(), want) << "offset " << offset << " top_p " << top_p;
      int mismatches = 0;
      for (int draw = 0; draw < 100; ++draw) {
        const double u = uniform(gen);
        mismatches += row.Draw(u) != ReferenceDraw(want, row.weights(), u);
      }
      EXPECT_LE(mismatches, 1);
      EXPECT_GT(row.num_tree_nodes(), 10u);
    }
  }
}

TEST(WeightedRowTest, DrawWalksTheRankOrder) {
  std::vector<float> logits = LogitsOf(kProbs);
  WeightedRow row;
  ASSERT_TRUE(row.Build(logits, 1.0f));
  EXPECT_EQ(row.Draw(0.0), 1);
  // u just below 0.4 is still id 1; just above goes to id 3 (next in rank order).
  EXPECT_EQ(row.Draw(0.399), 1);
  EXPECT_EQ(row.Draw(0.401), 3);
  EXPECT_EQ(row.Draw(0.69), 3);
  EXPECT_EQ(row.Draw(0.71), 2);
  EXPECT_EQ(row.Draw(0.95), 0);
  EXPECT_EQ(row.Draw(1.0 - 1e-12), 0);
}

}  // namespace
}  // namespace ember
