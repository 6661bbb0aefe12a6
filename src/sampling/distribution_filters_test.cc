// top-n-sigma, typical_p, XTC and the list draw against hand-computed examples.
#include "sampling/distribution_filters.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace ember {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<int32_t> Ids(const std::vector<KeptToken>& kept) {
  std::vector<int32_t> ids;
  for (const KeptToken& t : kept) ids.push_back(t.id);
  return ids;
}

TEST(TopNSigmaTest, KeepsLogitsWithinNSigmaOfTheMax) {
  // Finite logits 0..4: mean 2, population variance 2, sigma 1.4142 (the -inf is not counted).
  const std::vector<float> row = {0, 1, 2, 3, 4, -kInf};
  std::vector<float> one = row;
  ApplyTopNSigma(one, 1.0f);  // floor 4 - 1.414 = 2.586
  EXPECT_EQ(one, (std::vector<float>{-kInf, -kInf, -kInf, 3, 4, -kInf}));
  std::vector<float> two = row;
  ApplyTopNSigma(two, 2.0f);  // floor 4 - 2.828 = 1.172
  EXPECT_EQ(two, (std::vector<float>{-kInf, -kInf, 2, 3, 4, -kInf}));
  std::vector<float> off = row;
  ApplyTopNSigma(off, -1.0f);
  EXPECT_EQ(off, row);
  // All equal: sigma 0, everything is the max and stays.
  std::vector<float> flat = {1, 1, 1};
  ApplyTopNSigma(flat, 0.5f);
  EXPECT_EQ(flat, (std::vector<float>{1, 1, 1}));
}

// p = 1/2, 1/4, 1/8, 1/8: H = 1.75 ln 2; |-ln p - H| = 0.520, 0.173, 0.866, 0.866, so the
// typical order is id 1, id 0, id 2, id 3 (cumulative 0.25, 0.75, 0.875, 1).
std::vector<KeptToken> Halving() { return {{0, 4.0f}, {1, 2.0f}, {2, 1.0f}, {3, 1.0f}}; }

TEST(TypicalPTest, TakesTokensByTypicalityUntilTheMassIsExceeded) {
  std::vector<KeptToken> kept = Halving();
  ApplyTypicalP(kept, 0.5f);
  EXPECT_EQ(Ids(kept), (std::vector<int32_t>{0, 1}));
  kept = Halving();
  ApplyTypicalP(kept, 0.2f);  // the most likely token is not the most typical: it goes
  EXPECT_EQ(Ids(kept), (std::vector<int32_t>{1}));
  kept = Halving();
  ApplyTypicalP(kept, 0.8f);  // 0.75 does not exceed 0.8; id 2 (first of the tie) does
  EXPECT_EQ(Ids(kept), (std::vector<int32_t>{0, 1, 2}));
  kept = Halving();
  ApplyTypicalP(kept, 1.0f);
  EXPECT_EQ(Ids(kept), (std::vector<int32_t>{0, 1, 2, 3}));
}

// p = 0.4, 0.3, 0.2, 0.1.
std::vector<KeptToken> Four() { return {{0, 4.0f}, {1, 3.0f}, {2, 2.0f}, {3, 1.0f}}; }

TEST(XtcTest, RemovesAllButTheLeastLikelyTokenAboveTheThreshold) {
  std::vector<KeptToken> kept = Four();
  EXPECT_TRUE(ApplyXtc(kept, 0.25f));  // 0.4 and 0.3 are above: 0.4 goes
  EXPECT_EQ(Ids(kept), (std::vector<int32_t>{1, 2, 3}));
  kept = Four();
  EXPECT_FALSE(ApplyXtc(kept, 0.35f));  // only one token above: nothing
  EXPECT_EQ(Ids(kept), (std::vector<int32_t>{0, 1, 2, 3}));
  kept = Four();
  EXPECT_TRUE(ApplyXtc(kept, 0.05f));  // all four above: the least likely stays alone
  EXPECT_EQ(Ids(kept), (std::vector<int32_t>{3}));
}

// The sampler's lists are in id order, not rank order: the same sets, in the list's order.
TEST(DistributionFiltersTest, ListsInIdOrderKeepTheirOrder) {
  // p = 0.2, 0.4, 0.3, 0.1: 0.4 and 0.3 are above 0.25; 0.3 (id 2) is the least likely of them.
  std::vector<KeptToken> kept = {{0, 2.0f}, {1, 4.0f}, {2, 3.0f}, {3, 1.0f}};
  EXPECT_TRUE(ApplyXtc(kept, 0.25f));
  EXPECT_EQ(Ids(kept), (std::vector<int32_t>{0, 2, 3}));
  // p = 1/8, 1/2, 1/8, 1/4: typical order id 3, id 1, then the tie id 0, id 2 (rank: id asc).
  const std::vector<KeptToken> halving = {{0, 1.0f}, {1, 4.0f}, {2, 1.0f}, {3, 2.0f}};
  kept = halving;
  ApplyTypicalP(kept, 0.5f);
  EXPECT_EQ(Ids(kept), (std::vector<int32_t>{1, 3}));
  kept = halving;
  ApplyTypicalP(kept, 0.8f);
  EXPECT_EQ(Ids(kept), (std::vector<int32_t>{0, 1, 3}));
}

// The bucketed selection equals a full sort by (|-ln p - H|, rank) on random lists.
TEST(TypicalPTest, MatchesAFullSortOnRandomLists) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 2 + rng() % 3000;
    std::vector<KeptToken> kept;
    std::normal_distribution<float> logit(0.0f, 1.0f + static_cast<float>(trial % 5));
    for (size_t i = 0; i < n; ++i)
      kept.push_back({static_cast<int32_t>(i), std::exp(std::min(0.0f, logit(rng) - 8.0f))});
    if (trial % 7 == 0) kept[1].weight = kept[0].weight;  // a tie
    const float typical_p = 0.05f + 0.9f * static_cast<float>(rng() % 1000) / 1000.0f;
    double total = 0.0, entropy = 0.0;
    for (const KeptToken& t : kept) total += t.weight;
    for (const KeptToken& t : kept) entropy -= t.weight / total * std::log(t.weight / total);
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    const auto score = [&](size_t i) {
      return std::fabs(-std::log(kept[i].weight / total) - entropy);
    };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (score(a) != score(b)) return score(a) < score(b);
      return kept[a].weight != kept[b].weight ? kept[a].weight > kept[b].weight
                                              : kept[a].id < kept[b].id;
    });
    std::vector<int32_t> want;
    double cumulative = 0.0;
    for (size_t i : order) {
      want.push_back(kept[i].id);
      cumulative += kept[i].weight / total;
      if (cumulative > typical_p) break;
    }
    std::sort(want.begin(), want.end());
    ApplyTypicalP(kept, typical_p);
    EXPECT_EQ(Ids(kept), want) << "trial " << trial;
  }
}

TEST(DrawKeptTest, InverseCdfInListOrder) {
  const std::vector<KeptToken> kept = {{5, 2.0f}, {1, 1.0f}, {9, 1.0f}};
  EXPECT_EQ(DrawKept(kept, 0.0), 5);
  EXPECT_EQ(DrawKept(kept, 0.49), 5);
  EXPECT_EQ(DrawKept(kept, 0.5), 1);
  EXPECT_EQ(DrawKept(kept, 0.8), 9);
  EXPECT_EQ(DrawKept(kept, 0.999999), 9);
}

}  // namespace
}  // namespace ember
