// API dialects: routes that speak another API than OpenAI's chat completions — Anthropic's
// Messages (/v1/messages, /v1/messages/count_tokens) and OpenAI's Responses (/v1/responses) —
// over the same engine and request path. A dialect validates its body strictly (an unknown or bad
// field is a 4xx naming it), translates it into the equivalent chat-completions body for
// PrepareChat (same template, protected strings, tool formats, reasoning parsers, constraints),
// and shapes the generation's output through a DialectOutput: the chat.completion body, or the
// stream of chat.completion.chunk bodies, become the dialect's body or events. Errors made
// anywhere in the server for a dialect route are reshaped by ShapeDialectError.
// Pure functions; a DialectOutput belongs to one request and is driven by one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "serve/api_error.h"
#include "serve/openai_response.h"
#include "serve/request_builder.h"

namespace ember::serve {

// Turns one generation's output (run as a chat completion, n = 1) into a dialect's shapes.
class DialectOutput {
 public:
  virtual ~DialectOutput() = default;
  // Non-streaming: the dialect's body from the chat.completion body (with its usage) and the
  // stop string that ended the sample ("" when none did).
  virtual nlohmann::json Body(const nlohmann::json& chat_completion,
                              const std::string& stop_string) = 0;
  // Streaming: the SSE text of the stream's opening (the prompt's tokens are known), of one
  // chat.completion.chunk, of the end (final usage), and of a failure (after which nothing more).
  virtual void Begin(const Usage& usage, std::string* out) = 0;
  virtual void Chunk(const nlohmann::json& chunk, std::string* out) = 0;
  virtual void End(const Usage& usage, const std::string& stop_string, std::string* out) = 0;
  virtual void Fail(const ApiError& error, std::string* out) = 0;
};

// A dialect request ready to run: the chat request PrepareChat made and the output's translator.
struct DialectGeneration {
  PreparedRequest prepared;
  std::unique_ptr<DialectOutput> output;
};
// What a dialect route answers with: a generation, a body answered at once (count_tokens), or an
// error (in OpenAI's shape; the server reshapes it with ShapeDialectError).
using DialectResult = std::variant<DialectGeneration, nlohmann::json, ApiError>;

// The POST routes of the dialects.
bool IsDialectRoute(const std::string& path);
// `body` was parsed once (bounded depth) by the server; the route is IsDialectRoute.
DialectResult PrepareDialect(const std::string& path, const ServedModel& model,
                             const RequestJson& body);
// An error response to `path` in the route's dialect: `body` (OpenAI's error JSON, from anywhere
// in the server: auth, limits, routing, the request) is rewritten in place when the route's
// dialect shapes errors differently (Anthropic's); other paths and bodies are left alone.
void ShapeDialectError(const std::string& path, int status, std::string* body);

}  // namespace ember::serve
