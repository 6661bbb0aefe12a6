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
  thread_local std::vector<double> score;  // [kept.size()]: |-ln p - H|
  score.resize(kept.size());
  double entropy = 0.0;
  for (size_t i = 0; i < kept.size(); ++i) {
    const double p = kept[i].weight / total;
    score[i] = std::log(p);
    entropy -= p * score[i];
  }
  double max_score = 0.0;
  for (double& x : score) {
    x = std::fabs(-x - entropy);
    max_score = std::max(max_score, x);
  }
  // Taking tokens by ascending score is a sort; only the bucket where the mass crosses typical_p
  // needs one: buckets of the score range are in score order, and the mass before them is known.
  constexpr size_t kBuckets = 4096;
  const double scale = max_score > 0.0 ? kBuckets / max_score : 0.0;
  const auto bucket_of = [&](size_t i) {
    return std::min(kBuckets - 1, static_cast<size_t>(score[i] * scale));
  };
  std::vector<double> bucket_mass(kBuckets, 0.0);
  for (size_t i = 0; i < kept.size(); ++i) bucket_mass[bucket_of(i)] += kept[i].weight / total;
  double cumulative = 0.0;
  size_t crossing = kBuckets;  // the bucket where the mass first exceeds typical_p
  for (size_t b = 0; b < kBuckets; ++b) {
    if (cumulative + bucket_mass[b] > typical_p) {
      crossing = b;
      break;
    }
    cumulative += bucket_mass[b];
  }
  if (crossing == kBuckets) return;  // rounding: the whole mass never exceeds it; all stay
  std::vector<uint32_t> in_crossing;
  for (size_t i = 0; i < kept.size(); ++i)
    if (bucket_of(i) == crossing) in_crossing.push_back(static_cast<uint32_t>(i));
  std::sort(in_crossing.begin(), in_crossing.end(), [&](uint32_t a, uint32_t b) {
    return score[a] != score[b] ? score[a] < score[b] : RankBefore(kept[a], kept[b]);
  });
  std::vector<uint8_t> keep(kept.size(), 0);
  for (uint32_t i : in_crossing) {  // the token that crosses typical_p is kept
    keep[i] = 1;
    cumulative += kept[i].weight / total;
    if (cumulative > typical_p) break;
  }
  size_t out = 0;
  for (size_t i = 0; i < kept.size(); ++i)
    if (keep[i] || bucket_of(i) < crossing) kept[out++] = kept[i];
  kept.resize(out);
}

bool ApplyXtc(std::vector<KeptToken>& kept, float threshold) {
  const double total = TotalWeight(kept);
  const auto above = [&](const KeptToken& t) { return t.weight / total >= threshold; };
  size_t num_above = 0;
  const KeptToken* last = nullptr;  // the least likely of those above, in rank order
  for (const KeptToken& t : kept) {
    if (!above(t)) continue;
    ++num_above;
    if (last == nullptr || RankBefore(*last, t)) last = &t;
  }
  if (num_above < 2) return false;
  const int32_t survivor = last->id;
  size_t out = 0;
  for (size_t i = 0; i < kept.size(); ++i)
    if (!above(kept[i]) || kept[i].id == survivor) kept[out++] = kept[i];
  kept.resize(out);
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
