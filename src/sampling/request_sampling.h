// The one path from a request's sampling fields to SamplingParams and max_tokens. Every source
// (an HTTP body, an `ember batch` line, `ember run`'s flags) fills a SamplingRequest whose unset
// fields are nullopt; ResolveSampling merges it with generation_config.json (SamplingDefaults) in
// one precedence order — the request's field, else generation_config.json's, else OpenAI's
// default — and validates the result in one place (SamplingParams::Validate, max_tokens against
// min_tokens, and CheckContextFits), every error naming its field. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "sampling/sampling_params.h"

namespace ember {

// generation_config.json's sampling fields (absent: nullopt). GenerationDefaults holds the same
// fields; serve's SamplingDefaultsOf copies them over.
struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  std::optional<int32_t> max_new_tokens;  // the default max_tokens
};

// What one request asked for. Unset optionals fall back to SamplingDefaults, then to OpenAI's
// defaults (temperature 1, top_p 1, top_k off, min_p 0, penalties off).
struct SamplingRequest {
  std::optional<int32_t> max_tokens;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<float> presence_penalty, frequency_penalty;  // generation_config has none
  std::optional<int32_t> top_k;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias), in request order
  // A 64-bit pattern. JSON and the CLI spell it as a signed 64-bit integer (OpenAI's range); a
  // negative one stands for its two's-complement bits, so -1 is the seed 2^64 - 1.
  std::optional<uint64_t> seed;
  int32_t top_logprobs = -1;  // -1: no logprobs
  int32_t min_tokens = 0;
  // llama.cpp's samplers (SamplingParams has their definitions); generation_config has none.
  std::optional<float> top_n_sigma, typical_p, xtc_probability, xtc_threshold;
  std::optional<float> dry_multiplier, dry_base;
  std::optional<int32_t> dry_allowed_length, dry_penalty_last_n;
  std::optional<std::vector<std::string>> dry_sequence_breakers;
};

// The sizes a request must fit: the vocabulary (logit_bias ids), the model's context length and
// the KV cache's capacity, in tokens.
struct TokenLimits {
  int32_t vocab_size = 0;
  int64_t context_length = 0;
  int64_t kv_capacity_tokens = 0;
};

// Everything besides the request that resolving it needs.
struct SamplingContext {
  SamplingDefaults defaults;
  TokenLimits limits;
  // max_tokens when neither the request nor generation_config.json sets it: a count (OpenAI's
  // completions: 16; `ember run`: 128) or nullopt, the rest of the context (chat). A default is
  // cut to the room the prompt leaves in the context and in the KV cache.
  std::optional<int32_t> fallback_max_tokens;
  int64_t num_prompt_tokens = 0;
  std::string prompt_field = "prompt";  // the field that carried the prompt, for its errors
};

// Why a request was refused: the top-level field to blame ("top_p", "logit_bias", "max_tokens",
// the prompt's field) and a message that names it and says what was expected.
struct SamplingError {
  std::string field;
  std::string message;
  bool context_length_exceeded = false;  // the prompt (+ max_tokens) is longer than the context
};

struct ResolvedSampling {
  SamplingParams params;
  int32_t max_tokens = 0;
};

std::variant<ResolvedSampling, SamplingError> ResolveSampling(const SamplingRequest& request,
                                                              const SamplingContext& context);

// The fields the request gives, checked alone (no defaults, no prompt yet), with the same rules
// and messages as ResolveSampling: what a parser calls to refuse a bad value early.
std::optional<SamplingError> ValidateSamplingRequest(const SamplingRequest& request,
                                                     int32_t vocab_size);

// The one context-length rule: the prompt leaves room to generate (none needed when max_tokens
// is 0), and prompt + max_tokens fits both the context and the KV cache. ResolveSampling calls
// it; Engine::Validate is the authority at Submit and should call it too (with "prompt").
std::optional<SamplingError> CheckContextFits(int64_t num_prompt_tokens, int64_t max_tokens,
                                              const TokenLimits& limits,
                                              const std::string& prompt_field);

}  // namespace ember
