// SamplingParams: the per-request knobs that turn one row of logits into one token (temperature,
// top-k/top-p/min-p, penalties, logit_bias, seed, logprobs, min_tokens). Semantics follow
// vLLM / OpenAI; see sampler.h for the exact order of operations. A plain value type: validate once with Validate() when the
// request arrives, then share it read-only between threads.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "util/status.h"

namespace ember {

// Below this temperature a request is greedy (argmax after the logits processors).
inline constexpr float kGreedyTemperature = 1e-5f;
// OpenAI's cap on `top_logprobs` (and vLLM's default max_logprobs is 20 as well).
inline constexpr int32_t kMaxTopLogprobs = 20;

struct SamplingParams {
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
  int32_t top_k = 0;  // 0 or -1: off; k >= vocab is also effectively off
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  // (token id, bias) added to the raw logits; a repeated id adds its biases together, in order.
  // Validate and the per-step edit list (logit_edits.h) are linear when it is sorted by id
  // (SortLogitBias, once per request); otherwise each step sorts a copy (n log n).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Seeds the per-sequence RNG (mixed with the sample index for n > 1); unset: random device.
  std::optional<uint64_t> seed;
  int32_t top_logprobs = -1;  // -1: no logprobs; 0..20: chosen token's logprob + that many top

  // Stop ids (the engine's: the model's EOS ids unless ignore_eos, plus the request's own) cannot
  // be sampled until this many output tokens exist. n, max_tokens and the stop ids themselves
  // live in the engine's GenerationRequest.
  int32_t min_tokens = 0;

  // Returns an error naming the field, e.g. "top_p: must be in (0, 1], got 1.5". NaN and
  // infinities are rejected everywhere. vocab_size bounds logit_bias.
  Status Validate(int32_t vocab_size) const;
  // Orders logit_bias by token id, stably (a repeated id keeps its entries in request order, so
  // the biases add up bit for bit as before). Call once when the request is built.
  void SortLogitBias();
  bool is_greedy() const { return temperature < kGreedyTemperature; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  bool wants_logprobs() const { return top_logprobs >= 0; }
};

}  // namespace ember
