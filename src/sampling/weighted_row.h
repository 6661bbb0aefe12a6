// WeightedRow: one processed row of logits turned into unnormalised probabilities
// w = exp((logit - max) / temperature) (top token exactly 1), bucketed by float exponent so that
// top-k, top-p, min-p and the inverse-CDF draw never sort the whole vocabulary.
//
// Rank order is (w desc, id asc). Every filter keeps a PREFIX of that order, so the kept set is
// "all tokens in buckets above end_bucket, plus the first end_count members of end_bucket".
// Buckets are ordered by weight (a bucket is an exponent plus 4 mantissa bits), so only the
// boundary bucket of each filter, and the bucket the draw lands in, are ever sorted. Weights
// below 2^-126 count as zero. Not thread-safe: one WeightedRow per thread, reused across rows.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace ember {

class WeightedRow {
 public:
  // Rewrites `logits` in place into weights (the span must outlive the filters and Draw).
  // Requires temperature > 0. Returns false, leaving `logits` untouched, when the row has no
  // finite maximum (all -inf, or a +inf / NaN-only row): the caller falls back to argmax.
  // NaN logits get weight 0.
  bool Build(std::span<float> logits, float temperature);

  // Filters, applied in the order called (the sampler calls top-k, top-p, min-p, as HF does).
  void ApplyTopK(int32_t k);     // k <= 0: off
  void ApplyTopP(float top_p);   // keep the smallest prefix whose mass reaches top_p of the kept
                                 // mass (>= 1: off); the top token is always kept
  void ApplyMinP(float min_p);   // drop w < min_p (the top weight is 1); <= 0: off

  // Inverse CDF over the kept tokens in rank order: the first token at which the running mass
  // exceeds u * kept_mass(). u in [0, 1).
  int32_t Draw(double u);

  double kept_mass();
  int64_t num_kept() const;
  std::vector<int32_t> KeptIds();  // in rank order (tests, debugging)
  std::span<const float> weights() const { return weights_; }

 private:
  // 2^8 exponents x 2^4 mantissa steps; a weight <= 1.0 has bucket <= 0x3F800000 >> 19.
  static constexpr int kNumBuckets = (0x3F800000 >> 19) + 1;
  static int Bucket(float w);

  // Members of bucket b in rank order (one pass over the row + a sort of the bucket; cached).
  const std::vector<int32_t>& SortedMembers(int bucket);
  // Number of kept members of bucket b (all of them above the end bucket).
  int64_t KeptCount(int bucket) const;
  double KeptMassOf(int bucket);
  // Cuts the kept prefix to end at (bucket, count) if that is shorter than the current one.
  void CutTo(int bucket, int64_t count);

  std::span<float> weights_;
  std::array<int64_t, kNumBuckets> count_{};
  std::array<double, kNumBuckets> mass_{};
  int top_bucket_ = 0;
  int end_bucket_ = 0;     // lowest bucket with kept tokens
  int64_t end_count_ = 0;  // kept members of end_bucket_ (a prefix of its rank order)
  std::vector<std::pair<int, std::vector<int32_t>>> members_cache_;
};

}  // namespace ember
