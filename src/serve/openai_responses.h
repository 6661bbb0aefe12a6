// OpenAI's Responses API (POST /v1/responses), stateless, over the chat request path:
// TranslateResponsesRequest validates a body strictly (every bad or unknown field is a 400 naming
// its path; previous_response_id, conversation and background are refused by name, `store` is
// accepted and answered `store: false` because nothing is stored) and writes the equivalent
// chat-completions body (instructions -> a system message; message, function_call,
// function_call_output and reasoning items -> chat messages; function tools; text.format ->
// response_format). ResponsesOutput shapes the generation as a `response` object (reasoning,
// message and function_call output items, usage) or as its event stream (response.created ...
// response.completed, each with a sequence_number). Pure functions; a ResponsesOutput belongs to
// one request (one thread at a time).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/api_dialect.h"
#include "serve/openai_schema.h"

namespace ember::serve {

struct ResponsesTranslation {
  RequestJson chat_body;
  // The Responses path of each chat message ("instructions", "input", "input[3]"), for errors
  // PrepareChat finds in chat message k.
  std::vector<std::string> message_paths;
  // The request's settings that a response object repeats (instructions, tools, tool_choice,
  // temperature, text, metadata, ...), with the API's defaults for those absent.
  nlohmann::json echo;
};

std::variant<ResponsesTranslation, ApiError> TranslateResponsesRequest(const RequestJson& body);
// An error PrepareChat made about the translated body, with the Responses field names
// (max_tokens -> max_output_tokens, response_format -> text.format, tools[i].function.x ->
// tools[i].x, messages[k] -> its input path).
ApiError WithResponsesFieldNames(ApiError error, const std::vector<std::string>& message_paths);

class ResponsesOutput final : public DialectOutput {
 public:
  ResponsesOutput(std::string model, nlohmann::json echo);

  nlohmann::json Body(const nlohmann::json& chat_completion,
                      const std::string& stop_string) override;
  void Begin(const Usage& usage, std::string* out) override;
  void Chunk(const nlohmann::json& chunk, std::string* out) override;
  void End(const Usage& usage, const std::string& stop_string, std::string* out) override;
  void Fail(const ApiError& error, std::string* out) override;

 private:
  enum class Open { kNone, kReasoning, kMessage };
  // The response object: status "in_progress", "completed" or "incomplete"; usage when known.
  nlohmann::json ResponseJson(const std::string& status, const Usage* usage) const;
  void Emit(const char* type, nlohmann::json data, std::string* out);
  void OpenItem(Open kind, std::string* out);
  void CloseItem(std::string* out);
  void FunctionCall(const nlohmann::json& call, std::string* out);
  bool incomplete() const { return finish_reason_ == "length"; }

  std::string model_;
  nlohmann::json echo_;
  std::string id_;  // resp_...
  int64_t created_at_ = 0;
  nlohmann::json items_ = nlohmann::json::array();  // the output items so far
  Open open_ = Open::kNone;
  std::string open_text_;  // the open item's text so far
  int64_t sequence_number_ = 0;
  std::string finish_reason_;
};

}  // namespace ember::serve
