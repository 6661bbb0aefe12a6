#include "serve/openai_responses.h"

#include <chrono>
#include <climits>

#include "serve/dialect_fields.h"

namespace ember::serve {

namespace {

using json = RequestJson;

// The text of a message item's content: a string, or input_text / output_text parts (joined
// with "\n"). Images, files and audio are refused by name.
MaybeApiError ReadContentText(const json& content, const std::string& path, std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array())
    return FieldTypeError(path, "a string or an array of content parts", content);
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string ppath = ItemPath(path, i);
    if (!content[i].is_object()) return FieldTypeError(ppath, "an object", content[i]);
    FieldReader pr(content[i], ppath);
    std::string type;
    const json* t = nullptr;
    EMBER_DIALECT_TRY(pr.Required("type", &t));
    if (!t->is_string()) return FieldTypeError(pr.Path("type"), "a string", *t);
    type = t->get<std::string>();
    if (type != "input_text" && type != "output_text") {
      return InvalidRequest(ppath +
                                ".type: only 'input_text' and 'output_text' parts are supported "
                                "by this server (no images, files or audio), got '" +
                                type + "'",
                            ppath + ".type", "unsupported_value");
    }
    const json* text = nullptr;
    EMBER_DIALECT_TRY(pr.Required("text", &text));
    if (!text->is_string()) return FieldTypeError(pr.Path("text"), "a string", *text);
    if (type == "output_text") {  // an earlier response's part sent back as it came
      pr.Get("annotations");
      pr.Get("logprobs");
    }
    EMBER_DIALECT_TRY(pr.CheckUnknown());
    if (i > 0) *out += "\n";
    *out += text->get<std::string>();
  }
  return std::nullopt;
}

// Reads `name` as a required string.
MaybeApiError RequiredString(FieldReader& r, const std::string& name, std::string* out) {
  const json* v = nullptr;
  EMBER_DIALECT_TRY(r.Required(name, &v));
  if (!v->is_string()) return FieldTypeError(r.Path(name), "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

// Builds the chat messages from input items. Function calls join the assistant turn before them
// (one assistant message with several tool_calls); reasoning items attach to the next assistant
// turn as its reasoning_content.
class InputItems {
 public:
  explicit InputItems(ChatMessageList* out) : out_(out) {}

  MaybeApiError Item(const json& item, const std::string& path) {
    if (!item.is_object()) return FieldTypeError(path, "an object", item);
    FieldReader r(item, path);
    std::string type = "message";  // EasyInputMessage has no type
    EMBER_DIALECT_TRY(r.String("type", &type));
    std::string id, status;
    EMBER_DIALECT_TRY(r.String("id", &id));
    EMBER_DIALECT_TRY(r.String("status", &status));
    if (type == "message") return Message(r, path);
    if (type == "function_call") return FunctionCall(r, path);
    if (type == "function_call_output") return FunctionCallOutput(r, path);
    if (type == "reasoning") return Reasoning(r);
    return InvalidRequest(path + ".type: '" + type +
                              "' items are not supported by this server "
                              "(message, function_call, function_call_output, reasoning)",
                          path + ".type", "unsupported_value");
  }

 private:
  MaybeApiError Message(FieldReader& r, const std::string& path) {
    std::string role, text;
    EMBER_DIALECT_TRY(RequiredString(r, "role", &role));
    if (role != "user" && role != "assistant" && role != "system" && role != "developer")
      return InvalidRequest(path +
                                ".role: must be 'user', 'assistant', 'system' or 'developer', "
                                "got '" +
                                role + "'",
                            path + ".role");
    const json* content = nullptr;
    EMBER_DIALECT_TRY(r.Required("content", &content));
    EMBER_DIALECT_TRY(ReadContentText(*content, r.Path("content"), &text));
    EMBER_DIALECT_TRY(r.CheckUnknown());
    json message = {{"role", role}, {"content", text}};
    if (role == "assistant") AttachReasoning(&message);
    out_->Push(std::move(message), path);
    assistant_open_ = role == "assistant";
    return std::nullopt;
  }

  MaybeApiError FunctionCall(FieldReader& r, const std::string& path) {
    std::string call_id, name, arguments;
    EMBER_DIALECT_TRY(RequiredString(r, "call_id", &call_id));
    EMBER_DIALECT_TRY(RequiredString(r, "name", &name));
    EMBER_DIALECT_TRY(RequiredString(r, "arguments", &arguments));
    EMBER_DIALECT_TRY(r.CheckUnknown());
    const json call = {{"id", call_id},
                       {"type", "function"},
                       {"function", {{"name", name}, {"arguments", arguments}}}};
    if (!assistant_open_) {
      json message = {{"role", "assistant"}, {"content", ""}};
      AttachReasoning(&message);
      out_->Push(std::move(message), path);
      assistant_open_ = true;
    }
    out_->list.back()["tool_calls"].push_back(call);
    return std::nullopt;
  }

  MaybeApiError FunctionCallOutput(FieldReader& r, const std::string& path) {
    std::string call_id, output;
    EMBER_DIALECT_TRY(RequiredString(r, "call_id", &call_id));
    const json* v = nullptr;
    EMBER_DIALECT_TRY(r.Required("output", &v));
    EMBER_DIALECT_TRY(ReadContentText(*v, r.Path("output"), &output));
    EMBER_DIALECT_TRY(r.CheckUnknown());
    out_->Push(json{{"role", "tool"}, {"tool_call_id", call_id}, {"content", output}}, path);
    assistant_open_ = false;
    return std::nullopt;
  }

  // {"type": "reasoning", "summary": [{"type": "summary_text", "text"}], "content":
  // [{"type": "reasoning_text", "text"}]}: the content's text (else the summary's).
  MaybeApiError Reasoning(FieldReader& r) {
    std::string content, summary;
    EMBER_DIALECT_TRY(Texts(r, "content", "reasoning_text", &content));
    EMBER_DIALECT_TRY(Texts(r, "summary", "summary_text", &summary));
    if (r.Get("encrypted_content") != nullptr)
      return InvalidRequest(r.Path("encrypted_content") +
                                ": this server never encrypts reasoning "
                                "and cannot read it",
                            r.Path("encrypted_content"), "unsupported_value");
    EMBER_DIALECT_TRY(r.CheckUnknown());
    pending_reasoning_ += content.empty() ? summary : content;
    return std::nullopt;
  }

  static MaybeApiError Texts(FieldReader& r, const std::string& name, const char* part_type,
                             std::string* out) {
    const json* parts = nullptr;
    EMBER_DIALECT_TRY(r.Array(name, &parts));
    if (parts == nullptr) return std::nullopt;
    for (size_t i = 0; i < parts->size(); ++i) {
      const std::string ppath = ItemPath(r.Path(name), i);
      if (!(*parts)[i].is_object()) return FieldTypeError(ppath, "an object", (*parts)[i]);
      FieldReader pr((*parts)[i], ppath);
      std::string type, text;
      EMBER_DIALECT_TRY(RequiredString(pr, "type", &type));
      if (type != part_type)
        return InvalidRequest(ppath + ".type: must be '" + part_type + "'", ppath + ".type");
      EMBER_DIALECT_TRY(RequiredString(pr, "text", &text));
      EMBER_DIALECT_TRY(pr.CheckUnknown());
      *out += text;
    }
    return std::nullopt;
  }

  void AttachReasoning(json* message) {
    if (!pending_reasoning_.empty()) (*message)["reasoning_content"] = pending_reasoning_;
    pending_reasoning_.clear();
  }

  ChatMessageList* out_;
  std::string pending_reasoning_;
  bool assistant_open_ = false;  // the last message is an assistant turn later calls may join
};

// tools[i]: {"type": "function", "name", "description", "parameters", "strict"}; other tool
// types (web_search, file_search, mcp, ...) are refused by name.
MaybeApiError TranslateTools(FieldReader& r, json* chat, json* echo) {
  const json* tools = nullptr;
  EMBER_DIALECT_TRY(r.Array("tools", &tools));
  if (tools == nullptr) return std::nullopt;
  json out = json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string path = ItemPath("tools", i);
    if (!(*tools)[i].is_object()) return FieldTypeError(path, "an object", (*tools)[i]);
    FieldReader tr((*tools)[i], path);
    std::string type, name, description;
    EMBER_DIALECT_TRY(RequiredString(tr, "type", &type));
    if (type != "function")
      return InvalidRequest(path + ".type: '" + type +
                                "' tools are not supported by this server "
                                "(only 'function')",
                            path + ".type", "unsupported_value");
    EMBER_DIALECT_TRY(RequiredString(tr, "name", &name));
    EMBER_DIALECT_TRY(tr.String("description", &description));
    const json* parameters = nullptr;
    EMBER_DIALECT_TRY(tr.Object("parameters", &parameters));
    std::optional<bool> strict;
    EMBER_DIALECT_TRY(tr.Bool("strict", &strict));
    EMBER_DIALECT_TRY(tr.CheckUnknown());
    json function = {{"name", name}};
    if (!description.empty()) function["description"] = description;
    if (parameters != nullptr) function["parameters"] = *parameters;
    if (strict) function["strict"] = *strict;
    out.push_back(json{{"type", "function"}, {"function", std::move(function)}});
  }
  (*chat)["tools"] = std::move(out);
  (*echo)["tools"] = *tools;
  return std::nullopt;
}

// tool_choice: "none" | "auto" | "required" | {"type": "function", "name"}.
MaybeApiError TranslateToolChoice(FieldReader& r, json* chat, json* echo) {
  const json* choice = r.Get("tool_choice");
  if (choice == nullptr) return std::nullopt;
  (*echo)["tool_choice"] = *choice;
  if (choice->is_string()) {
    (*chat)["tool_choice"] = *choice;  // the chat path checks the value
    return std::nullopt;
  }
  if (!choice->is_object()) return FieldTypeError("tool_choice", "a string or an object", *choice);
  FieldReader cr(*choice, "tool_choice");
  std::string type, name;
  EMBER_DIALECT_TRY(RequiredString(cr, "type", &type));
  if (type != "function")
    return InvalidRequest(
        "tool_choice.type: only 'function' is supported by this server, got '" + type + "'",
        "tool_choice.type", "unsupported_value");
  EMBER_DIALECT_TRY(RequiredString(cr, "name", &name));
  EMBER_DIALECT_TRY(cr.CheckUnknown());
  (*chat)["tool_choice"] = json{{"type", "function"}, {"function", {{"name", name}}}};
  return std::nullopt;
}

// text: {"format": {"type": "text" | "json_object" | "json_schema", "name", "schema",
// "strict", "description"}} -> response_format (the chat path's structured output).
MaybeApiError TranslateText(FieldReader& r, json* chat, json* echo) {
  const json* text = nullptr;
  EMBER_DIALECT_TRY(r.Object("text", &text));
  if (text == nullptr) return std::nullopt;
  FieldReader tr(*text, "text");
  const json* format = nullptr;
  EMBER_DIALECT_TRY(tr.Object("format", &format));
  std::string verbosity;
  EMBER_DIALECT_TRY(tr.String("verbosity", &verbosity));
  if (!verbosity.empty() && verbosity != "medium")
    return InvalidRequest("text.verbosity: only 'medium' is supported by this server",
                          "text.verbosity", "unsupported_value");
  EMBER_DIALECT_TRY(tr.CheckUnknown());
  if (format == nullptr) return std::nullopt;
  (*echo)["text"] = json{{"format", *format}};
  FieldReader fr(*format, "text.format");
  std::string type;
  EMBER_DIALECT_TRY(RequiredString(fr, "type", &type));
  if (type == "text" || type == "json_object") {
    EMBER_DIALECT_TRY(fr.CheckUnknown());
    if (type == "json_object") (*chat)["response_format"] = json{{"type", "json_object"}};
    return std::nullopt;
  }
  if (type != "json_schema")
    return InvalidRequest(
        "text.format.type: must be 'text', 'json_object' or 'json_schema', got '" + type + "'",
        "text.format.type", "unsupported_value");
  std::string name, description;
  EMBER_DIALECT_TRY(RequiredString(fr, "name", &name));
  EMBER_DIALECT_TRY(fr.String("description", &description));
  const json* schema = nullptr;
  EMBER_DIALECT_TRY(fr.Required("schema", &schema));
  std::optional<bool> strict;
  EMBER_DIALECT_TRY(fr.Bool("strict", &strict));
  EMBER_DIALECT_TRY(fr.CheckUnknown());
  json json_schema = {{"name", name}, {"schema", *schema}};
  if (!description.empty()) json_schema["description"] = description;
  (*chat)["response_format"] = json{{"type", "json_schema"}, {"json_schema", json_schema}};
  return std::nullopt;
}

// reasoning: {"effort", "summary"} -> the template's enable_thinking (Qwen3's switch): effort
// "none" or "minimal" turns thinking off, any other effort on; absent leaves the template's
// default. The summary setting is accepted; the reasoning item carries the whole text.
MaybeApiError TranslateReasoning(FieldReader& r, json* chat, json* echo) {
  const json* reasoning = nullptr;
  EMBER_DIALECT_TRY(r.Object("reasoning", &reasoning));
  if (reasoning == nullptr) return std::nullopt;
  FieldReader rr(*reasoning, "reasoning");
  std::string effort, summary, generate_summary;
  EMBER_DIALECT_TRY(rr.String("effort", &effort));
  EMBER_DIALECT_TRY(rr.String("summary", &summary));
  EMBER_DIALECT_TRY(rr.String("generate_summary", &generate_summary));
  EMBER_DIALECT_TRY(rr.CheckUnknown());
  if (!effort.empty()) {
    static const char* kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    bool known = false;
    for (const char* e : kEfforts) known |= effort == e;
    if (!known)
      return InvalidRequest(
          "reasoning.effort: must be none, minimal, low, medium, high or xhigh, "
          "got '" +
              effort + "'",
          "reasoning.effort");
    (*chat)["chat_template_kwargs"] =
        json{{"enable_thinking", effort != "none" && effort != "minimal"}};
  }
  (*echo)["reasoning"] = {{"effort", effort.empty() ? json(nullptr) : json(effort)},
                          {"summary", summary.empty() ? json(nullptr) : json(summary)}};
  return std::nullopt;
}

// Fields of a stateful or background API that this stateless server refuses by name unless they
// hold their "off" value; `store` is accepted (nothing is stored; the response says store: false).
MaybeApiError RefuseStatefulFields(FieldReader& r) {
  for (const char* name : {"previous_response_id", "conversation", "prompt"}) {
    if (r.Get(name) != nullptr)
      return InvalidRequest(std::string(name) +
                                ": not supported: this server is stateless (it "
                                "stores no responses, conversations or prompts); send the whole "
                                "conversation as input items",
                            name, "unsupported_parameter");
  }
  std::optional<bool> background, store;
  EMBER_DIALECT_TRY(r.Bool("background", &background));
  if (background.value_or(false))
    return InvalidRequest("background: not supported by this server (responses are not stored)",
                          "background", "unsupported_value");
  EMBER_DIALECT_TRY(r.Bool("store", &store));
  std::string truncation;
  EMBER_DIALECT_TRY(r.String("truncation", &truncation));
  if (!truncation.empty() && truncation != "disabled")
    return InvalidRequest(
        "truncation: only 'disabled' is supported (a prompt past the context is "
        "a 400)",
        "truncation", "unsupported_value");
  const json* include = nullptr;
  EMBER_DIALECT_TRY(r.Array("include", &include));
  if (include != nullptr && !include->empty())
    return InvalidRequest("include[0]: no additional output data is available from this server",
                          "include[0]", "unsupported_value");
  return std::nullopt;
}

// Sampling and length: max_output_tokens -> max_tokens; temperature, top_p as named.
MaybeApiError TranslateSampling(FieldReader& r, json* chat, json* echo) {
  std::optional<int64_t> max_output_tokens;
  EMBER_DIALECT_TRY(r.Int("max_output_tokens", 1, INT32_MAX, &max_output_tokens));
  if (max_output_tokens) {
    (*chat)["max_tokens"] = *max_output_tokens;
    (*echo)["max_output_tokens"] = *max_output_tokens;
  }
  for (const char* name : {"temperature", "top_p"}) {
    if (const json* v = r.Get(name)) {
      if (!v->is_number()) return FieldTypeError(name, "a number", *v);
      (*chat)[name] = *v;
      (*echo)[name] = *v;
    }
  }
  std::optional<bool> parallel, stream;
  EMBER_DIALECT_TRY(r.Bool("parallel_tool_calls", &parallel));
  if (parallel) {
    (*chat)["parallel_tool_calls"] = *parallel;
    (*echo)["parallel_tool_calls"] = *parallel;
  }
  EMBER_DIALECT_TRY(r.Bool("stream", &stream));
  if (stream.value_or(false)) (*chat)["stream"] = true;
  return std::nullopt;
}

nlohmann::json DefaultEcho() {
  return {{"instructions", nullptr},
          {"max_output_tokens", nullptr},
          {"metadata", json::object()},
          {"parallel_tool_calls", true},
          {"previous_response_id", nullptr},
          {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
          {"store", false},
          {"temperature", nullptr},
          {"text", {{"format", {{"type", "text"}}}}},
          {"tool_choice", "auto"},
          {"tools", json::array()},
          {"top_p", nullptr},
          {"truncation", "disabled"},
          {"user", nullptr},
          {"background", false}};
}

}  // namespace

std::variant<ResponsesTranslation, ApiError> TranslateResponsesRequest(const RequestJson& body) {
  if (!body.is_object()) return FieldTypeError("body", "a JSON object", body);
  FieldReader r(body, "");
  json chat = json::object();
  json echo = DefaultEcho();
  std::string model, instructions, user;
  EMBER_DIALECT_TRY(r.String("model", &model));
  if (!model.empty()) chat["model"] = model;
  EMBER_DIALECT_TRY(RefuseStatefulFields(r));
  ChatMessageList messages;
  EMBER_DIALECT_TRY(r.String("instructions", &instructions));
  if (!instructions.empty()) {
    messages.Push(json{{"role", "system"}, {"content", instructions}}, "instructions");
    echo["instructions"] = instructions;
  }
  const json* input = nullptr;
  EMBER_DIALECT_TRY(r.Required("input", &input));
  if (input->is_string()) {
    messages.Push(json{{"role", "user"}, {"content", *input}}, "input");
  } else if (input->is_array()) {
    InputItems items(&messages);
    for (size_t i = 0; i < input->size(); ++i)
      EMBER_DIALECT_TRY(items.Item((*input)[i], ItemPath("input", i)));
  } else {
    return FieldTypeError("input", "a string or an array of input items", *input);
  }
  if (messages.list.empty()) return InvalidRequest("input: must not be empty", "input");
  chat["messages"] = std::move(messages.list);
  EMBER_DIALECT_TRY(TranslateSampling(r, &chat, &echo));
  EMBER_DIALECT_TRY(TranslateTools(r, &chat, &echo));
  EMBER_DIALECT_TRY(TranslateToolChoice(r, &chat, &echo));
  EMBER_DIALECT_TRY(TranslateText(r, &chat, &echo));
  EMBER_DIALECT_TRY(TranslateReasoning(r, &chat, &echo));
  const json* metadata = nullptr;
  EMBER_DIALECT_TRY(r.Object("metadata", &metadata));
  if (metadata != nullptr) echo["metadata"] = *metadata;  // returned as given, not used
  EMBER_DIALECT_TRY(r.String("user", &user));
  if (!user.empty()) echo["user"] = user;
  EMBER_DIALECT_TRY(PassCacheSalt(r, &chat));
  EMBER_DIALECT_TRY(r.CheckUnknown());
  return ResponsesTranslation{std::move(chat), std::move(messages.paths), nlohmann::json(echo)};
}

ApiError WithResponsesFieldNames(ApiError error, const std::vector<std::string>& message_paths) {
  if (error.param.empty()) return error;
  const std::string& path = error.param;
  std::optional<std::string> renamed;
  for (size_t k = 0; k < message_paths.size() && !renamed; ++k)
    renamed = RenamedPath(path, ItemPath("messages", k), message_paths[k]);
  if (!renamed) renamed = RenamedPath(path, "max_tokens", "max_output_tokens");
  if (!renamed) renamed = RenamedPath(path, "max_completion_tokens", "max_output_tokens");
  if (!renamed) renamed = RenamedPath(path, "response_format.json_schema", "text.format");
  if (!renamed) renamed = RenamedPath(path, "response_format", "text.format");
  if (!renamed) renamed = RenamedPath(path, "tool_choice.function.name", "tool_choice.name");
  if (!renamed) renamed = RenamedPath(path, "chat_template_kwargs", "reasoning");
  if (!renamed && path.rfind("tools[", 0) == 0) {
    const std::string tool = path.substr(0, path.find(']') + 1);
    renamed = RenamedPath(path, tool + ".function", tool);
  }
  if (!renamed) return error;
  if (error.message.rfind(path, 0) == 0)
    error.message = *renamed + error.message.substr(path.size());
  error.param = *renamed;
  return error;
}

// ---- output ----

namespace {

using out_json = nlohmann::json;

// resp_ / msg_ / rs_ / fc_ + the chat ids' 24 hex digits.
std::string NewId(const char* prefix) {
  const std::string call = NewToolCallId();
  return prefix + call.substr(call.find('_') + 1);
}

out_json OutputTextPart(const std::string& text) {
  return {{"type", "output_text"},
          {"text", text},
          {"annotations", out_json::array()},
          {"logprobs", out_json::array()}};
}

out_json MessageItem(const std::string& id, const std::string& status, const std::string& text,
                     bool with_part) {
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", with_part ? out_json::array({OutputTextPart(text)}) : out_json::array()}};
}

out_json ReasoningItem(const std::string& id, const std::string& text) {
  out_json content = out_json::array();
  if (!text.empty()) content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return {{"type", "reasoning"}, {"id", id}, {"summary", out_json::array()}, {"content", content}};
}

out_json FunctionCallItem(const out_json& call, const std::string& status,
                          const std::string& arguments) {
  return {{"type", "function_call"},
          {"id", NewId("fc_")},
          {"call_id", StringField(call, "id")},
          {"name", StringField(call["function"], "name")},
          {"arguments", arguments},
          {"status", status}};
}

out_json UsageJsonOf(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", u.jump_forward
                                        ? out_json{{"reasoning_tokens", 0},
                                                   {"forced_tokens", u.forced_tokens}}
                                        : out_json{{"reasoning_tokens", 0}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

ResponsesOutput::ResponsesOutput(std::string model, nlohmann::json echo)
    : model_(std::move(model)), echo_(std::move(echo)), id_(NewId("resp_")) {
  created_at_ = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
}

out_json ResponsesOutput::ResponseJson(const std::string& status, const Usage* usage) const {
  out_json body = {{"id", id_},        {"object", "response"}, {"created_at", created_at_},
                   {"status", status}, {"error", nullptr},     {"incomplete_details", nullptr},
                   {"model", model_},  {"output", items_}};
  if (status == "incomplete") body["incomplete_details"] = {{"reason", "max_output_tokens"}};
  for (auto it = echo_.begin(); it != echo_.end(); ++it) body[it.key()] = it.value();
  body["usage"] = usage != nullptr ? UsageJsonOf(*usage) : out_json(nullptr);
  return body;
}

out_json ResponsesOutput::Body(const out_json& chat, const std::string& /*stop_string*/) {
  const out_json& choice = chat.at("choices").at(0);
  const out_json& message = choice.at("message");
  finish_reason_ = StringField(choice, "finish_reason");
  const std::string item_status = incomplete() ? "incomplete" : "completed";
  const std::string reasoning = StringField(message, "reasoning_content");
  if (!reasoning.empty()) items_.push_back(ReasoningItem(NewId("rs_"), reasoning));
  const std::string text = StringField(message, "content");
  const bool has_calls = message.contains("tool_calls") && !message["tool_calls"].empty();
  if (!text.empty() || !has_calls)
    items_.push_back(MessageItem(NewId("msg_"), item_status, text, true));
  if (has_calls) {
    for (const out_json& call : message["tool_calls"])
      items_.push_back(
          FunctionCallItem(call, "completed", StringField(call["function"], "arguments")));
  }
  const Usage usage = UsageFromJson(chat.at("usage"));
  return ResponseJson(incomplete() ? "incomplete" : "completed", &usage);
}

void ResponsesOutput::Emit(const char* type, out_json data, std::string* out) {
  data["type"] = type;
  data["sequence_number"] = sequence_number_++;
  *out += SseNamedEvent(type, data);
}

void ResponsesOutput::Begin(const Usage& /*usage*/, std::string* out) {
  Emit("response.created", {{"response", ResponseJson("in_progress", nullptr)}}, out);
  Emit("response.in_progress", {{"response", ResponseJson("in_progress", nullptr)}}, out);
}

void ResponsesOutput::OpenItem(Open kind, std::string* out) {
  if (open_ == kind) return;
  CloseItem(out);
  open_ = kind;
  open_text_.clear();
  const int64_t index = static_cast<int64_t>(items_.size());
  if (kind == Open::kReasoning) {
    items_.push_back(ReasoningItem(NewId("rs_"), ""));
    Emit("response.output_item.added", {{"output_index", index}, {"item", items_.back()}}, out);
    return;
  }
  items_.push_back(MessageItem(NewId("msg_"), "in_progress", "", false));
  Emit("response.output_item.added", {{"output_index", index}, {"item", items_.back()}}, out);
  Emit("response.content_part.added",
       {{"item_id", items_.back()["id"]},
        {"output_index", index},
        {"content_index", 0},
        {"part", OutputTextPart("")}},
       out);
}

void ResponsesOutput::CloseItem(std::string* out) {
  if (open_ == Open::kNone) return;
  const int64_t index = static_cast<int64_t>(items_.size()) - 1;
  out_json& item = items_.back();
  const out_json item_id = item["id"];
  if (open_ == Open::kReasoning) {
    Emit(
        "response.reasoning_text.done",
        {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"text", open_text_}},
        out);
    item = ReasoningItem(item_id.get<std::string>(), open_text_);
  } else {
    Emit("response.output_text.done",
         {{"item_id", item_id},
          {"output_index", index},
          {"content_index", 0},
          {"text", open_text_},
          {"logprobs", out_json::array()}},
         out);
    Emit("response.content_part.done",
         {{"item_id", item_id},
          {"output_index", index},
          {"content_index", 0},
          {"part", OutputTextPart(open_text_)}},
         out);
    item = MessageItem(item_id.get<std::string>(), incomplete() ? "incomplete" : "completed",
                       open_text_, true);
  }
  Emit("response.output_item.done", {{"output_index", index}, {"item", item}}, out);
  open_ = Open::kNone;
}

// A call arrives whole: its item is added, its arguments sent in one delta, and it is done.
void ResponsesOutput::FunctionCall(const out_json& call, std::string* out) {
  CloseItem(out);
  const int64_t index = static_cast<int64_t>(items_.size());
  const std::string arguments = StringField(call["function"], "arguments");
  items_.push_back(FunctionCallItem(call, "in_progress", ""));
  const out_json item_id = items_.back()["id"];
  Emit("response.output_item.added", {{"output_index", index}, {"item", items_.back()}}, out);
  Emit("response.function_call_arguments.delta",
       {{"item_id", item_id}, {"output_index", index}, {"delta", arguments}}, out);
  Emit("response.function_call_arguments.done",
       {{"item_id", item_id},
        {"output_index", index},
        {"arguments", arguments},
        {"name", items_.back()["name"]}},
       out);
  items_.back()["arguments"] = arguments;
  items_.back()["status"] = "completed";
  Emit("response.output_item.done", {{"output_index", index}, {"item", items_.back()}}, out);
}

void ResponsesOutput::Chunk(const out_json& chunk, std::string* out) {
  if (!chunk.contains("choices") || chunk["choices"].empty()) return;
  const out_json& choice = chunk["choices"][0];
  const out_json delta = choice.value("delta", out_json::object());
  if (const std::string finish = StringField(choice, "finish_reason"); !finish.empty())
    finish_reason_ = finish;
  auto text_delta = [&](Open kind, const std::string& text, const char* event) {
    if (text.empty()) return;
    OpenItem(kind, out);
    open_text_ += text;
    out_json data = {{"item_id", items_.back()["id"]},
                     {"output_index", static_cast<int64_t>(items_.size()) - 1},
                     {"content_index", 0},
                     {"delta", text}};
    if (kind == Open::kMessage) data["logprobs"] = out_json::array();
    Emit(event, std::move(data), out);
  };
  text_delta(Open::kReasoning, StringField(delta, "reasoning_content"),
             "response.reasoning_text.delta");
  text_delta(Open::kMessage, StringField(delta, "content"), "response.output_text.delta");
  if (delta.contains("tool_calls"))
    for (const out_json& call : delta["tool_calls"]) FunctionCall(call, out);
}

void ResponsesOutput::End(const Usage& usage, const std::string& /*stop_string*/,
                          std::string* out) {
  // A reply with no text and no call still has its (empty) message, as the body does.
  bool answered = false;
  for (const out_json& item : items_) answered |= item["type"] != "reasoning";
  if (!answered) OpenItem(Open::kMessage, out);
  CloseItem(out);
  const std::string status = incomplete() ? "incomplete" : "completed";
  Emit(incomplete() ? "response.incomplete" : "response.completed",
       {{"response", ResponseJson(status, &usage)}}, out);
}

void ResponsesOutput::Fail(const ApiError& error, std::string* out) {
  Emit("error",
       {{"code", error.code.empty() ? out_json(nullptr) : out_json(error.code)},
        {"message", error.message},
        {"param", error.param.empty() ? out_json(nullptr) : out_json(error.param)}},
       out);
}

}  // namespace ember::serve
