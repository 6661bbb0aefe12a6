#include "serve/anthropic_messages.h"

#include <climits>

#include "serve/dialect_fields.h"

namespace ember::serve {

namespace {

using json = RequestJson;

// {"type": "text", "text", "cache_control", "citations"}: the last two accepted and not used.
MaybeApiError ReadTextBlock(FieldReader& r, std::string* text) {
  const json* t = nullptr;
  EMBER_DIALECT_TRY(r.Required("text", &t));
  if (!t->is_string()) return FieldTypeError(r.Path("text"), "a string", *t);
  *text = t->get<std::string>();
  r.Get("cache_control");
  r.Get("citations");
  return r.CheckUnknown();
}

// A block's `type` (required string), read first.
MaybeApiError BlockType(FieldReader& r, std::string* type) {
  const json* t = nullptr;
  EMBER_DIALECT_TRY(r.Required("type", &t));
  if (!t->is_string()) return FieldTypeError(r.Path("type"), "a string", *t);
  *type = t->get<std::string>();
  return std::nullopt;
}

ApiError UnsupportedBlock(const std::string& path, const std::string& type, const char* allowed) {
  if (type == "image" || type == "document")
    return InvalidRequest(path + ".type: '" + type +
                              "' blocks are not supported by this server "
                              "(no vision or documents)",
                          path + ".type", "unsupported_value");
  return InvalidRequest(path + ".type: must be one of " + allowed + " here, got '" + type + "'",
                        path + ".type", "invalid_value");
}

// A string, or text blocks joined with "\n" (system prompts, tool results).
MaybeApiError ReadText(const json& v, const std::string& path, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return FieldTypeError(path, "a string or an array of text blocks", v);
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string bpath = ItemPath(path, i);
    if (!v[i].is_object()) return FieldTypeError(bpath, "an object", v[i]);
    FieldReader br(v[i], bpath);
    std::string type, text;
    EMBER_DIALECT_TRY(BlockType(br, &type));
    if (type != "text") return UnsupportedBlock(bpath, type, "'text'");
    EMBER_DIALECT_TRY(ReadTextBlock(br, &text));
    if (i > 0) *out += "\n";
    *out += text;
  }
  return std::nullopt;
}

// {"type": "tool_result", "tool_use_id", "content", "is_error", "cache_control"} -> a tool message.
// is_error is accepted and not rendered (chat templates have no place for it; the content says).
MaybeApiError ReadToolResult(FieldReader& r, const std::string& path, ChatMessageList* out) {
  std::string id, content;
  const json* idv = nullptr;
  EMBER_DIALECT_TRY(r.Required("tool_use_id", &idv));
  if (!idv->is_string()) return FieldTypeError(r.Path("tool_use_id"), "a string", *idv);
  id = idv->get<std::string>();
  if (const json* c = r.Get("content"))
    EMBER_DIALECT_TRY(ReadText(*c, r.Path("content"), &content));
  std::optional<bool> is_error;
  EMBER_DIALECT_TRY(r.Bool("is_error", &is_error));
  r.Get("cache_control");
  EMBER_DIALECT_TRY(r.CheckUnknown());
  out->Push(json{{"role", "tool"}, {"tool_call_id", id}, {"content", content}}, path);
  return std::nullopt;
}

// A user turn: text blocks become user messages, tool_result blocks tool messages, in order.
MaybeApiError TranslateUserBlocks(const json& blocks, const std::string& path,
                                  ChatMessageList* out) {
  std::string text;
  bool have_text = false;
  auto flush = [&] {
    if (have_text) out->Push(json{{"role", "user"}, {"content", text}}, path);
    have_text = false;
    text.clear();
  };
  for (size_t j = 0; j < blocks.size(); ++j) {
    const std::string bpath = ItemPath(path + ".content", j);
    if (!blocks[j].is_object()) return FieldTypeError(bpath, "an object", blocks[j]);
    FieldReader br(blocks[j], bpath);
    std::string type;
    EMBER_DIALECT_TRY(BlockType(br, &type));
    if (type == "text") {
      std::string part;
      EMBER_DIALECT_TRY(ReadTextBlock(br, &part));
      text += (have_text ? "\n" : "") + part;
      have_text = true;
    } else if (type == "tool_result") {
      flush();
      EMBER_DIALECT_TRY(ReadToolResult(br, bpath, out));
    } else {
      return UnsupportedBlock(bpath, type, "'text', 'tool_result'");
    }
  }
  flush();
  return std::nullopt;
}

// {"type": "tool_use", "id", "name", "input", "cache_control"} -> an OpenAI tool call (the
// arguments stay an object, in the client's key order, as templates render them).
MaybeApiError ReadToolUse(FieldReader& r, json* call) {
  const json *id = nullptr, *name = nullptr, *input = nullptr;
  EMBER_DIALECT_TRY(r.Required("id", &id));
  if (!id->is_string()) return FieldTypeError(r.Path("id"), "a string", *id);
  EMBER_DIALECT_TRY(r.Required("name", &name));
  if (!name->is_string()) return FieldTypeError(r.Path("name"), "a string", *name);
  EMBER_DIALECT_TRY(r.Required("input", &input));
  if (!input->is_object()) return FieldTypeError(r.Path("input"), "an object", *input);
  r.Get("cache_control");
  EMBER_DIALECT_TRY(r.CheckUnknown());
  *call = json{{"id", *id},
               {"type", "function"},
               {"function", json{{"name", *name}, {"arguments", *input}}}};
  return std::nullopt;
}

// An assistant turn: text -> content, thinking -> reasoning_content (Qwen3-style templates render
// it), tool_use -> tool_calls; redacted_thinking is accepted and dropped (it has no text).
MaybeApiError TranslateAssistantBlocks(const json& blocks, const std::string& path,
                                       ChatMessageList* out) {
  std::string text, reasoning;
  json calls = json::array();
  for (size_t j = 0; j < blocks.size(); ++j) {
    const std::string bpath = ItemPath(path + ".content", j);
    if (!blocks[j].is_object()) return FieldTypeError(bpath, "an object", blocks[j]);
    FieldReader br(blocks[j], bpath);
    std::string type;
    EMBER_DIALECT_TRY(BlockType(br, &type));
    if (type == "text") {
      std::string part;
      EMBER_DIALECT_TRY(ReadTextBlock(br, &part));
      text += part;
    } else if (type == "thinking") {
      std::string thinking, signature;
      const json* t = nullptr;
      EMBER_DIALECT_TRY(br.Required("thinking", &t));
      if (!t->is_string()) return FieldTypeError(br.Path("thinking"), "a string", *t);
      EMBER_DIALECT_TRY(br.String("signature", &signature));
      EMBER_DIALECT_TRY(br.CheckUnknown());
      reasoning += t->get<std::string>();
    } else if (type == "redacted_thinking") {
      std::string data;
      EMBER_DIALECT_TRY(br.String("data", &data));
      EMBER_DIALECT_TRY(br.CheckUnknown());
    } else if (type == "tool_use") {
      json call;
      EMBER_DIALECT_TRY(ReadToolUse(br, &call));
      calls.push_back(std::move(call));
    } else {
      return UnsupportedBlock(bpath, type, "'text', 'thinking', 'redacted_thinking', 'tool_use'");
    }
  }
  json message = {{"role", "assistant"}, {"content", text}};
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  out->Push(std::move(message), path);
  return std::nullopt;
}

MaybeApiError TranslateMessages(FieldReader& r, ChatMessageList* out) {
  const json* messages = nullptr;
  EMBER_DIALECT_TRY(r.Required("messages", &messages));
  if (!messages->is_array()) return FieldTypeError("messages", "an array", *messages);
  if (messages->empty()) return InvalidRequest("messages: must not be empty", "messages");
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string path = ItemPath("messages", i);
    const json& m = (*messages)[i];
    if (!m.is_object()) return FieldTypeError(path, "an object", m);
    FieldReader mr(m, path);
    std::string role;
    const json *rolev = nullptr, *content = nullptr;
    EMBER_DIALECT_TRY(mr.Required("role", &rolev));
    if (!rolev->is_string()) return FieldTypeError(mr.Path("role"), "a string", *rolev);
    role = rolev->get<std::string>();
    if (role != "user" && role != "assistant")
      return InvalidRequest(path + ".role: must be 'user' or 'assistant', got '" + role + "'",
                            path + ".role");
    EMBER_DIALECT_TRY(mr.Required("content", &content));
    EMBER_DIALECT_TRY(mr.CheckUnknown());
    if (content->is_string()) {
      out->Push(json{{"role", role}, {"content", *content}}, path);
    } else if (!content->is_array()) {
      return FieldTypeError(path + ".content", "a string or an array of content blocks", *content);
    } else if (content->empty()) {
      return InvalidRequest(path + ".content: must not be empty", path + ".content");
    } else if (role == "user") {
      EMBER_DIALECT_TRY(TranslateUserBlocks(*content, path, out));
    } else {
      EMBER_DIALECT_TRY(TranslateAssistantBlocks(*content, path, out));
    }
  }
  // The chat path renders every message as a finished turn and then opens a new one: an
  // assistant prefill (a last assistant message the reply would continue) cannot be honoured.
  if (messages->back().value("role", "") == "assistant") {
    const std::string path = ItemPath("messages", messages->size() - 1);
    return InvalidRequest(path +
                              ": a final assistant message (prefill) is not supported by this "
                              "server; end the conversation with a user message",
                          path, "unsupported_value");
  }
  return std::nullopt;
}

// tools[i]: {"name", "description", "input_schema", "type": "custom", "cache_control"}. Anthropic's
// server tools (web search, bash, text editor, ...) have other types: refused by name.
MaybeApiError TranslateTools(FieldReader& r, json* chat_body) {
  const json* tools = nullptr;
  EMBER_DIALECT_TRY(r.Array("tools", &tools));
  if (tools == nullptr) return std::nullopt;
  json out = json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string path = ItemPath("tools", i);
    if (!(*tools)[i].is_object()) return FieldTypeError(path, "an object", (*tools)[i]);
    FieldReader tr((*tools)[i], path);
    std::string type = "custom", description;
    EMBER_DIALECT_TRY(tr.String("type", &type));
    if (type != "custom")
      return InvalidRequest(path + ".type: '" + type +
                                "' tools (Anthropic's server tools) are not "
                                "supported; define a custom tool (name, description, input_schema)",
                            path + ".type", "unsupported_value");
    const json *name = nullptr, *schema = nullptr;
    EMBER_DIALECT_TRY(tr.Required("name", &name));
    if (!name->is_string() || name->get<std::string>().empty())
      return InvalidRequest(path + ".name: expected a non-empty string", path + ".name");
    EMBER_DIALECT_TRY(tr.String("description", &description));
    EMBER_DIALECT_TRY(tr.Required("input_schema", &schema));
    if (!schema->is_object()) return FieldTypeError(path + ".input_schema", "an object", *schema);
    tr.Get("cache_control");
    EMBER_DIALECT_TRY(tr.CheckUnknown());
    json function = {{"name", *name}};
    if (!description.empty()) function["description"] = description;
    function["parameters"] = *schema;
    out.push_back(json{{"type", "function"}, {"function", std::move(function)}});
  }
  (*chat_body)["tools"] = std::move(out);
  return std::nullopt;
}

// tool_choice: {"type": "auto" | "any" | "tool" (with "name") | "none",
// "disable_parallel_tool_use"} -> auto / required / a named function / none, parallel_tool_calls.
MaybeApiError TranslateToolChoice(FieldReader& r, json* chat_body) {
  const json* choice = nullptr;
  EMBER_DIALECT_TRY(r.Object("tool_choice", &choice));
  if (choice == nullptr) return std::nullopt;
  FieldReader cr(*choice, "tool_choice");
  std::string type, name;
  EMBER_DIALECT_TRY(BlockType(cr, &type));
  std::optional<bool> no_parallel;
  if (type != "none") EMBER_DIALECT_TRY(cr.Bool("disable_parallel_tool_use", &no_parallel));
  if (type == "tool") {
    const json* n = nullptr;
    EMBER_DIALECT_TRY(cr.Required("name", &n));
    if (!n->is_string()) return FieldTypeError("tool_choice.name", "a string", *n);
    (*chat_body)["tool_choice"] = json{{"type", "function"}, {"function", {{"name", *n}}}};
  } else if (type == "auto" || type == "any" || type == "none") {
    (*chat_body)["tool_choice"] = type == "any" ? "required" : type;
  } else {
    return InvalidRequest(
        "tool_choice.type: must be 'auto', 'any', 'tool' or 'none', got '" + type + "'",
        "tool_choice.type");
  }
  EMBER_DIALECT_TRY(cr.CheckUnknown());
  if (no_parallel) (*chat_body)["parallel_tool_calls"] = !*no_parallel;
  return std::nullopt;
}

// thinking: {"type": "enabled", "budget_tokens"} | {"type": "disabled"} -> the chat template's
// enable_thinking (Qwen3's switch). The budget is not enforced: max_tokens bounds the reply.
MaybeApiError TranslateThinking(FieldReader& r, json* chat_body) {
  const json* thinking = nullptr;
  EMBER_DIALECT_TRY(r.Object("thinking", &thinking));
  if (thinking == nullptr) return std::nullopt;
  FieldReader tr(*thinking, "thinking");
  std::string type;
  EMBER_DIALECT_TRY(BlockType(tr, &type));
  if (type == "enabled") {
    std::optional<int64_t> budget;
    EMBER_DIALECT_TRY(tr.Int("budget_tokens", 1, INT32_MAX, &budget));
    if (!budget) return MissingField("thinking.budget_tokens");
  } else if (type != "disabled") {
    return InvalidRequest("thinking.type: must be 'enabled' or 'disabled', got '" + type + "'",
                          "thinking.type");
  }
  EMBER_DIALECT_TRY(tr.CheckUnknown());
  (*chat_body)["chat_template_kwargs"] = json{{"enable_thinking", type == "enabled"}};
  return std::nullopt;
}

// The generation fields of /v1/messages (count_tokens has none of them).
MaybeApiError TranslateGenerationFields(FieldReader& r, json* chat_body) {
  const json* max_tokens = nullptr;
  EMBER_DIALECT_TRY(r.Required("max_tokens", &max_tokens));
  std::optional<int64_t> n;
  EMBER_DIALECT_TRY(r.Int("max_tokens", 1, INT32_MAX, &n));
  (*chat_body)["max_tokens"] = *n;
  const json* stops = nullptr;
  EMBER_DIALECT_TRY(r.Array("stop_sequences", &stops));
  if (stops != nullptr) {
    for (size_t i = 0; i < stops->size(); ++i)
      if (!(*stops)[i].is_string())
        return FieldTypeError(ItemPath("stop_sequences", i), "a string", (*stops)[i]);
    if (!stops->empty()) (*chat_body)["stop"] = *stops;
  }
  // Ranges are the chat path's (ValidateSamplingRequest); the names are the same.
  for (const char* name : {"temperature", "top_p", "top_k"}) {
    if (const json* v = r.Get(name)) {
      if (!v->is_number()) return FieldTypeError(name, "a number", *v);
      (*chat_body)[name] = *v;
    }
  }
  std::optional<bool> stream;
  EMBER_DIALECT_TRY(r.Bool("stream", &stream));
  if (stream.value_or(false)) (*chat_body)["stream"] = true;
  // metadata: {"user_id"}: accepted and not used (as the chat route's metadata).
  const json* metadata = nullptr;
  EMBER_DIALECT_TRY(r.Object("metadata", &metadata));
  if (metadata != nullptr) {
    FieldReader mr(*metadata, "metadata");
    std::string user_id;
    EMBER_DIALECT_TRY(mr.String("user_id", &user_id));
    EMBER_DIALECT_TRY(mr.CheckUnknown());
  }
  return PassCacheSalt(r, chat_body);
}

}  // namespace

std::variant<AnthropicTranslation, ApiError> TranslateAnthropicRequest(const RequestJson& body,
                                                                       AnthropicRoute route) {
  if (!body.is_object()) return FieldTypeError("body", "a JSON object", body);
  FieldReader r(body, "");
  json chat = json::object();
  std::string model;
  EMBER_DIALECT_TRY(r.String("model", &model));
  if (!model.empty()) chat["model"] = model;
  ChatMessageList messages;
  if (const json* system = r.Get("system")) {
    std::string text;
    EMBER_DIALECT_TRY(ReadText(*system, "system", &text));
    if (!text.empty()) messages.Push(json{{"role", "system"}, {"content", text}}, "system");
  }
  EMBER_DIALECT_TRY(TranslateMessages(r, &messages));
  chat["messages"] = std::move(messages.list);
  if (route == AnthropicRoute::kMessages) EMBER_DIALECT_TRY(TranslateGenerationFields(r, &chat));
  EMBER_DIALECT_TRY(TranslateTools(r, &chat));
  EMBER_DIALECT_TRY(TranslateToolChoice(r, &chat));
  EMBER_DIALECT_TRY(TranslateThinking(r, &chat));
  EMBER_DIALECT_TRY(r.CheckUnknown());
  return AnthropicTranslation{std::move(chat), std::move(messages.paths)};
}

namespace {

// The Anthropic name of a chat field path (itself when the names agree).
std::string AnthropicPath(const std::string& path, const std::vector<std::string>& message_paths) {
  for (size_t k = 0; k < message_paths.size(); ++k)
    if (auto r = RenamedPath(path, ItemPath("messages", k), message_paths[k])) return *r;
  if (auto r = RenamedPath(path, "stop", "stop_sequences")) return *r;
  if (auto r = RenamedPath(path, "chat_template_kwargs", "thinking")) return *r;
  if (auto r = RenamedPath(path, "tool_choice.function.name", "tool_choice.name")) return *r;
  if (auto r = RenamedPath(path, "max_completion_tokens", "max_tokens")) return *r;
  if (path.rfind("tools[", 0) == 0) {
    const size_t close = path.find(']');
    const std::string tool = path.substr(0, close + 1);
    if (auto r = RenamedPath(path, tool + ".function.parameters", tool + ".input_schema"))
      return *r;
    if (auto r = RenamedPath(path, tool + ".function", tool)) return *r;
  }
  return path;
}

}  // namespace

ApiError WithAnthropicFieldNames(ApiError error, const std::vector<std::string>& message_paths) {
  if (error.param.empty()) return error;
  const std::string renamed = AnthropicPath(error.param, message_paths);
  if (error.message.rfind(error.param, 0) == 0)
    error.message = renamed + error.message.substr(error.param.size());
  error.param = renamed;
  return error;
}

std::string AnthropicErrorType(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

nlohmann::json AnthropicErrorJson(int status, const std::string& message) {
  return {{"type", "error"},
          {"error", {{"type", AnthropicErrorType(status)}, {"message", message}}}};
}

// ---- output ----

namespace {

using out_json = nlohmann::json;

// "call_<hex>" (the chat ids) -> "toolu_<hex>".
std::string ToolUseId(const std::string& call_id) {
  const size_t underscore = call_id.find('_');
  return "toolu_" + (underscore == std::string::npos ? call_id : call_id.substr(underscore + 1));
}

// A call's arguments (compact JSON object text) as the tool_use block's input.
out_json ToolInput(const std::string& arguments) {
  out_json input = out_json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : out_json::object();
}

std::string StopReason(const std::string& finish_reason, const std::string& stop_string) {
  if (finish_reason == "length") return "max_tokens";
  if (finish_reason == "tool_calls") return "tool_use";
  if (!stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

out_json StopSequence(const std::string& stop_string) {
  return stop_string.empty() ? out_json(nullptr) : out_json(stop_string);
}

// Anthropic's usage: input_tokens counts the prompt tokens not read from the prompt cache, which
// cache_read_input_tokens counts (Ember's prefix cache and tiers); the cache is automatic, so no
// request creates cache entries of its own (cache_creation_input_tokens 0).
out_json UsageOf(int64_t prompt_tokens, int64_t cached_tokens, int64_t output_tokens) {
  return {{"input_tokens", prompt_tokens - cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached_tokens},
          {"output_tokens", output_tokens}};
}

}  // namespace

AnthropicOutput::AnthropicOutput(std::string model) : model_(std::move(model)) {
  const std::string suffix = NewToolCallId();  // call_<24 hex digits>, unique in the process
  id_ = "msg_" + suffix.substr(suffix.find('_') + 1);
}

out_json AnthropicOutput::Body(const out_json& chat, const std::string& stop_string) {
  const out_json& choice = chat.at("choices").at(0);
  const out_json& message = choice.at("message");
  out_json content = out_json::array();
  const std::string reasoning = StringField(message, "reasoning_content");
  if (!reasoning.empty())
    content.push_back({{"type", "thinking"}, {"thinking", reasoning}, {"signature", ""}});
  if (const std::string text = StringField(message, "content"); !text.empty())
    content.push_back({{"type", "text"}, {"text", text}});
  if (message.contains("tool_calls")) {
    for (const out_json& call : message["tool_calls"]) {
      content.push_back({{"type", "tool_use"},
                         {"id", ToolUseId(StringField(call, "id"))},
                         {"name", call["function"]["name"]},
                         {"input", ToolInput(StringField(call["function"], "arguments"))}});
    }
  }
  const Usage usage = UsageFromJson(chat.at("usage"));
  return {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_},
          {"content", std::move(content)},
          {"stop_reason", StopReason(StringField(choice, "finish_reason"), stop_string)},
          {"stop_sequence", StopSequence(stop_string)},
          {"usage", UsageOf(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)}};
}

void AnthropicOutput::Begin(const Usage& usage, std::string* out) {
  const out_json message = {{"id", id_},
                            {"type", "message"},
                            {"role", "assistant"},
                            {"model", model_},
                            {"content", out_json::array()},
                            {"stop_reason", nullptr},
                            {"stop_sequence", nullptr},
                            {"usage", UsageOf(usage.prompt_tokens, usage.cached_tokens, 0)}};
  *out += SseNamedEvent("message_start", {{"type", "message_start"}, {"message", message}});
  *out += SseNamedEvent("ping", {{"type", "ping"}});
}

void AnthropicOutput::OpenBlock(Block block, std::string* out) {
  if (open_ == block) return;
  CloseBlock(out);
  const out_json content_block =
      block == Block::kThinking
          ? out_json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
          : out_json{{"type", "text"}, {"text", ""}};
  *out += SseNamedEvent(
      "content_block_start",
      {{"type", "content_block_start"}, {"index", num_blocks_}, {"content_block", content_block}});
  open_ = block;
}

void AnthropicOutput::CloseBlock(std::string* out) {
  if (open_ == Block::kNone) return;
  *out +=
      SseNamedEvent("content_block_stop", {{"type", "content_block_stop"}, {"index", num_blocks_}});
  open_ = Block::kNone;
  ++num_blocks_;
}

// A call arrives whole: its block opens, carries the arguments in one input_json_delta, closes.
void AnthropicOutput::ToolUseBlock(const out_json& call, std::string* out) {
  CloseBlock(out);
  const out_json block = {{"type", "tool_use"},
                          {"id", ToolUseId(StringField(call, "id"))},
                          {"name", call["function"]["name"]},
                          {"input", out_json::object()}};
  *out += SseNamedEvent(
      "content_block_start",
      {{"type", "content_block_start"}, {"index", num_blocks_}, {"content_block", block}});
  std::string arguments = StringField(call["function"], "arguments");
  if (arguments.empty()) arguments = "{}";
  *out += SseNamedEvent("content_block_delta",
                        {{"type", "content_block_delta"},
                         {"index", num_blocks_},
                         {"delta", {{"type", "input_json_delta"}, {"partial_json", arguments}}}});
  *out +=
      SseNamedEvent("content_block_stop", {{"type", "content_block_stop"}, {"index", num_blocks_}});
  ++num_blocks_;
}

void AnthropicOutput::Chunk(const out_json& chunk, std::string* out) {
  if (!chunk.contains("choices") || chunk["choices"].empty()) return;
  const out_json& choice = chunk["choices"][0];
  const out_json delta = choice.value("delta", out_json::object());
  const std::string reasoning = StringField(delta, "reasoning_content");
  if (!reasoning.empty()) {
    OpenBlock(Block::kThinking, out);
    *out += SseNamedEvent("content_block_delta",
                          {{"type", "content_block_delta"},
                           {"index", num_blocks_},
                           {"delta", {{"type", "thinking_delta"}, {"thinking", reasoning}}}});
  }
  const std::string text = StringField(delta, "content");
  if (!text.empty()) {
    OpenBlock(Block::kText, out);
    *out +=
        SseNamedEvent("content_block_delta", {{"type", "content_block_delta"},
                                              {"index", num_blocks_},
                                              {"delta", {{"type", "text_delta"}, {"text", text}}}});
  }
  if (delta.contains("tool_calls"))
    for (const out_json& call : delta["tool_calls"]) ToolUseBlock(call, out);
  if (const std::string finish = StringField(choice, "finish_reason"); !finish.empty())
    finish_reason_ = finish;
}

void AnthropicOutput::End(const Usage& usage, const std::string& stop_string, std::string* out) {
  CloseBlock(out);
  *out += SseNamedEvent(
      "message_delta",
      {{"type", "message_delta"},
       {"delta",
        {{"stop_reason", StopReason(finish_reason_, stop_string)},
         {"stop_sequence", StopSequence(stop_string)}}},
       {"usage", UsageOf(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)}});
  *out += SseNamedEvent("message_stop", {{"type", "message_stop"}});
}

void AnthropicOutput::Fail(const ApiError& error, std::string* out) {
  *out += SseNamedEvent("error", AnthropicErrorJson(error.http_status, error.message));
}

}  // namespace ember::serve
