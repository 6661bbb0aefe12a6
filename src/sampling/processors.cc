#include "sampling/processors.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/logit_edit.h"
#include "backend/threshold_sampling.h"
#include "sampling/row_math.h"
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

}  // namespace

void ApplyLogitBias(std::span<float> logits, std::span<const std::pair<int32_t, float>> bias) {
  for (const auto& [id, value] : bias) {
    CHECK(id >= 0 && static_cast<size_t>(id) < logits.size()) << "logit_bias id " << id;
    float& logit = logits[static_cast<size_t>(id)];
    logit = ApplyLogitEdit(logit, LogitEditOp::kAdd, value);
  }
}

float PenaltySubtrahend(float frequency, float presence, int32_t count) {
  return frequency * static_cast<float>(count) + presence;
}

void ApplyPenalties(std::span<float> logits, std::span<const int32_t> seen_ids,
                    std::span<const int32_t> output_counts, float repetition, float presence,
                    float frequency) {
  CHECK_EQ(seen_ids.size(), output_counts.size());
  for (size_t i = 0; i < seen_ids.size(); ++i) {
    float& logit = logits[static_cast<size_t>(seen_ids[i])];
    if (repetition != 1.0f) logit = ApplyLogitEdit(logit, LogitEditOp::kRepetition, repetition);
    const int32_t count = output_counts[i];
    if (count > 0) {
      logit = ApplyLogitEdit(logit, LogitEditOp::kSubtract,
                             PenaltySubtrahend(frequency, presence, count));
    }
  }
}

void MaskTokens(std::span<float> logits, std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    float& logit = logits[static_cast<size_t>(id)];
    logit = ApplyLogitEdit(logit, LogitEditOp::kMask, 0.0f);
  }
}

int32_t Argmax(std::span<const float> logits) {
  CHECK(!logits.empty());
  return RowArgmax(logits);  // the backends' rule (ArgmaxRows): one implementation
}

double LogSumExp(std::span<const float> logits) {
  const float max = RowMax(logits);
  if (max == kNegInf) return -std::numeric_limits<double>::infinity();
  // 16 float lanes (vectorised) flushed into a double every 64 rounds: error ~1e-7 relative.
  constexpr size_t kLanes = 16, kRounds = 64;
  const float* x = logits.data();
  const size_t n = logits.size();
  double sum = 0.0;
  size_t i = 0;
  while (i + kLanes <= n) {
    float lanes[kLanes] = {};
    for (size_t round = 0; round < kRounds && i + kLanes <= n; ++round, i += kLanes) {
      for (size_t j = 0; j < kLanes; ++j) lanes[j] += ExpNonPositive(x[i + j] - max);
    }
    for (float lane : lanes) sum += lane;
  }
  for (; i < n; ++i) sum += ExpNonPositive(x[i] - max);
  return static_cast<double>(max) + std::log(sum);
}

std::vector<TokenLogprob> TopLogprobs(std::span<const float> logits, double log_sum_exp,
                                      int32_t k) {
  const size_t n = std::min(logits.size(), static_cast<size_t>(std::max(k, 0)));
  std::vector<TokenLogprob> top;
  if (n == 0) return top;
  // One pass keeping the best n ids sorted; most tokens cost one comparison with the n-th.
  const RanksBefore before{logits.data()};
  std::vector<int32_t> best;
  best.reserve(n + 1);
  for (size_t i = 0; i < logits.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (best.size() == n && !before(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, before), id);
    if (best.size() > n) best.pop_back();
  }
  top.reserve(n);
  for (int32_t id : best) {
    top.push_back({id, static_cast<float>(logits[static_cast<size_t>(id)] - log_sum_exp)});
  }
  return top;
}

int32_t LogprobRank(std::span<const float> logits, int32_t id) {
  CHECK(id >= 0 && static_cast<size_t>(id) < logits.size()) << "token " << id;
  const RanksBefore before{logits.data()};
  int32_t rank = 1;
  for (size_t i = 0; i < logits.size(); ++i) rank += before(static_cast<int32_t>(i), id) ? 1 : 0;
  return rank;
}

}  // namespace ember
