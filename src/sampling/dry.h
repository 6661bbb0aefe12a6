// DRY ("Don't Repeat Yourself", p-e-w's sampler as KoboldCpp and llama.cpp define it): a logits
// processor that penalises the tokens which would extend a verbatim repeat of earlier text.
//
// Definition, for a window W = w_0 .. w_{n-1} of the sequence (its last dry_penalty_last_n
// tokens, or all of it, prompt included): if w_{n-1} is a sequence breaker nothing is penalised.
// Otherwise for every earlier position i < n - 1, the match length L_i is the largest L such that
// w_{i-L+1} .. w_i == w_{n-L} .. w_{n-1} and no breaker is among w_{n-L} .. w_{n-1}. The token
// w_{i+1} (unless it is a breaker) is a candidate with length L_i; a candidate's length is its
// largest. A candidate of length L >= dry_allowed_length loses
// dry_multiplier * dry_base^(L - dry_allowed_length) (computed in double, capped at FLT_MAX).
// A breaker is a token whose text contains one of dry_sequence_breakers (a breaker string split
// over several tokens is not seen: llama.cpp also matches such splits; Ember does not).
// Pure functions; thread-safe. O(n) per call (a Z-function over the reversed window).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sampling/sampling_params.h"

namespace ember {

// The (token, penalty) pairs for the token after `window` (the DRY window: the caller cuts it to
// dry_penalty_last_n), sorted by token, distinct, only positive penalties. `breaker_ids`: sorted.
void DryPenalties(std::span<const int32_t> window, const SamplingParams& params,
                  std::span<const int32_t> breaker_ids,
                  std::vector<std::pair<int32_t, float>>* out);

// How a caller lends token texts: token_text(id) is the id's bytes (nullopt: no text), valid
// until the next call.
using TokenTextFn = std::function<std::optional<std::string_view>(int32_t)>;

// The ids in [0, vocab_size) whose text contains one of `breakers`, sorted. Reads every token's
// text once (~150k short searches per breaker: milliseconds; callers cache the defaults).
std::vector<int32_t> DryBreakerIds(std::span<const std::string> breakers, int32_t vocab_size,
                                   const TokenTextFn& token_text);

// Sets params->dry_breaker_ids from params->dry_sequence_breakers when DRY is on (DryBreakerIds
// over the vocabulary); leaves it alone otherwise. Once per request, by whoever has the tokenizer.
void ResolveDryBreakers(SamplingParams* params, int32_t vocab_size,
                        const TokenTextFn& token_text);

}  // namespace ember
