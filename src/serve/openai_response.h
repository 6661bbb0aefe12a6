// OpenAI response shapes: chat.completion / text_completion bodies, their streaming chunks
// (chat.completion.chunk with `delta`s; text_completion chunks), the usage object with
// prompt_tokens_details.cached_tokens, logprobs in each endpoint's format, and SSE framing.
// Pure functions over plain structs; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/request_builder.h"
#include "serve/tool_calls.h"

namespace ember::serve {

struct ResponseMeta {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;        // chatcmpl-... / cmpl-...
  int64_t created = 0;   // unix seconds
  std::string model;
};

// One token's logprob information (token strings already decoded): a generated token, or a
// prompt token of an echo (completions).
struct TokenLogprobEntry {
  std::string token;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // desc by logprob
  int64_t text_offset = 0;    // completions: where the token's text starts in the choice's text
  bool null_logprob = false;  // an echoed prompt's first token: logprob and top are null
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  // Speculative decoding ran for the request: completion_tokens_details carries the drafted
  // tokens kept (accepted_prediction_tokens) and dropped (rejected_prediction_tokens).
  bool speculative = false;
  int64_t accepted_prediction_tokens = 0, rejected_prediction_tokens = 0;
  // Jump-forward ran for the request (a constraint, no logprobs, the server has it on):
  // completion_tokens_details.forced_tokens, the tokens appended without sampling.
  bool jump_forward = false;
  int64_t forced_tokens = 0;
};

// A piece of one choice: for a chunk, the new text; for a final body, the whole text.
struct ChoiceOutput {
  int32_t index = 0;
  std::string text;
  bool with_logprobs = false;
  std::vector<TokenLogprobEntry> logprobs;
  std::optional<std::string> finish_reason;
  std::string reasoning;                // chat: reasoning_content (a thinking model's <think>)
  std::vector<ToolCall> tool_calls;     // chat: the calls (a final body's content is null when
                                        // it has calls and no text)
  // vLLM's prompt_logprobs of the choice's prompt (prompt_logprobs.h), when asked: a final
  // body has it on the choice (completions) or on the body, from the first choice (chat).
  std::optional<nlohmann::json> prompt_logprobs;
};

// A logprob as JSON holds it: JSON has no -inf, so (as OpenAI) anything below -9999 is -9999.
double SafeLogprob(float logprob);

std::string NewResponseId(Endpoint endpoint);
std::string NewToolCallId();  // "call_" + 24 hex digits, unique in this process
nlohmann::json UsageJson(const Usage& usage);
// The counts of a chat body's `usage` as UsageJson writes them (prompt, completion and cached
// tokens; absent fields 0), for the dialects that reshape a chat body (Responses, Messages).
Usage UsageFromJson(const nlohmann::json& usage);

// Non-streaming body.
nlohmann::json FinalBody(const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                         const Usage& usage);
// One streaming chunk for one choice. `usage_null` adds "usage": null (include_usage streams).
nlohmann::json ChunkBody(const ResponseMeta& meta, const ChoiceOutput& choice, bool usage_null);
// The chat stream's opening chunk: delta {"role": "assistant", "content": ""}.
nlohmann::json RoleChunkBody(const ResponseMeta& meta, int32_t index, bool usage_null);
// The optional last chunk of an include_usage stream: "choices": [] and the usage.
nlohmann::json UsageChunkBody(const ResponseMeta& meta, const Usage& usage);

// SSE framing: "data: <json>\n\n"; the terminator is "data: [DONE]\n\n".
std::string SseEvent(const nlohmann::json& body);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace ember::serve
