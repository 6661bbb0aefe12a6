// Strict parsing of OpenAI request bodies into typed requests: every field is type- and
// range-checked, NaN/infinity are rejected, and an unknown field is a 400 that names it (never a
// silent no-op). Accepted and ignored on purpose: `user`, `metadata`. Defaults that depend on the
// model (generation_config.json, context length) are NOT applied here: absent fields stay unset.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/api_error.h"

namespace ember::serve {

// Limits the schema checks against (from the served model and the engine configuration).
struct SchemaLimits {
  int32_t vocab_size = 0;   // bounds logit_bias keys and token-id prompts
  int32_t max_n = 16;
  int32_t max_stop_strings = 16;
  int32_t max_top_logprobs = 20;
};

// Fields shared by chat and completions. Unset optionals fall back to the model's defaults.
struct CommonParams {
  std::string model;  // "" when absent
  std::optional<int32_t> max_tokens;  // max_tokens or max_completion_tokens (0 only with echo)
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int32_t top_logprobs = -1;   // -1: no logprobs; else the chosen token + this many alternatives
  // vLLM's prompt_logprobs (-1: absent): each prompt token's logprob + this many alternatives,
  // returned as vLLM does (not with stream).
  int32_t prompt_logprobs = -1;
  // vLLM's extensions: generate through the model's EOS ids (the request's stop strings still
  // stop), and mask the EOS ids until this many tokens were generated.
  bool ignore_eos = false;
  int32_t min_tokens = 0;
  bool json_object = false;  // response_format {"type": "json_object"}: the output is one object
  // response_format {"type": "json_schema"}: the output is valid against
  // response_format.json_schema.schema (the request builder compiles it).
  bool json_schema = false;
};

// tool_choice: kAuto lets the model decide (the default), kRequired forces one call to any of
// the tools, kFunction forces one call to `tool_choice_name`; "none" clears `tools` instead.
enum class ToolChoice { kAuto, kRequired, kFunction };

struct ChatRequest {
  CommonParams params;
  nlohmann::json messages;  // normalised: every content is a string (text parts joined)
  nlohmann::json tools;     // null or the validated array (null when tool_choice is "none")
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;     // kFunction: a function of `tools`
  bool parallel_tool_calls = true;  // false: the sample ends after its first call
  nlohmann::json chat_template_kwargs = nlohmann::json::object();
};

struct PromptInput {
  bool is_token_ids = false;
  std::string text;
  std::vector<int32_t> token_ids;
};

struct CompletionRequest {
  CommonParams params;
  std::vector<PromptInput> prompts;  // one per prompt in the batch, >= 1
  // The prompt leads each choice's text; with logprobs (params.top_logprobs) its tokens lead the
  // logprobs too (the first with null logprobs).
  bool echo = false;
};

// A logit_bias key: a decimal token id (digits only, at most INT32_MAX); nullopt otherwise.
std::optional<int32_t> ParseTokenIdKey(const std::string& key);

std::optional<ApiError> ParseChatRequest(const nlohmann::json& body, const SchemaLimits& limits,
                                         ChatRequest* out);
std::optional<ApiError> ParseCompletionRequest(const nlohmann::json& body,
                                               const SchemaLimits& limits, CompletionRequest* out);

}  // namespace ember::serve
