#include "sampling/weighted_row.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "sampling/row_math.h"
#include "util/check.h"

namespace ember {

int WeightedRow::Bucket(float w) { return static_cast<int>(std::bit_cast<uint32_t>(w) >> 19); }

bool WeightedRow::Build(std::span<float> logits, float temperature) {
  CHECK(temperature > 0.0f);
  const float max = RowMax(logits);  // NaN never wins
  if (!std::isfinite(max)) return false;

  const float inv_temperature = 1.0f / temperature;
  float* w = logits.data();
  const size_t size = logits.size();
  for (size_t i = 0; i < size; ++i) w[i] = ExpNonPositive((w[i] - max) * inv_temperature);
  weights_ = logits;

  count_.fill(0);
  mass_.fill(0.0);
  for (size_t i = 0; i < size; ++i) {
    const int b = Bucket(w[i]);
    ++count_[static_cast<size_t>(b)];
    mass_[static_cast<size_t>(b)] += w[i];
  }
  count_[0] = 0;  // zero / denormal weights are never candidates
  mass_[0] = 0.0;
  top_bucket_ = Bucket(1.0f);
  CHECK_GT(count_[static_cast<size_t>(top_bucket_)], 0);
  end_bucket_ = 1;
  while (count_[static_cast<size_t>(end_bucket_)] == 0) ++end_bucket_;
  end_count_ = count_[static_cast<size_t>(end_bucket_)];
  members_cache_.clear();
  return true;
}

const std::vector<int32_t>& WeightedRow::SortedMembers(int bucket) {
  for (const auto& [b, ids] : members_cache_) {
    if (b == bucket) return ids;
  }
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(count_[static_cast<size_t>(bucket)]));
  const float* w = weights_.data();
  for (size_t i = 0; i < weights_.size(); ++i) {
    if (Bucket(w[i]) == bucket) ids.push_back(static_cast<int32_t>(i));
  }
  std::sort(ids.begin(), ids.end(),
            [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
  members_cache_.emplace_back(bucket, std::move(ids));
  return members_cache_.back().second;
}

int64_t WeightedRow::KeptCount(int bucket) const {
  if (bucket < end_bucket_) return 0;
  return bucket == end_bucket_ ? end_count_ : count_[static_cast<size_t>(bucket)];
}

double WeightedRow::KeptMassOf(int bucket) {
  const int64_t kept = KeptCount(bucket);
  if (kept == count_[static_cast<size_t>(bucket)]) return mass_[static_cast<size_t>(bucket)];
  const std::vector<int32_t>& ids = SortedMembers(bucket);
  double mass = 0.0;
  for (int64_t i = 0; i < kept; ++i) mass += weights_[static_cast<size_t>(ids[i])];
  return mass;
}

void WeightedRow::CutTo(int bucket, int64_t count) {
  if (bucket > end_bucket_ || (bucket == end_bucket_ && count < end_count_)) {
    CHECK_GT(count, 0);
    end_bucket_ = bucket;
    end_count_ = count;
  }
}

double WeightedRow::kept_mass() {
  double mass = 0.0;
  for (int b = top_bucket_; b >= end_bucket_; --b) mass += KeptMassOf(b);
  return mass;
}

int64_t WeightedRow::num_kept() const {
  int64_t kept = end_count_;
  for (int b = top_bucket_; b > end_bucket_; --b) kept += count_[static_cast<size_t>(b)];
  return kept;
}

void WeightedRow::ApplyTopK(int32_t k) {
  if (k <= 0) return;
  int64_t above = 0;
  for (int b = top_bucket_; b >= end_bucket_; --b) {
    const int64_t kept = KeptCount(b);
    if (above + kept >= k) {
      CutTo(b, k - above);
      return;
    }
    above += kept;
  }
}

void WeightedRow::ApplyTopP(float top_p) {
  if (top_p >= 1.0f) return;
  // Keep token i iff the kept mass strictly above it is < p * total (vLLM drops a token when
  // the ascending cumulative sum up to it is <= 1 - p); so the first token is always kept.
  const double target = static_cast<double>(top_p) * kept_mass();
  double above = 0.0;
  for (int b = top_bucket_; b >= end_bucket_; --b) {
    const double bucket_mass = KeptMassOf(b);
    if (above + bucket_mass < target) {
      above += bucket_mass;
      continue;
    }
    // The cut falls inside bucket b: walk its members in rank order.
    const std::vector<int32_t>& ids = SortedMembers(b);
    const int64_t kept = KeptCount(b);
    int64_t keep = 0;
    while (keep < kept && above < target) above += weights_[static_cast<size_t>(ids[keep++])];
    CutTo(b, std::max<int64_t>(keep, 1));
    return;
  }
}

void WeightedRow::ApplyMinP(float min_p) {
  if (min_p <= 0.0f) return;
  const int b = Bucket(min_p);
  if (b > end_bucket_) {
    // Tokens of bucket b below the threshold are a suffix of its rank order.
    const std::vector<int32_t>& ids = SortedMembers(b);
    const int64_t kept = KeptCount(b);
    int64_t keep = 0;
    while (keep < kept && weights_[static_cast<size_t>(ids[keep])] >= min_p) ++keep;
    if (keep > 0) {
      CutTo(b, keep);
    } else {
      // Nothing of bucket b passes: end at the next non-empty bucket above it (the top bucket
      // holds the weight-1 token, which always passes).
      int above = b + 1;
      while (count_[static_cast<size_t>(above)] == 0) ++above;
      CutTo(above, count_[static_cast<size_t>(above)]);
    }
  } else if (b == end_bucket_) {
    const std::vector<int32_t>& ids = SortedMembers(b);
    int64_t keep = 0;
    while (keep < end_count_ && weights_[static_cast<size_t>(ids[keep])] >= min_p) ++keep;
    if (keep > 0) {
      CutTo(b, keep);
    } else {
      int above = b + 1;
      while (count_[static_cast<size_t>(above)] == 0) ++above;
      CutTo(above, count_[static_cast<size_t>(above)]);
    }
  }
}

int32_t WeightedRow::Draw(double u) {
  double target = u * kept_mass();
  int32_t last = -1;
  for (int b = top_bucket_; b >= end_bucket_; --b) {
    const int64_t kept = KeptCount(b);
    if (kept == 0) continue;
    const double bucket_mass = KeptMassOf(b);
    if (target >= bucket_mass && b > end_bucket_) {
      target -= bucket_mass;
      continue;
    }
    const std::vector<int32_t>& ids = SortedMembers(b);
    for (int64_t i = 0; i < kept; ++i) {
      const double w = weights_[static_cast<size_t>(ids[i])];
      if (target < w) return ids[i];
      target -= w;
      last = ids[i];
    }
    // Only rounding gets here (bucket mass summed in id order vs rank order): keep walking.
  }
  CHECK_GE(last, 0);
  return last;  // u ~ 1 with rounding: the last kept token
}

std::vector<int32_t> WeightedRow::KeptIds() {
  std::vector<int32_t> kept;
  for (int b = top_bucket_; b >= end_bucket_; --b) {
    const int64_t n = KeptCount(b);
    if (n == 0) continue;
    const std::vector<int32_t>& ids = SortedMembers(b);
    kept.insert(kept.end(), ids.begin(), ids.begin() + n);
  }
  return kept;
}

}  // namespace ember
