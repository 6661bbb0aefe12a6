// Logits processors and logprob helpers, one function each, so each can be tested against a
// hand-computed example. All operate on ONE row of logits ([vocab_size] floats); none allocates
// except where a result is returned. Stateless and thread-safe. Called by Sample() (sampler.h),
// which fixes their order; the engine should call Sample(), not these. The float operation of
// each processor is backend/logit_edit.h's ApplyLogitEdit (shared with the backends).
// Temperature and the top-k / top-p / min-p filters live in weighted_row.h.
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

// The amount a penalised output id's logit drops by: frequency * count + presence, in float
// (one compiled copy, used by ApplyPenalties and by the logit-edit lists of logit_edits.h).
float PenaltySubtrahend(float frequency, float presence, int32_t count);

// logits[id] = -inf for each id (min_tokens: stop ids cannot be sampled yet).
void MaskTokens(std::span<float> logits, std::span<const int32_t> ids);

// Index of the largest logit, ties -> lowest id. NaN entries are never chosen (unless all are).
int32_t Argmax(std::span<const float> logits);

// log(sum(exp(logits))) accumulated in double; -inf when every logit is -inf.
double LogSumExp(std::span<const float> logits);

// The k largest entries of log_softmax(logits) as (id, logprob), desc, ties by lower id;
// log_sum_exp is LogSumExp(logits). One pass, O(vocab + k^2).
std::vector<TokenLogprob> TopLogprobs(std::span<const float> logits, double log_sum_exp, int32_t k);

// 1 + the number of ids that TopLogprobs ranks before `id` (logit desc, ties by lower id): the
// 1-based place `id` takes in that order. One pass.
int32_t LogprobRank(std::span<const float> logits, int32_t id);

}  // namespace ember
