// SamplingParams: the per-request knobs that turn one row of logits into one token (temperature,
// top-k/top-p/min-p, penalties, logit_bias, seed, logprobs, min_tokens; and llama.cpp's DRY, XTC,
// typical_p, top_n_sigma). Semantics follow vLLM / OpenAI, and llama.cpp for the samplers it
// defines; see sampler.h for the exact order of operations. A plain value type: validate once
// with Validate() when the request arrives, then share it read-only between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
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

  // llama.cpp's samplers (sampler.h gives their place in the order; dry.h and
  // distribution_filters.h their exact definitions).
  // top_n_sigma: keep logits >= max - n * sigma (sigma: the population standard deviation of the
  // finite logits). <= 0 (llama.cpp's -1): off.
  float top_n_sigma = -1.0f;
  // typical_p: locally typical sampling over the kept tokens. 1: off.
  float typical_p = 1.0f;
  // XTC: with probability xtc_probability (a per-position draw), every token whose probability is
  // >= xtc_threshold except the least likely of them is removed (nothing when fewer than two).
  float xtc_probability = 0.0f, xtc_threshold = 0.1f;
  // DRY: a token that would extend a repeat of length L >= dry_allowed_length of the last
  // dry_penalty_last_n tokens (-1: the whole sequence, prompt included; 0: off) loses
  // dry_multiplier * dry_base^(L - dry_allowed_length) from its logit. 0 multiplier: off.
  float dry_multiplier = 0.0f, dry_base = 1.75f;
  int32_t dry_allowed_length = 2, dry_penalty_last_n = -1;
  // Strings that end a repeat: a token whose text contains one of them (dry.h). Resolved to token
  // ids by the caller that has the tokenizer (DryBreakerIds); sorted, distinct.
  std::vector<std::string> dry_sequence_breakers = DefaultDrySequenceBreakers();
  std::shared_ptr<const std::vector<int32_t>> dry_breaker_ids;

  // Returns an error naming the field, e.g. "top_p: must be in (0, 1], got 1.5". NaN and
  // infinities are rejected everywhere. vocab_size bounds logit_bias.
  Status Validate(int32_t vocab_size) const;
  Status ValidateLlamaCppSamplers() const;  // the part of Validate for the fields below
  // Orders logit_bias by token id, stably (a repeated id keeps its entries in request order, so
  // the biases add up bit for bit as before). Call once when the request is built.
  void SortLogitBias();
  bool is_greedy() const { return temperature < kGreedyTemperature; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  bool wants_logprobs() const { return top_logprobs >= 0; }
  bool has_dry() const { return dry_multiplier > 0.0f && dry_penalty_last_n != 0; }
  bool has_xtc() const { return xtc_probability > 0.0f; }
  bool has_typical_p() const { return typical_p < 1.0f; }
  bool has_top_n_sigma() const { return top_n_sigma > 0.0f; }
  // The filters only the host sampler implements (sampler.h: BackendCanSample).
  bool has_host_only_filters() const { return has_xtc() || has_typical_p() || has_top_n_sigma(); }

  static std::vector<std::string> DefaultDrySequenceBreakers() { return {"\n", ":", "\"", "*"}; }
};

// Bounds on dry_sequence_breakers (each string is searched in every token's text once per
// request).
inline constexpr size_t kMaxDrySequenceBreakers = 32;
inline constexpr size_t kMaxDrySequenceBreakerBytes = 64;

}  // namespace ember
