#include "serve/api_dialect.h"

#include "serve/anthropic_messages.h"
#include "serve/openai_responses.h"

namespace ember::serve {

namespace {

constexpr const char* kMessagesRoute = "/v1/messages";
constexpr const char* kCountTokensRoute = "/v1/messages/count_tokens";
constexpr const char* kResponsesRoute = "/v1/responses";

bool IsAnthropicPath(const std::string& path) {
  return path.rfind(kMessagesRoute, 0) == 0;
}

DialectResult PrepareAnthropic(const ServedModel& model, const RequestJson& body,
                               AnthropicRoute route) {
  auto translated = TranslateAnthropicRequest(body, route);
  if (auto* error = std::get_if<ApiError>(&translated)) return *error;
  const AnthropicTranslation& t = std::get<AnthropicTranslation>(translated);
  Prepared prepared = PrepareChat(model, t.chat_body);
  if (auto* error = std::get_if<ApiError>(&prepared))
    return WithAnthropicFieldNames(std::move(*error), t.message_paths);
  PreparedRequest& request = std::get<PreparedRequest>(prepared);
  if (route == AnthropicRoute::kCountTokens)
    return nlohmann::json{{"input_tokens", request.prompts.at(0).request.prompt_ids.size()}};
  return DialectGeneration{std::move(request), std::make_unique<AnthropicOutput>(model.name)};
}

DialectResult PrepareResponses(const ServedModel& model, const RequestJson& body) {
  auto translated = TranslateResponsesRequest(body);
  if (auto* error = std::get_if<ApiError>(&translated)) return *error;
  ResponsesTranslation& t = std::get<ResponsesTranslation>(translated);
  Prepared prepared = PrepareChat(model, t.chat_body);
  if (auto* error = std::get_if<ApiError>(&prepared))
    return WithResponsesFieldNames(std::move(*error), t.message_paths);
  return DialectGeneration{std::move(std::get<PreparedRequest>(prepared)),
                           std::make_unique<ResponsesOutput>(model.name, std::move(t.echo))};
}

}  // namespace

bool IsDialectRoute(const std::string& path) {
  return path == kMessagesRoute || path == kCountTokensRoute || path == kResponsesRoute;
}

DialectResult PrepareDialect(const std::string& path, const ServedModel& model,
                             const RequestJson& body) {
  if (path == kCountTokensRoute) return PrepareAnthropic(model, body, AnthropicRoute::kCountTokens);
  if (path == kMessagesRoute) return PrepareAnthropic(model, body, AnthropicRoute::kMessages);
  if (path == kResponsesRoute) return PrepareResponses(model, body);
  return ApiError{404, "Unknown path " + path, "invalid_request_error", "", "not_found"};
}

void ShapeDialectError(const std::string& path, int status, std::string* body) {
  if (!IsAnthropicPath(path) || status < 400) return;
  const nlohmann::json parsed = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
  std::string message = "error " + std::to_string(status);
  if (parsed.is_object() && parsed.contains("error") && parsed["error"].is_object())
    message = parsed["error"].value("message", message);
  *body = AnthropicErrorJson(status, message)
              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
          "\n";
}

}  // namespace ember::serve
