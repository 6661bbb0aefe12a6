// Strict parsing of OpenAI request bodies into typed requests: every field is type-checked,
// NaN/infinity are rejected, and an unknown field is a 400 that names it (never a silent no-op).
// The sampling fields' ranges are the resolver's (ValidateSamplingRequest, request_sampling.h),
// checked here so that a bad value is refused before any work. Accepted and ignored on purpose:
// `user`, `metadata`. Defaults that depend on the model (generation_config.json, context length)
// are NOT applied here: absent fields stay unset. A body is parsed once, in the client's key order
// (RequestJson), and the typed request keeps that order wherever a template or a schema shows it.
// The completions schema also reads `ember batch` lines (CompletionSource). Pure functions;
// thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/request_sampling.h"
#include "serve/api_error.h"

namespace ember::serve {

// Limits the schema checks against (from the served model and the engine configuration).
struct SchemaLimits {
  int32_t vocab_size = 0;   // bounds logit_bias keys and token-id prompts
  int32_t max_n = 16;
  int32_t max_stop_strings = 16;
  int32_t max_top_logprobs = 20;
};

// A request body, parsed once in the client's key order.
using RequestJson = nlohmann::ordered_json;
// Arrays and objects a request body (or an `ember batch` line) may nest: deeper is a 400 before
// the body is parsed (ParseOrderedJsonBounded), so no recursion ever meets client nesting.
inline constexpr int kMaxBodyDepth = 64;
inline constexpr size_t kMaxCacheSaltBytes = 1024;

// Fields shared by chat and completions: the sampling request (request_sampling.h; unset
// optionals fall back to the model's defaults there) and the fields around it.
// (SamplingRequest::max_tokens is max_completion_tokens or max_tokens; 0 only with echo, or in a
// batch line with prompt_logprobs.)
struct CommonParams : SamplingRequest {
  std::string model;  // "" when absent
  std::vector<std::string> stop;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // vLLM's prompt_logprobs (-1: absent): each prompt token's logprob + this many alternatives,
  // returned as vLLM does (not with stream).
  int32_t prompt_logprobs = -1;
  // vLLM's extension: generate through the model's EOS ids (the request's stop strings still
  // stop); min_tokens (SamplingRequest) masks them until that many tokens were generated.
  bool ignore_eos = false;
  // Ember's extension: false turns speculative decoding off for this request (the server's
  // --spec-method applies otherwise; outputs are the same either way, only the speed and the
  // usage's completion_tokens_details differ).
  bool speculative_decoding = true;
  // vLLM's cache_salt: only requests with the same salt share cached prompt KV (the pool and the
  // disk tier). "" when absent; at most kMaxCacheSaltBytes.
  std::string cache_salt;
  // Ember's extension: the LoRA adapter by name ("none": the base model; "" when absent: the
  // adapter the `model` field names, else the server's --adapter). request_builder resolves it.
  std::string adapter;
  // Structured output, from at most one of the fields that ask for it (two are a 400 naming
  // both): response_format, guided_json, guided_regex, guided_choice, guided_grammar,
  // structured_outputs (vLLM), json_schema and grammar (llama.cpp).
  bool json_object = false;  // response_format {"type": "json_object"}: the output is one object
  // A JSON schema (response_format.json_schema.schema, guided_json, structured_outputs.json,
  // json_schema) in the client's key order (the request builder compiles it); null otherwise.
  RequestJson json_schema;
  // The whole output matches this regex (guided_regex, structured_outputs.regex; guided_choice
  // and structured_outputs.choice as an alternation of their escaped strings).
  std::optional<std::string> regex;
  // The whole output is a sentence of this GBNF grammar (grammar, guided_grammar,
  // structured_outputs.grammar; the request builder compiles it).
  std::optional<std::string> grammar;
  // The field that set the constraint, as errors name it ("guided_json",
  // "response_format.json_schema.schema"); "" without one.
  std::string output_field;
};

// tool_choice: kAuto lets the model decide (the default), kRequired forces one call to any of
// the tools, kFunction forces one call to `tool_choice_name`; "none" clears `tools` instead.
enum class ToolChoice { kAuto, kRequired, kFunction };

struct ChatRequest {
  CommonParams params;
  RequestJson messages;  // normalised: every content is a string (text parts joined)
  RequestJson tools;     // null or the validated array (null when tool_choice is "none")
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;     // kFunction: a function of `tools`
  bool parallel_tool_calls = true;  // false: the sample ends after its first call
  RequestJson chat_template_kwargs = RequestJson::object();
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

// "a string", "an object", ...: the JSON type of `v`, for messages.
const char* JsonTypeName(const RequestJson& v);
// The 400 for a field of the wrong JSON type: "PATH: expected EXPECTED, got TYPE".
ApiError FieldTypeError(const std::string& path, const char* expected, const RequestJson& got);

// A logit_bias key: a decimal token id (digits only, at most INT32_MAX); nullopt otherwise.
std::optional<int32_t> ParseTokenIdKey(const std::string& key);

std::optional<ApiError> ParseChatRequest(const RequestJson& body, const SchemaLimits& limits,
                                         ChatRequest* out);

// Where a completion request comes from. An `ember batch` line is the completions body with these
// differences: the prompt may also come as `prompt_ids` (token ids), it holds one prompt,
// max_tokens 0 asks for prompt_logprobs (the prompt is only scored) instead of echo, and what one
// output line cannot carry is refused: n, echo, stream, stream_options, model (the batch runs
// --model).
enum class CompletionSource { kHttpBody, kBatchLine };

std::optional<ApiError> ParseCompletionRequest(
    const RequestJson& body, const SchemaLimits& limits, CompletionRequest* out,
    CompletionSource source = CompletionSource::kHttpBody);

}  // namespace ember::serve
