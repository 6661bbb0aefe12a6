#include "serve/request_builder.h"

#include <algorithm>

#include "engine/engine.h"
#include "sampling/json_schema.h"
#include "sampling/tool_call_constraint.h"
#include "serve/harmony.h"
#include "serve/reasoning.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace ember::serve {

namespace {

std::optional<ApiError> CheckModelName(const ServedModel& model, const CommonParams& p) {
  if (p.model.empty() || p.model == model.name) return std::nullopt;
  return ApiError{404, "The model '" + p.model + "' does not exist; this server serves '" +
                           model.name + "'",
                  "invalid_request_error", "model", "model_not_found"};
}

SamplingParams ToSampling(const ServedModel& model, const CommonParams& p) {
  const GenerationDefaults& d = model.defaults;
  SamplingParams s;
  s.temperature = p.temperature.value_or(d.temperature.value_or(1.0f));
  s.top_p = p.top_p.value_or(d.top_p.value_or(1.0f));
  s.top_k = p.top_k.value_or(d.top_k.value_or(0));
  s.min_p = p.min_p.value_or(d.min_p.value_or(0.0f));
  s.repetition_penalty = p.repetition_penalty.value_or(d.repetition_penalty.value_or(1.0f));
  s.presence_penalty = p.presence_penalty;
  s.frequency_penalty = p.frequency_penalty;
  s.logit_bias = p.logit_bias;
  s.seed = p.seed;
  s.top_logprobs = p.top_logprobs;
  s.min_tokens = p.min_tokens;
  return s;
}

using ordered = nlohmann::ordered_json;

// The request text parsed in the client's key order (discarded, not an object, when there is
// none): parsed once per request and read wherever key order matters.
ordered ParseOrdered(std::string_view raw_body) {
  if (raw_body.empty()) return ordered();
  return ordered::parse(raw_body, nullptr, /*allow_exceptions=*/false);
}

// response_format's constraint (null for text): JSON mode, or the compiled JSON schema (taken
// from the raw body when there is one, so that properties keep the client's order).
using Constraint = std::shared_ptr<const TokenConstraint>;
std::variant<Constraint, ApiError> OutputConstraint(const ServedModel& model, const CommonParams& p,
                                                    const nlohmann::json& body,
                                                    const ordered& raw) {
  if (!p.json_object && !p.json_schema) return Constraint();
  if (model.token_texts == nullptr) {
    return InvalidRequest("response_format: structured output is not available for this model: "
                          "no token of its vocabulary can start a JSON object",
                          "response_format", "unsupported_value");
  }
  if (p.json_object) return Constraint(std::make_shared<JsonObjectConstraint>(model.token_texts));
  const std::string path = "response_format.json_schema.schema";
  const ordered schema =
      raw.is_object() && raw.contains("response_format")
          ? raw["response_format"]["json_schema"]["schema"]
          : ordered::parse(body["response_format"]["json_schema"]["schema"].dump());
  auto compiled = CompileJsonSchema(schema, path);
  if (!compiled.ok()) return InvalidRequest(compiled.message(), path, "unsupported_value");
  return Constraint(MakeJsonSchemaConstraint(model.token_texts, std::move(*compiled)));
}

// Fills max_tokens and checks the prompt against the context. `prompt_field` names the field
// that carried the prompt, for the error.
std::optional<ApiError> FinishRequest(const ServedModel& model, const CommonParams& p,
                                      Endpoint endpoint, const std::string& prompt_field,
                                      const Constraint& constraint, GenerationRequest* r) {
  const int64_t prompt_len = static_cast<int64_t>(r->prompt_ids.size());
  if (prompt_len == 0) return InvalidRequest(prompt_field + ": the prompt is empty", prompt_field);
  const int64_t room = int64_t{model.context_length} - prompt_len;
  // A default max_tokens must also fit the KV cache, or every request without one would fail.
  const int64_t kv_room =
      model.engine != nullptr ? model.engine->kv_capacity_tokens() - prompt_len : room;
  const bool prompt_only = p.max_tokens == 0;  // echo with max_tokens 0: nothing to generate
  if (room < (prompt_only ? 0 : 1)) {
    return InvalidRequest("This model's maximum context length is " +
                              std::to_string(model.context_length) +
                              " tokens, but the prompt has " + std::to_string(prompt_len) +
                              (prompt_only ? " tokens" : " tokens (no room to generate)"),
                          prompt_field, "context_length_exceeded");
  }
  int64_t max_tokens;
  if (p.max_tokens) {
    max_tokens = *p.max_tokens;
    if (prompt_len + max_tokens > model.context_length) {
      return InvalidRequest(
          "This model's maximum context length is " + std::to_string(model.context_length) +
              " tokens. However, you requested " + std::to_string(prompt_len + max_tokens) +
              " tokens (" + std::to_string(prompt_len) + " in the prompt, " +
              std::to_string(max_tokens) + " for the completion). Please reduce the prompt or "
              "max_tokens.",
          "max_tokens", "context_length_exceeded");
    }
  } else if (model.defaults.max_new_tokens) {
    max_tokens = std::min<int64_t>(*model.defaults.max_new_tokens, room);
  } else {
    // OpenAI's legacy completions default is 16 tokens; chat runs to the end of the context.
    max_tokens = endpoint == Endpoint::kCompletion ? std::min<int64_t>(16, room) : room;
  }
  if (!p.max_tokens && kv_room >= 1) max_tokens = std::min(max_tokens, kv_room);
  r->max_tokens = static_cast<int32_t>(max_tokens);
  // (A max_tokens given in the request was checked against min_tokens by the schema; a default
  // one is cut to the room left, which min_tokens must then fit too.)
  if (p.min_tokens > max_tokens) {
    return InvalidRequest("min_tokens: " + std::to_string(p.min_tokens) +
                              " exceeds the tokens this request may generate (" +
                              std::to_string(max_tokens) + ")",
                          "min_tokens");
  }
  r->ignore_eos = p.ignore_eos;
  r->constraint = constraint;
  r->sampling = ToSampling(model, p);
  r->n = p.n;
  r->prompt_logprobs = p.prompt_logprobs;
  Status st = r->sampling.Validate(model.vocab_size);
  if (!st.ok()) {
    const std::string& m = st.message();
    return InvalidRequest(m, m.substr(0, m.find(':')));
  }
  return std::nullopt;
}

PreparedRequest Skeleton(Endpoint endpoint, const CommonParams& p) {
  PreparedRequest out;
  out.endpoint = endpoint;
  out.stop = p.stop;
  out.n = p.n;
  out.stream = p.stream;
  out.include_usage = p.include_usage;
  out.top_logprobs = p.top_logprobs;
  out.prompt_logprobs = p.prompt_logprobs;
  return out;
}

// Renders with JSON objects in the client's key order, as transformers does (Python dicts keep
// insertion order and `tojson` prints it): tool schemas and tool-call arguments come from an
// order-preserving parse of the raw body. The validated (sorted) request gives everything else.
Result<std::string> RenderOrdered(const ServedModel& model, const ChatRequest& req,
                                  const ordered& raw) {
  if (!raw.is_object()) {
    return model.chat_template->Render(req.messages, req.tools, /*add_generation_prompt=*/true,
                                       req.chat_template_kwargs);
  }
  ordered messages = ordered::parse(req.messages.dump());
  const ordered& raw_messages = raw["messages"];
  for (size_t i = 0; i < messages.size() && i < raw_messages.size(); ++i) {
    if (messages[i].contains("tool_calls")) messages[i]["tool_calls"] = raw_messages[i]["tool_calls"];
  }
  ordered tools = req.tools.is_null() ? ordered(nullptr) : raw["tools"];
  ordered kwargs = raw.contains("chat_template_kwargs") && raw["chat_template_kwargs"].is_object()
                       ? raw["chat_template_kwargs"]
                       : ordered::object();
  return model.chat_template->Render(messages, tools, /*add_generation_prompt=*/true, kwargs);
}

// Tool calls: which format to parse, and for a forced call (tool_choice "required" or a named
// function) the constraint that makes the sample one call in that format. A called function's
// arguments follow its `parameters` schema when that compiles (json_schema.h); when it does not,
// a function marked `strict` is a 400 and any other gets any JSON object (as OpenAI's non-strict
// functions, the schema is then only a hint). `raw` gives the schemas in the client's order.
std::optional<ApiError> ApplyToolChoice(const ServedModel& model, const ChatRequest& req,
                                        const ordered& raw, PreparedRequest* out) {
  if (req.tools.is_null()) return std::nullopt;  // no tools, or tool_choice "none"
  out->tool_format = model.tool_format;
  out->parallel_tool_calls = req.parallel_tool_calls;
  if (req.tool_choice == ToolChoice::kAuto) return std::nullopt;
  if (model.tool_format == ToolCallFormat::kNone) {
    return InvalidRequest("tool_choice: forcing a tool call needs the model's tool-call format, "
                          "and this model's chat template uses none that the server knows (start "
                          "it with --tool-call-parser hermes|llama3_json)",
                          "tool_choice", "unsupported_value");
  }
  if (model.tool_format == ToolCallFormat::kHarmony) {
    return InvalidRequest("tool_choice: forcing a tool call is not supported for harmony models "
                          "(gpt-oss): their calls start with special tokens that the output "
                          "constraint cannot write; use tool_choice \"auto\"",
                          "tool_choice", "unsupported_value");
  }
  if (req.params.json_object || req.params.json_schema) {
    return InvalidRequest("response_format: structured output cannot be combined with a forced "
                          "tool call (tool_choice)",
                          "response_format");
  }
  if (model.token_texts == nullptr) {
    return InvalidRequest("tool_choice: this model's vocabulary cannot spell a JSON object, so a "
                          "tool call cannot be forced",
                          "tool_choice", "unsupported_value");
  }
  const ordered tools = raw.is_object() && raw.contains("tools") ? raw["tools"]
                                                                 : ordered::parse(req.tools.dump());
  ToolCallPattern pattern;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered& function = tools[i]["function"];
    const std::string name = function["name"].get<std::string>();
    if (req.tool_choice == ToolChoice::kFunction && name != req.tool_choice_name) continue;
    ToolCallPattern::Call call{ForcedCallHead(model.tool_format, name), nullptr};
    const bool duplicate = std::any_of(pattern.calls.begin(), pattern.calls.end(),
                                       [&](const auto& c) { return c.head == call.head; });
    if (duplicate) continue;  // the first definition of a name wins
    if (function.contains("parameters")) {
      const std::string path = "tools[" + std::to_string(i) + "].function.parameters";
      auto compiled = CompileJsonSchema(function["parameters"], path);
      if (compiled.ok()) {
        call.arguments = std::move(*compiled);
      } else if (function.value("strict", false)) {
        return InvalidRequest(compiled.message() + " (the function is strict, and tool_choice "
                                                   "forces a call to it)",
                              path, "unsupported_value");
      }
    }
    pattern.calls.push_back(std::move(call));
  }
  pattern.tail = ForcedCallTail(model.tool_format);
  std::shared_ptr<TokenConstraint> constraint =
      MakeToolCallConstraint(model.token_texts, std::move(pattern));
  for (PreparedPrompt& p : out->prompts) p.request.constraint = constraint;
  return std::nullopt;
}

}  // namespace

std::shared_ptr<const TokenTexts> JsonModeTexts(const Tokenizer& tokenizer, int32_t vocab_size) {
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(vocab_size));
  const int32_t known = std::min(vocab_size, tokenizer.vocab_size());
  for (int32_t id = 0; id < known; ++id) bytes[static_cast<size_t>(id)] = tokenizer.TokenBytes(id);
  std::shared_ptr<const TokenTexts> texts = TokenTexts::Build(std::move(bytes));
  std::vector<uint8_t> allowed;
  if (JsonObjectConstraint(texts).Allowed(allowed) == 0) return nullptr;
  return texts;
}

SchemaLimits LimitsFor(const ServedModel& model) {
  SchemaLimits limits;
  limits.vocab_size = model.vocab_size;
  limits.max_n = model.max_n;
  return limits;
}

Prepared PrepareChat(const ServedModel& model, const nlohmann::json& body,
                     std::string_view raw_body) {
  ChatRequest req;
  if (auto err = ParseChatRequest(body, LimitsFor(model), &req)) return *err;
  if (auto err = CheckModelName(model, req.params)) return *err;
  if (model.chat_template == nullptr || !model.chat_template->has_template()) {
    return InvalidRequest("The model '" + model.name + "' has no chat template, so "
                          "/v1/chat/completions is unavailable; use /v1/completions, or start the "
                          "server with --chat-template FILE",
                          "messages", "no_chat_template");
  }
  const ordered raw = ParseOrdered(raw_body);
  Result<std::string> text = RenderOrdered(model, req, raw);
  if (!text.ok()) {
    return InvalidRequest("the chat template failed to render these messages: " + text.message(),
                          "messages", "template_error");
  }
  PreparedRequest out = Skeleton(Endpoint::kChat, req.params);
  PreparedPrompt prompt;
  // The rendered template already holds the special tokens (BOS, role markers).
  prompt.request.prompt_ids = model.tokenizer->Encode(*text, /*add_special_tokens=*/false);
  auto constraint = OutputConstraint(model, req.params, body, raw);
  if (auto* err = std::get_if<ApiError>(&constraint)) return *err;
  if (auto err = FinishRequest(model, req.params, Endpoint::kChat, "messages",
                               std::get<Constraint>(constraint), &prompt.request))
    return *err;
  out.prompts.push_back(std::move(prompt));
  out.reasoning = model.reasoning_format != ReasoningFormat::kNone;
  out.starts_in_reasoning =
      model.reasoning_format == ReasoningFormat::kThink && PromptEndsInThinkBlock(*text);
  out.harmony = model.reasoning_format == ReasoningFormat::kHarmony ||
                model.tool_format == ToolCallFormat::kHarmony;
  if (out.harmony) out.harmony_last_message = HarmonyLastMessage(*text);
  if (auto err = ApplyToolChoice(model, req, raw, &out)) return *err;
  return out;
}

Prepared PrepareCompletion(const ServedModel& model, const nlohmann::json& body,
                           std::string_view raw_body) {
  CompletionRequest req;
  if (auto err = ParseCompletionRequest(body, LimitsFor(model), &req)) return *err;
  if (auto err = CheckModelName(model, req.params)) return *err;
  PreparedRequest out = Skeleton(Endpoint::kCompletion, req.params);
  out.echo_logprobs = req.echo && req.params.top_logprobs >= 0;
  // (Only a JSON schema needs the key order here.)
  auto constraint = OutputConstraint(model, req.params, body,
                                     req.params.json_schema ? ParseOrdered(raw_body) : ordered());
  if (auto* err = std::get_if<ApiError>(&constraint)) return *err;
  for (PromptInput& in : req.prompts) {
    PreparedPrompt prompt;
    if (in.is_token_ids) {
      prompt.request.prompt_ids = std::move(in.token_ids);
      if (req.echo)
        prompt.echo_text = model.tokenizer->Decode(prompt.request.prompt_ids, false);
    } else {
      prompt.request.prompt_ids = model.tokenizer->Encode(in.text, /*add_special_tokens=*/true);
      if (req.echo) prompt.echo_text = in.text;
    }
    if (auto err =
            FinishRequest(model, req.params, Endpoint::kCompletion, "prompt",
                          std::get<Constraint>(constraint), &prompt.request))
      return *err;
    // The echo's logprobs need the prompt's (as many alternatives as either field asks).
    if (out.echo_logprobs)
      prompt.request.prompt_logprobs =
          std::max(req.params.top_logprobs, req.params.prompt_logprobs);
    out.prompts.push_back(std::move(prompt));
  }
  return out;
}

}  // namespace ember::serve
