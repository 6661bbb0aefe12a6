// The utility routes llama.cpp and vLLM users expect, and the one dispatch point of the routes
// this file and embeddings.h add to HttpServer: POST /tokenize (text, or chat messages rendered
// through the chat template; llama.cpp's and vLLM's field names both), POST /detokenize,
// GET /version, POST /v1/cache/clear (drops cached prompt KV: every namespace, or the one of a
// cache_salt; Engine::ClearPromptCache), and POST /v1/embeddings (embeddings.h). Every field is checked (a 400 naming it);
// the caller has already applied the API key (these routes require it, like llama.cpp; vLLM
// leaves them open). Stateless; called on HTTP worker threads (the POST routes) or the I/O thread
// (/version).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "serve/api_error.h"
#include "serve/http_transport.h"
#include "serve/openai_schema.h"
#include "serve/request_builder.h"

namespace ember::serve {

// The routes below: POST /v1/embeddings, /tokenize, /detokenize, /v1/cache/clear; GET /version.
bool IsUtilityPostRoute(const std::string& path);
bool IsUtilityRoute(const std::string& path);

// Answers one of IsUtilityRoute's paths (method already checked, auth applied).
Handled HandleUtilityRoute(const ServedModel& model, const HttpRequest& req, bool shutting_down);

// The bodies' logic, for tests: the answer JSON or the error.
std::variant<nlohmann::json, ApiError> Tokenize(const ServedModel& model, const RequestJson& body);
std::variant<nlohmann::json, ApiError> Detokenize(const ServedModel& model,
                                                  const RequestJson& body);
// {"model"?, "cache_salt"?}: without cache_salt every namespace is dropped.
std::variant<nlohmann::json, ApiError> ClearCache(const ServedModel& model,
                                                  const RequestJson& body);

}  // namespace ember::serve
