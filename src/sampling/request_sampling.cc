#include "sampling/request_sampling.h"

#include <algorithm>

namespace ember {
namespace {

// The request's field, else generation_config.json's, else SamplingParams' own (OpenAI's).
SamplingParams Merge(const SamplingRequest& r, const SamplingDefaults& d) {
  SamplingParams s;
  s.temperature = r.temperature.value_or(d.temperature.value_or(s.temperature));
  s.top_p = r.top_p.value_or(d.top_p.value_or(s.top_p));
  s.top_k = r.top_k.value_or(d.top_k.value_or(s.top_k));
  s.min_p = r.min_p.value_or(d.min_p.value_or(s.min_p));
  s.repetition_penalty =
      r.repetition_penalty.value_or(d.repetition_penalty.value_or(s.repetition_penalty));
  s.presence_penalty = r.presence_penalty.value_or(s.presence_penalty);
  s.frequency_penalty = r.frequency_penalty.value_or(s.frequency_penalty);
  s.logit_bias = r.logit_bias;
  s.SortLogitBias();  // once per request, so each step's edits need no sort
  s.seed = r.seed;
  s.top_logprobs = r.top_logprobs;
  s.min_tokens = r.min_tokens;
  s.top_n_sigma = r.top_n_sigma.value_or(s.top_n_sigma);
  s.typical_p = r.typical_p.value_or(s.typical_p);
  s.xtc_probability = r.xtc_probability.value_or(s.xtc_probability);
  s.xtc_threshold = r.xtc_threshold.value_or(s.xtc_threshold);
  s.dry_multiplier = r.dry_multiplier.value_or(s.dry_multiplier);
  s.dry_base = r.dry_base.value_or(s.dry_base);
  s.dry_allowed_length = r.dry_allowed_length.value_or(s.dry_allowed_length);
  s.dry_penalty_last_n = r.dry_penalty_last_n.value_or(s.dry_penalty_last_n);
  if (r.dry_sequence_breakers) s.dry_sequence_breakers = *r.dry_sequence_breakers;
  return s;
}

// SamplingParams::Validate's message starts with the field ("logit_bias[5]: ..."); the error
// blames the top-level field ("logit_bias").
std::optional<SamplingError> CheckParams(const SamplingParams& params, int32_t vocab_size) {
  Status st = params.Validate(vocab_size);
  if (st.ok()) return std::nullopt;
  const std::string& message = st.message();
  return SamplingError{message.substr(0, message.find_first_of(":[")), message};
}

std::optional<SamplingError> CheckMaxTokens(int64_t max_tokens) {
  if (max_tokens >= 0) return std::nullopt;
  return SamplingError{"max_tokens", "max_tokens: must be >= 0, got " + std::to_string(max_tokens)};
}

std::optional<SamplingError> CheckMinTokens(int32_t min_tokens, int64_t max_tokens) {
  if (min_tokens > max_tokens) {
    return SamplingError{"min_tokens", "min_tokens: must not exceed max_tokens (" +
                                           std::to_string(max_tokens) + "), got " +
                                           std::to_string(min_tokens)};
  }
  return std::nullopt;
}

// max_tokens when the request does not set it: generation_config's, else the fallback, else the
// rest of the context; cut to the room in the context and the KV cache (at least 1: a prompt
// that leaves no room is CheckContextFits' error).
int64_t DefaultMaxTokens(const SamplingContext& c) {
  const int64_t room = c.limits.context_length - c.num_prompt_tokens;
  const int64_t kv_room = c.limits.kv_capacity_tokens - c.num_prompt_tokens;
  int64_t max_tokens = c.defaults.max_new_tokens ? *c.defaults.max_new_tokens
                       : c.fallback_max_tokens   ? *c.fallback_max_tokens
                                                 : room;
  max_tokens = std::min(max_tokens, room);
  if (kv_room >= 1) max_tokens = std::min(max_tokens, kv_room);
  return std::max<int64_t>(max_tokens, 1);
}

}  // namespace

std::optional<SamplingError> CheckContextFits(int64_t num_prompt_tokens, int64_t max_tokens,
                                              const TokenLimits& limits,
                                              const std::string& prompt_field) {
  const std::string context = std::to_string(limits.context_length);
  const std::string prompt = std::to_string(num_prompt_tokens);
  const std::string total = std::to_string(num_prompt_tokens + max_tokens);
  const bool generates = max_tokens > 0;
  if (num_prompt_tokens > limits.context_length ||
      (generates && num_prompt_tokens >= limits.context_length)) {
    return SamplingError{prompt_field,
                         "This model's maximum context length is " + context +
                             " tokens, but the prompt has " + prompt +
                             (generates ? " tokens (no room to generate)" : " tokens"),
                         true};
  }
  if (num_prompt_tokens + max_tokens > limits.context_length) {
    return SamplingError{"max_tokens",
                         "This model's maximum context length is " + context +
                             " tokens. However, you requested " + total + " tokens (" + prompt +
                             " in the prompt, " + std::to_string(max_tokens) +
                             " for the completion). Please reduce the prompt or max_tokens.",
                         true};
  }
  if (num_prompt_tokens + max_tokens > limits.kv_capacity_tokens) {
    return SamplingError{"max_tokens", "the KV cache holds " +
                                           std::to_string(limits.kv_capacity_tokens) +
                                           " tokens; the prompt (" + prompt +
                                           ") plus max_tokens (" + std::to_string(max_tokens) +
                                           ") needs " + total + " (raise --kv-cache-bytes)"};
  }
  return std::nullopt;
}

std::optional<SamplingError> ValidateSamplingRequest(const SamplingRequest& request,
                                                     int32_t vocab_size) {
  if (auto error = CheckParams(Merge(request, SamplingDefaults{}), vocab_size)) return error;
  if (!request.max_tokens) return std::nullopt;
  if (auto error = CheckMaxTokens(*request.max_tokens)) return error;
  return CheckMinTokens(request.min_tokens, *request.max_tokens);
}

std::variant<ResolvedSampling, SamplingError> ResolveSampling(const SamplingRequest& request,
                                                              const SamplingContext& context) {
  ResolvedSampling out;
  out.params = Merge(request, context.defaults);
  if (auto error = CheckParams(out.params, context.limits.vocab_size)) return *error;
  const int64_t max_tokens =
      request.max_tokens ? int64_t{*request.max_tokens} : DefaultMaxTokens(context);
  if (auto error = CheckMaxTokens(max_tokens)) return *error;
  if (auto error = CheckContextFits(context.num_prompt_tokens, max_tokens, context.limits,
                                    context.prompt_field))
    return *error;
  if (auto error = CheckMinTokens(request.min_tokens, max_tokens)) return *error;
  out.max_tokens = static_cast<int32_t>(max_tokens);
  return out;
}

}  // namespace ember
