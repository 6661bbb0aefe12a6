#include "sampling/processors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "util/check.h"

namespace ember {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Strict total order "a ranks before b": larger value first, then lower id. Used for every
// ordering in this file so results never depend on the sort algorithm's tie handling.
struct RanksBefore {
  const float* value;
  bool operator()(int32_t a, int32_t b) const {
    return value[a] > value[b] || (value[a] == value[b] && a < b);
  }
};

// Widening partial sort for top-p: grows the sorted prefix of ids (all with weight > 0) until
// its mass reaches p * total or the ids run out. Returns the number of ids to keep.
size_t TopPKeep(std::vector<int32_t>& ids, const float* weight, double total, float top_p) {
  const RanksBefore before{weight};
  const double target = static_cast<double>(top_p) * total;
  size_t sorted_end = 0;
  size_t chunk = 256;
  double mass = 0.0;
  while (sorted_end < ids.size()) {
    const size_t end = std::min(ids.size(), sorted_end + chunk);
    auto first = ids.begin() + static_cast<ptrdiff_t>(sorted_end);
    auto mid = ids.begin() + static_cast<ptrdiff_t>(end);
    if (end < ids.size()) std::nth_element(first, mid, ids.end(), before);
    std::sort(first, mid, before);
    for (size_t i = sorted_end; i < end; ++i) {
      // Keep token i iff the mass strictly above it is < p (vLLM: drop where the ascending
      // cumulative sum <= 1 - p); the top token is always kept.
      if (i > 0 && mass >= target) return i;
      mass += weight[ids[i]];
    }
    sorted_end = end;
    chunk *= 4;
  }
  return ids.size();
}

}  // namespace

void ApplyLogitBias(std::span<float> logits, std::span<const std::pair<int32_t, float>> bias) {
  for (const auto& [id, value] : bias) {
    CHECK(id >= 0 && static_cast<size_t>(id) < logits.size()) << "logit_bias id " << id;
    logits[static_cast<size_t>(id)] += value;
  }
}

void ApplyPenalties(std::span<float> logits, std::span<const int32_t> seen_ids,
                    std::span<const int32_t> output_counts, float repetition, float presence,
                    float frequency) {
  CHECK_EQ(seen_ids.size(), output_counts.size());
  for (size_t i = 0; i < seen_ids.size(); ++i) {
    float& logit = logits[static_cast<size_t>(seen_ids[i])];
    if (repetition != 1.0f) logit = logit > 0.0f ? logit / repetition : logit * repetition;
    const int32_t count = output_counts[i];
    if (count > 0) logit -= frequency * static_cast<float>(count) + presence;
  }
}

void MaskTokens(std::span<float> logits, std::span<const int32_t> ids) {
  for (int32_t id : ids) logits[static_cast<size_t>(id)] = kNegInf;
}

int32_t Argmax(std::span<const float> logits) {
  CHECK(!logits.empty());
  size_t best = 0;
  while (best + 1 < logits.size() && std::isnan(logits[best])) ++best;
  for (size_t i = best + 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: ties keep the lower id; NaN never wins
  }
  return static_cast<int32_t>(best);
}

double LogSumExp(std::span<const float> logits) {
  float max = kNegInf;
  for (float x : logits) max = std::max(max, x);
  if (max == kNegInf) return -std::numeric_limits<double>::infinity();
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  return static_cast<double>(max) + std::log(sum);
}

std::vector<TokenLogprob> TopLogprobs(std::span<const float> logits, double log_sum_exp,
                                      int32_t k, std::vector<int32_t>& scratch) {
  const size_t n = std::min(logits.size(), static_cast<size_t>(std::max(k, 0)));
  std::vector<TokenLogprob> top;
  if (n == 0) return top;
  scratch.resize(logits.size());
  std::iota(scratch.begin(), scratch.end(), 0);
  const RanksBefore before{logits.data()};
  std::partial_sort(scratch.begin(), scratch.begin() + static_cast<ptrdiff_t>(n), scratch.end(),
                    before);
  top.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = scratch[i];
    top.push_back({id, static_cast<float>(logits[static_cast<size_t>(id)] - log_sum_exp)});
  }
  return top;
}

void FilterCandidates(std::span<float> logits, float temperature, int32_t top_k, float top_p,
                      float min_p, Candidates& out) {
  CHECK_GE(temperature, kGreedyTemperature);
  const size_t vocab_size = logits.size();
  float max = kNegInf;
  for (float x : logits) max = std::max(max, x);
  CHECK(std::isfinite(max)) << "no finite logit to sample from (max " << max << ")";

  // Rewrite the row as unnormalised probabilities; the top token gets exactly 1.
  const float inv_temperature = 1.0f / temperature;
  for (float& x : logits) x = std::exp((x - max) * inv_temperature);  // -inf, NaN -> 0, NaN
  const float* weight = logits.data();
  out.weight = logits;

  // Only tokens with positive weight are candidates (NaN compares false and drops out too).
  // min-p is a ratio to the top probability, which is 1 here, so it is a plain threshold. The
  // order is HF's top-k, top-p, min-p: min-p commutes with top-k (both cut a rank prefix), but
  // top-p's mass must not see min-p's cut, so min-p is applied early only when top-p is off.
  const bool use_top_p = top_p < 1.0f;
  const float min_weight = std::max(min_p, std::numeric_limits<float>::min());
  const float early_threshold = use_top_p ? std::numeric_limits<float>::min() : min_weight;
  out.ids.clear();
  for (size_t i = 0; i < vocab_size; ++i) {
    if (weight[i] >= early_threshold) out.ids.push_back(static_cast<int32_t>(i));
  }
  out.sorted = false;
  const RanksBefore before{weight};
  auto mass = [&] {
    double total = 0.0;
    for (int32_t id : out.ids) total += weight[id];
    return total;
  };

  if (top_k > 0 && static_cast<size_t>(top_k) < out.ids.size()) {
    auto kth = out.ids.begin() + top_k;
    std::nth_element(out.ids.begin(), kth, out.ids.end(), before);
    out.ids.resize(static_cast<size_t>(top_k));
    std::sort(out.ids.begin(), out.ids.end(), before);
    out.sorted = true;
  }
  if (use_top_p) {
    out.ids.resize(TopPKeep(out.ids, weight, mass(), top_p));
    out.sorted = true;
    // ids are sorted desc: min-p drops a suffix (the top token has weight 1 >= any threshold).
    auto cut = std::find_if(out.ids.begin(), out.ids.end(),
                            [&](int32_t id) { return weight[id] < min_weight; });
    out.ids.erase(cut, out.ids.end());
  }
  CHECK(!out.ids.empty());
  out.total = mass();
}

int32_t DrawCandidate(Candidates& candidates, double u) {
  std::vector<int32_t>& ids = candidates.ids;
  CHECK(!ids.empty());
  const float* weight = candidates.weight.data();
  const RanksBefore before{weight};
  double target = u * candidates.total;

  // Weighted quickselect: narrow [lo, hi) to the block that contains the target mass. Every
  // element left of lo ranks before every element in [lo, hi), so skipping a block subtracts
  // exactly the mass an ordered scan would have passed.
  size_t lo = 0, hi = ids.size();
  int32_t last_skipped = ids.front();
  if (!candidates.sorted) {
    while (hi - lo > 64) {
      // Median-of-three pivot by rank, moved to hi - 1.
      const size_t mid = lo + (hi - lo) / 2;
      int32_t a = ids[lo], b = ids[mid], c = ids[hi - 1];
      int32_t pivot = before(a, b) ? (before(b, c) ? b : (before(a, c) ? c : a))
                                   : (before(a, c) ? a : (before(b, c) ? c : b));
      const auto pivot_it = std::find(ids.begin() + static_cast<ptrdiff_t>(lo),
                                      ids.begin() + static_cast<ptrdiff_t>(hi), pivot);
      std::iter_swap(pivot_it, ids.begin() + static_cast<ptrdiff_t>(hi - 1));
      const auto split_it =
          std::partition(ids.begin() + static_cast<ptrdiff_t>(lo),
                         ids.begin() + static_cast<ptrdiff_t>(hi - 1),
                         [&](int32_t id) { return before(id, pivot); });
      const size_t split = static_cast<size_t>(split_it - ids.begin());
      std::iter_swap(split_it, ids.begin() + static_cast<ptrdiff_t>(hi - 1));  // pivot at split
      double above = 0.0;
      for (size_t i = lo; i < split; ++i) above += weight[ids[i]];
      if (target < above) {
        hi = split;
        continue;
      }
      target -= above;
      if (target < weight[pivot]) return pivot;
      target -= weight[pivot];
      last_skipped = pivot;
      lo = split + 1;
    }
    std::sort(ids.begin() + static_cast<ptrdiff_t>(lo), ids.begin() + static_cast<ptrdiff_t>(hi),
              before);
  }
  for (size_t i = lo; i < hi; ++i) {
    const double w = weight[ids[i]];
    if (target < w) return ids[i];
    target -= w;
    last_skipped = ids[i];
  }
  // Only rounding (u close to 1) gets here: the last token in rank order that was passed.
  return last_skipped;
}

}  // namespace ember
