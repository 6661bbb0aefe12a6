#include "serve/utility_routes.h"

#include "engine/engine.h"
#include "serve/body_fields.h"
#include "serve/embeddings.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/json_bounds.h"
#include "util/utf8.h"
#include "util/version.h"

namespace ember::serve {

namespace {

using nlohmann::json;

constexpr const char* kEmbeddings = "/v1/embeddings";
constexpr const char* kTokenize = "/tokenize";
constexpr const char* kDetokenize = "/detokenize";
constexpr const char* kVersion = "/version";
constexpr const char* kCacheClear = "/v1/cache/clear";

HttpResponse JsonBody(int status, const json& body) {
  HttpResponse res;
  res.status = status;
  res.body = body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  return res;
}

// llama.cpp's add_special or vLLM's add_special_tokens (not both); `fallback` when neither.
std::variant<bool, ApiError> AddSpecial(const RequestJson& body, bool fallback) {
  std::optional<bool> llama, vllm;
  if (auto e = ReadBool(body, "add_special", &llama)) return *e;
  if (auto e = ReadBool(body, "add_special_tokens", &vllm)) return *e;
  if (llama && vllm)
    return InvalidRequest(
        "add_special and add_special_tokens: give one of them (llama.cpp's or "
        "vLLM's name), not both",
        "add_special_tokens");
  return llama.value_or(vllm.value_or(fallback));
}

// The chat form (vLLM): messages (+ tools, chat_template_kwargs) rendered as for
// /v1/chat/completions (the same parser and render, client control-token text kept as text).
struct Rendered {
  std::string text;
  std::vector<TextSpan> client_spans;
};
std::variant<Rendered, ApiError> RenderMessages(const ServedModel& model, const RequestJson& body) {
  if (model.chat_template == nullptr || !model.chat_template->has_template())
    return InvalidRequest("the model '" + model.name +
                              "' has no chat template: tokenize text "
                              "with \"content\" or \"prompt\" instead",
                          "messages", "no_chat_template");
  std::optional<bool> add_generation_prompt, continue_final;
  if (auto e = ReadBool(body, "add_generation_prompt", &add_generation_prompt)) return *e;
  if (auto e = ReadBool(body, "continue_final_message", &continue_final)) return *e;
  if (continue_final.value_or(false))
    return InvalidRequest("continue_final_message: not supported", "continue_final_message",
                          "unsupported_value");
  RequestJson chat = RequestJson::object();
  for (const char* field : {"messages", "tools", "chat_template_kwargs"})
    if (body.contains(field)) chat[field] = body[field];
  ChatRequest req;
  if (auto e = ParseChatRequest(chat, LimitsFor(model), &req)) return *e;
  std::shared_ptr<const std::vector<std::string>> protect = model.protected_strings;
  if (protect == nullptr) protect = ProtectedStringsOf(*model.tokenizer, *model.chat_template);
  Result<RenderedPrompt> rendered = model.chat_template->RenderPrompt(
      req.messages, req.tools, add_generation_prompt.value_or(true), req.chat_template_kwargs,
      *protect);
  if (!rendered.ok())
    return InvalidRequest(
        "the chat template failed to render these messages: " + rendered.message(), "messages",
        "template_error");
  return Rendered{rendered->text, rendered->client_spans};
}

bool IsValidUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    Utf8Lead lead;
    if (!ParseUtf8Lead(b, &lead) || i + lead.continuations >= s.size()) return false;
    for (int k = 1; k <= lead.continuations; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      const uint8_t lo = k == 1 ? lead.first_lo : 0x80, hi = k == 1 ? lead.first_hi : 0xBF;
      if (c < lo || c > hi) return false;
    }
    i += 1 + lead.continuations;
  }
  return true;
}

// llama.cpp's with_pieces: a piece is the token's text, or its bytes when they are not UTF-8.
json Piece(const Tokenizer& tokenizer, int32_t id) {
  std::optional<std::string> bytes = tokenizer.TokenBytes(id);
  if (!bytes) bytes = tokenizer.DecodeToken(id, /*skip_special_tokens=*/false);
  const std::string text = bytes.value_or("");
  if (IsValidUtf8(text)) return text;
  json out = json::array();
  for (unsigned char c : text) out.push_back(static_cast<int>(c));
  return out;
}

// /tokenize's answer: the ids (llama.cpp's {id, piece} objects with_pieces), count and
// max_model_len (vLLM), and vLLM's token_strs when asked.
json TokenizeAnswer(const ServedModel& model, const std::vector<int32_t>& ids, bool with_pieces,
                    bool token_strs) {
  json tokens = json::array();
  for (int32_t id : ids) {
    if (with_pieces) {
      tokens.push_back({{"id", id}, {"piece", Piece(*model.tokenizer, id)}});
    } else {
      tokens.push_back(id);
    }
  }
  json out = {{"tokens", std::move(tokens)},
              {"count", ids.size()},
              {"max_model_len", model.context_length}};
  if (token_strs) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(model.tokenizer->IdToToken(id));
    out["token_strs"] = std::move(strs);
  }
  return out;
}

}  // namespace

bool IsUtilityPostRoute(const std::string& path) {
  return path == kEmbeddings || path == kTokenize || path == kDetokenize || path == kCacheClear;
}

std::variant<json, ApiError> ClearCache(const ServedModel& model, const RequestJson& body) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object", "");
  if (auto e = CheckFields(body, {"model", "cache_salt"})) return *e;
  std::optional<std::string> name, salt;
  if (auto e = ReadString(body, "model", &name)) return *e;
  if (auto e = CheckServedModelName(name, model.name)) return *e;
  if (auto e = ReadString(body, "cache_salt", &salt)) return *e;
  if (salt && salt->size() > kMaxCacheSaltBytes)
    return InvalidRequest("cache_salt: at most " + std::to_string(kMaxCacheSaltBytes) + " bytes",
                          "cache_salt");
  const PromptCacheCleared removed = model.engine->ClearPromptCache(salt);
  return json{{"object", "cache.clear"},
              {"model", model.name},
              {"scope", salt ? "cache_salt" : "all"},
              {"ram_blocks_removed", removed.ram_blocks},
              {"disk_blocks_removed", removed.disk_blocks},
              {"state_checkpoints_removed", removed.state_checkpoints}};
}

bool IsUtilityRoute(const std::string& path) {
  return IsUtilityPostRoute(path) || path == kVersion;
}

std::variant<json, ApiError> Tokenize(const ServedModel& model, const RequestJson& body) {
  if (auto e = CheckFields(
          body, {"content", "prompt", "messages", "model", "add_special", "add_special_tokens",
                 "parse_special", "with_pieces", "return_token_strs", "add_generation_prompt",
                 "continue_final_message", "tools", "chat_template_kwargs"}))
    return *e;
  std::optional<std::string> name, content, prompt;
  if (auto e = ReadString(body, "model", &name)) return *e;
  if (auto e = CheckServedModelName(name, model.name)) return *e;
  if (auto e = ReadString(body, "content", &content)) return *e;
  if (auto e = ReadString(body, "prompt", &prompt)) return *e;
  const bool chat = body.contains("messages");
  if (static_cast<int>(content.has_value()) + prompt.has_value() + chat != 1)
    return InvalidRequest("give exactly one of content (llama.cpp), prompt or messages (vLLM)",
                          content  ? "content"
                          : prompt ? "prompt"
                                   : "messages",
                          "missing_required_parameter");
  for (const char* chat_only :
       {"add_generation_prompt", "continue_final_message", "tools", "chat_template_kwargs"})
    if (!chat && body.contains(chat_only))
      return InvalidRequest(std::string(chat_only) + ": only with messages", chat_only);
  // Client text in messages never matches special tokens (RenderPrompt's client spans).
  if (chat && body.contains("parse_special"))
    return InvalidRequest("parse_special: only with content or prompt", "parse_special");
  std::optional<bool> parse_special, with_pieces, token_strs;
  if (auto e = ReadBool(body, "parse_special", &parse_special)) return *e;
  if (auto e = ReadBool(body, "with_pieces", &with_pieces)) return *e;
  if (auto e = ReadBool(body, "return_token_strs", &token_strs)) return *e;
  // Defaults as each server has them: llama.cpp's content adds none, vLLM's prompt adds them,
  // a rendered chat already holds them.
  auto add_special = AddSpecial(body, prompt.has_value());
  if (auto* e = std::get_if<ApiError>(&add_special)) return *e;
  std::string text;
  std::vector<TextSpan> no_special;
  if (chat) {
    auto rendered = RenderMessages(model, body);
    if (auto* e = std::get_if<ApiError>(&rendered)) return *e;
    text = std::move(std::get<Rendered>(rendered).text);
    no_special = std::move(std::get<Rendered>(rendered).client_spans);
  } else {
    text = content ? *content : *prompt;
    // parse_special false (llama.cpp): special-token text is ordinary text.
    if (!parse_special.value_or(true) && !text.empty()) no_special.push_back({0, text.size()});
  }
  const std::vector<int32_t> ids =
      model.tokenizer->Encode(text, std::get<bool>(add_special), no_special);
  return TokenizeAnswer(model, ids, with_pieces.value_or(false), token_strs.value_or(false));
}

std::variant<json, ApiError> Detokenize(const ServedModel& model, const RequestJson& body) {
  if (auto e = CheckFields(body, {"tokens", "model", "skip_special_tokens"})) return *e;
  std::optional<std::string> name;
  if (auto e = ReadString(body, "model", &name)) return *e;
  if (auto e = CheckServedModelName(name, model.name)) return *e;
  std::optional<bool> skip_special;
  if (auto e = ReadBool(body, "skip_special_tokens", &skip_special)) return *e;
  const auto it = body.find("tokens");
  if (it == body.end())
    return InvalidRequest("tokens: required", "tokens", "missing_required_parameter");
  if (!it->is_array())
    return InvalidRequest(
        "tokens: expected an array of token ids, got " + std::string(it->type_name()), "tokens",
        "invalid_type");
  std::vector<int32_t> ids;
  ids.reserve(it->size());
  const int32_t vocab = std::max(model.tokenizer->vocab_size(), model.vocab_size);
  for (size_t i = 0; i < it->size(); ++i) {
    int32_t id = 0;
    if (auto e = CheckTokenId((*it)[i], "tokens[" + std::to_string(i) + "]", "tokens", vocab, &id))
      return *e;
    ids.push_back(id);
  }
  // Special tokens are kept unless asked (llama.cpp and vLLM both keep them).
  const std::string text = model.tokenizer->Decode(ids, skip_special.value_or(false));
  return json{{"content", text}, {"prompt", text}};
}

Handled HandleUtilityRoute(const ServedModel& model, const HttpRequest& req, bool shutting_down) {
  if (req.path == kVersion) return {JsonBody(200, {{"version", kEmberVersion}}), nullptr};
  if (req.path == kEmbeddings) return HandleEmbeddings(model, req, shutting_down);
  Result<RequestJson> body = ParseOrderedJsonBounded(req.body, kMaxBodyDepth);
  if (!body.ok()) {
    const ApiError e = InvalidRequest(
        "the request body is not valid JSON (UTF-8): " + body.message(), "", "invalid_json");
    return {JsonBody(e.http_status, e.ToJson()), nullptr};
  }
  auto answer = req.path == kTokenize     ? Tokenize(model, *body)
                : req.path == kCacheClear ? ClearCache(model, *body)
                                          : Detokenize(model, *body);
  if (auto* e = std::get_if<ApiError>(&answer))
    return {JsonBody(e->http_status, e->ToJson()), nullptr};
  return {JsonBody(200, std::get<json>(answer)), nullptr};
}

}  // namespace ember::serve
