#include "sampling/distribution_filters.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/check.h"

namespace ember {
namespace {

double TotalWeight(std::span<const KeptToken> kept) {
  double total = 0.0;
  for (const KeptToken& t : kept) total += t.weight;
  return total;
}

bool RankBefore(const KeptToken& a, const KeptToken& b) {
  return a.weight != b.weight ? a.weight > b.weight : a.id < b.id;
}

}  // namespace

void ApplyTopNSigma(std::span<float> logits, float n) {
  if (!(n > 0.0f)) return;
  double sum = 0.0;
  int64_t count = 0;
  float max = -std::numeric_limits<float>::infinity();
  for (float x : logits) {
    if (!std::isfinite(x)) continue;
    sum += x;
    ++count;
    max = std::max(max, x);
  }
  if (count < 2) return;
  const double mean = sum / static_cast<double>(count);
  double squares = 0.0;
  for (float x : logits)
    if (std::isfinite(x)) squares += (x - mean) * (x - mean);
  const double sigma = std::sqrt(squares / static_cast<double>(count));
  const double floor = static_cast<double>(max) - static_cast<double>(n) * sigma;
  for (float& x : logits)
    if (static_cast<double>(x) < floor) x = -std::numeric_limits<float>::infinity();
}

void ApplyTypicalP(std::vector<KeptToken>& kept, float typical_p) {
  if (!(typical_p < 1.0f) || kept.size() < 2) return;
  const double total = TotalWeight(kept);
  double entropy = 0.0;
  for (const KeptToken& t : kept) {
    const double p = t.weight / total;
    entropy -= p * std::log(p);
  }
  struct Scored {
    double score;
    size_t rank;  // index in `kept` (rank order): the tie-break
  };
  std::vector<Scored> order(kept.size());
  for (size_t i = 0; i < kept.size(); ++i)
    order[i] = {std::fabs(-std::log(kept[i].weight / total) - entropy), i};
  std::sort(order.begin(), order.end(), [](const Scored& a, const Scored& b) {
    return a.score != b.score ? a.score < b.score : a.rank < b.rank;
  });
  size_t num_keep = order.size();
  double cumulative = 0.0;
  for (size_t i = 0; i < order.size(); ++i) {
    cumulative += kept[order[i].rank].weight / total;
    if (cumulative > typical_p) {
      num_keep = i + 1;
      break;
    }
  }
  std::vector<KeptToken> typical;
  typical.reserve(num_keep);
  for (size_t i = 0; i < num_keep; ++i) typical.push_back(kept[order[i].rank]);
  std::sort(typical.begin(), typical.end(), RankBefore);
  kept = std::move(typical);
}

bool ApplyXtc(std::vector<KeptToken>& kept, float threshold) {
  const double total = TotalWeight(kept);
  size_t num_above = 0;  // a prefix: the list is in rank order
  while (num_above < kept.size() && kept[num_above].weight / total >= threshold) ++num_above;
  if (num_above < 2) return false;
  kept.erase(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(num_above - 1));
  return true;
}

int32_t DrawKept(std::span<const KeptToken> kept, double u) {
  CHECK(!kept.empty());
  double target = u * TotalWeight(kept);
  for (const KeptToken& t : kept) {
    if (target < t.weight) return t.id;
    target -= t.weight;
  }
  return kept.back().id;
}

}  // namespace ember
