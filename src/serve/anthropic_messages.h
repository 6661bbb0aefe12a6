// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) over the chat request
// path: TranslateAnthropicRequest validates a body strictly (every bad or unknown field is a 400
// naming its path) and writes the equivalent chat-completions body (system -> a system message;
// text / tool_use / tool_result / thinking blocks -> content, tool_calls, tool messages,
// reasoning_content; tools and tool_choice -> function tools; stop_sequences -> stop; thinking ->
// the template's enable_thinking). AnthropicOutput shapes the generation as a `message` body or as
// Anthropic's event stream (message_start, ping, content_block_start/delta/stop with text_delta,
// thinking_delta and input_json_delta, message_delta with stop_reason and usage, message_stop).
// Pure functions; an AnthropicOutput belongs to one request (one thread at a time).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/api_dialect.h"
#include "serve/openai_schema.h"

namespace ember::serve {

enum class AnthropicRoute { kMessages, kCountTokens };

struct AnthropicTranslation {
  RequestJson chat_body;
  // The Anthropic path of each chat message ("system", "messages[2]", "messages[3].content[1]"),
  // so that an error PrepareChat finds in chat message k names the field the client wrote.
  std::vector<std::string> message_paths;
};

std::variant<AnthropicTranslation, ApiError> TranslateAnthropicRequest(const RequestJson& body,
                                                                       AnthropicRoute route);
// An error PrepareChat made about the translated body, with Anthropic's field names (stop ->
// stop_sequences, tools[i].function.parameters -> tools[i].input_schema, messages[k] -> its path).
ApiError WithAnthropicFieldNames(ApiError error, const std::vector<std::string>& message_paths);

// "invalid_request_error", "authentication_error", ... for an HTTP status.
std::string AnthropicErrorType(int status);
// {"type": "error", "error": {"type", "message"}}
nlohmann::json AnthropicErrorJson(int status, const std::string& message);

class AnthropicOutput final : public DialectOutput {
 public:
  explicit AnthropicOutput(std::string model);

  nlohmann::json Body(const nlohmann::json& chat_completion,
                      const std::string& stop_string) override;
  void Begin(const Usage& usage, std::string* out) override;
  void Chunk(const nlohmann::json& chunk, std::string* out) override;
  void End(const Usage& usage, const std::string& stop_string, std::string* out) override;
  void Fail(const ApiError& error, std::string* out) override;

 private:
  enum class Block { kNone, kThinking, kText };
  void OpenBlock(Block block, std::string* out);
  void CloseBlock(std::string* out);
  void ToolUseBlock(const nlohmann::json& call, std::string* out);

  std::string model_;
  std::string id_;  // msg_... (the same 24 hex digits scheme as the chat ids)
  Block open_ = Block::kNone;
  int32_t num_blocks_ = 0;  // blocks started so far (the next block's index)
  std::string finish_reason_;
};

}  // namespace ember::serve
