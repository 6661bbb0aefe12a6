// Logits processors and the filtering / drawing steps of the sampler, one function each, so each
// can be tested against a hand-computed example. All operate on ONE row of logits ([vocab_size]
// floats) in place; none allocates except where a result is returned. Stateless and thread-safe
// (the candidate scratch lives in the caller's Candidates). Called by Sample() (sampler.h), which
// fixes their order; the engine should call Sample(), not these.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "sampling/sampler.h"

namespace ember {

// logits[id] += bias for each (id, bias). Ids must be in range (validated by SamplingParams).
void ApplyLogitBias(std::span<float> logits, std::span<const std::pair<int32_t, float>> bias);

// vLLM / HF penalties over the ids seen so far. seen_ids[i] has output count output_counts[i]
// (0 for ids seen only in the prompt). Repetition: every seen id, logit > 0 ? logit / r :
// logit * r. Then logit -= frequency * count + presence * (count > 0), output ids only.
void ApplyPenalties(std::span<float> logits, std::span<const int32_t> seen_ids,
                    std::span<const int32_t> output_counts, float repetition, float presence,
                    float frequency);

// logits[id] = -inf for each id (min_tokens: stop ids cannot be sampled yet).
void MaskTokens(std::span<float> logits, std::span<const int32_t> ids);

// Index of the largest logit, ties -> lowest id. NaN entries are never chosen (unless all are).
int32_t Argmax(std::span<const float> logits);

// log(sum(exp(logits))) accumulated in double; -inf when every logit is -inf.
double LogSumExp(std::span<const float> logits);

// The k largest entries of log_softmax(logits) as (id, logprob), desc, ties by lower id.
// `scratch` is reused between calls to avoid allocation.
std::vector<TokenLogprob> TopLogprobs(std::span<const float> logits, double log_sum_exp,
                                      int32_t k, std::vector<int32_t>& scratch);

// The tokens that survive temperature + top-k + top-p + min-p, with their unnormalised
// probabilities. `weight` is the row rewritten as exp((logit - max) / temperature) (so the top
// token has weight 1); `ids` are the kept tokens; when `sorted` they are ordered by
// (weight desc, id asc), otherwise in no particular order. `total` is the kept mass (double).
struct Candidates {
  std::vector<int32_t> ids;
  std::span<const float> weight;
  double total = 0.0;
  bool sorted = false;
};

// Fills `out` from a processed row (rewritten in place to weights). top_k <= 0 or >= size: off;
// top_p >= 1: off; min_p <= 0: off. Requires temperature >= kGreedyTemperature and at least one
// finite logit. Sorts only what top-k / top-p need (widening partial sorts for top-p).
void FilterCandidates(std::span<float> logits, float temperature, int32_t top_k, float top_p,
                      float min_p, Candidates& out);

// Inverse CDF: the first kept token, in (weight desc, id asc) order, at which the running mass
// exceeds u * total. u in [0, 1). O(n) expected even when the candidates are unsorted (weighted
// quickselect); reorders out.ids.
int32_t DrawCandidate(Candidates& candidates, double u);

}  // namespace ember
