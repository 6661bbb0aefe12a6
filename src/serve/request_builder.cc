#include "serve/request_builder.h"

#include <algorithm>

#include "engine/engine.h"
#include "sampling/dry.h"
#include "sampling/gbnf_constraint.h"
#include "sampling/json_schema.h"
#include "sampling/regex_constraint.h"
#include "sampling/tool_call_constraint.h"
#include "serve/harmony.h"
#include "serve/reasoning.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace ember::serve {

namespace {

// The LoRA adapter a request runs under ("": the base model): `model` "BASE:NAME" or an
// adapter's own name, else the `adapter` field, else the server's default; "none" is the base.
std::variant<std::string, ApiError> ResolveAdapter(const ServedModel& model,
                                                   const CommonParams& p) {
  const AdapterRegistry* adapters = model.engine != nullptr ? model.engine->adapters() : nullptr;
  std::optional<std::string> named;
  if (!p.model.empty() && p.model != model.name) {
    const std::string prefix = model.name + ":";
    if (p.model.rfind(prefix, 0) == 0) {
      named = p.model.substr(prefix.size());
    } else if (adapters != nullptr && adapters->Find(p.model) != nullptr) {
      named = p.model;
    } else {
      return ApiError{404, "The model '" + p.model + "' does not exist; this server serves '" +
                               model.name + "'",
                      "invalid_request_error", "model", "model_not_found"};
    }
  }
  if (!p.adapter.empty()) {
    if (named && *named != p.adapter)
      return InvalidRequest("adapter: \"" + p.adapter + "\" differs from the model's \"" +
                                *named + "\"",
                            "adapter");
    named = p.adapter;
  }
  const std::string name = named.value_or(model.default_adapter);
  if (name.empty() || name == "none") return std::string();
  if (adapters == nullptr || adapters->Find(name) == nullptr)
    return ApiError{404,
                    "The adapter '" + name + "' does not exist" +
                        (adapters == nullptr ? " (LoRA adapters are off: start with --lora)"
                                             : " (GET /v1/models lists the adapters)"),
                    "invalid_request_error", "adapter", "adapter_not_found"};
  return name;
}

std::optional<ApiError> CheckModelName(const ServedModel& model, const CommonParams& p) {
  auto resolved = ResolveAdapter(model, p);
  if (auto* error = std::get_if<ApiError>(&resolved)) return *error;
  return std::nullopt;
}

// The sizes a request must fit: the served model's, with the engine's KV capacity (the context
// stands in for it without an engine).
TokenLimits LimitsOfServed(const ServedModel& model) {
  const int64_t kv_capacity =
      model.engine != nullptr ? model.engine->kv_capacity_tokens() : model.context_length;
  return TokenLimits{model.vocab_size, model.context_length, kv_capacity};
}

// The structured-output constraint (null for text): JSON mode, a compiled JSON schema (its
// properties in the client's order), a regex or a GBNF grammar over the whole output (ending
// through the model's EOS ids where a match may go on). Errors name the field that asked for it.
using Constraint = std::shared_ptr<const TokenConstraint>;
std::variant<Constraint, ApiError> OutputConstraint(const ServedModel& model,
                                                    const CommonParams& p) {
  if (p.output_field.empty()) return Constraint();
  const std::string& path = p.output_field;
  const std::string field = path.substr(0, path.find('.'));
  if (model.token_texts == nullptr) {
    return InvalidRequest(field + ": structured output needs the model's tokenizer (the texts "
                          "of its tokens), and this model is served without one",
                          field, "unsupported_value");
  }
  Constraint constraint;
  if (p.json_object) {
    constraint = std::make_shared<JsonObjectConstraint>(model.token_texts);
  } else if (p.regex) {
    auto dfa = CompileRegex(*p.regex, RegexMatch::kWhole, path);
    if (!dfa.ok()) return InvalidRequest(dfa.message(), path, "unsupported_value");
    constraint = MakeRegexConstraint(model.token_texts, std::move(*dfa), model.defaults.eos_token_ids);
  } else if (p.grammar) {
    GbnfCache uncached(model.token_texts, model.defaults.eos_token_ids);
    GbnfCache& grammars = model.grammars != nullptr ? *model.grammars : uncached;
    auto made = grammars.Constraint(*p.grammar, path);
    if (!made.ok()) return InvalidRequest(made.message(), path, "unsupported_value");
    constraint = std::move(*made);
  } else {
    auto compiled = CompileJsonSchema(p.json_schema, path);
    if (!compiled.ok()) return InvalidRequest(compiled.message(), path, "unsupported_value");
    constraint = MakeJsonSchemaConstraint(model.token_texts, std::move(*compiled));
  }
  // Refused now, not mid-generation: a constraint no token of this vocabulary can start.
  if (Status st = CheckConstraintCanStart(*constraint, field); !st.ok())
    return InvalidRequest(st.message(), field, "unsupported_value");
  return constraint;
}

// DRY's sequence breakers as token ids (dry.h): the model's cached defaults, else from the token
// texts structured output keeps, else the tokenizer. A model without a tokenizer (`ember batch`)
// cannot match strings to tokens.
std::optional<ApiError> AttachDryBreakers(const ServedModel& model, SamplingParams* params) {
  if (!params->has_dry() || params->dry_sequence_breakers.empty()) return std::nullopt;
  if (model.default_dry_breaker_ids != nullptr &&
      params->dry_sequence_breakers == SamplingParams::DefaultDrySequenceBreakers()) {
    params->dry_breaker_ids = model.default_dry_breaker_ids;
  } else if (model.token_texts != nullptr) {
    const TokenTexts& texts = *model.token_texts;
    ResolveDryBreakers(params, model.vocab_size,
                       [&](int32_t id) -> std::optional<std::string_view> {
                         const auto i = static_cast<size_t>(id);
                         if (i >= texts.bytes.size() || !texts.bytes[i]) return std::nullopt;
                         return *texts.bytes[i];
                       });
  } else if (model.tokenizer != nullptr) {
    params->dry_breaker_ids = std::make_shared<const std::vector<int32_t>>(
        DryBreakerIdsOf(*model.tokenizer, model.vocab_size, params->dry_sequence_breakers));
  } else {
    return InvalidRequest(
        "dry_sequence_breakers: this model has no tokenizer, so breaker strings cannot be matched "
        "to tokens; send an empty list (no breakers) or load a tokenizer",
        "dry_sequence_breakers");
  }
  return std::nullopt;
}

// Resolves sampling and max_tokens (request_sampling.h: the precedence, the validation and the
// context check) for one prompt. `prompt_field` names the field that carried the prompt.
std::optional<ApiError> FinishRequest(const ServedModel& model, const CommonParams& p,
                                      Endpoint endpoint, const std::string& prompt_field,
                                      const Constraint& constraint, GenerationRequest* r) {
  if (r->prompt_ids.empty())
    return InvalidRequest(prompt_field + ": the prompt is empty", prompt_field);
  SamplingContext context;
  context.defaults = SamplingDefaultsOf(model.defaults);
  context.limits = LimitsOfServed(model);
  // OpenAI's legacy completions default is 16 tokens; chat runs to the end of the context.
  if (endpoint == Endpoint::kCompletion) context.fallback_max_tokens = 16;
  context.num_prompt_tokens = static_cast<int64_t>(r->prompt_ids.size());
  context.prompt_field = prompt_field;
  auto resolved = ResolveSampling(p, context);
  if (auto* error = std::get_if<SamplingError>(&resolved)) {
    return InvalidRequest(
        error->message, error->field,
        error->context_length_exceeded ? "context_length_exceeded" : "invalid_value");
  }
  r->sampling = std::move(std::get<ResolvedSampling>(resolved).params);
  r->max_tokens = std::get<ResolvedSampling>(resolved).max_tokens;
  if (auto error = AttachDryBreakers(model, &r->sampling)) return *error;
  r->ignore_eos = p.ignore_eos;
  r->speculate = p.speculative_decoding;
  r->constraint = constraint;
  r->n = p.n;
  r->prompt_logprobs = p.prompt_logprobs;
  r->cache_salt = p.cache_salt;
  auto adapter = ResolveAdapter(model, p);
  if (auto* error = std::get_if<ApiError>(&adapter)) return *error;
  r->adapter = std::get<std::string>(adapter);
  return std::nullopt;
}

// Without a tokenizer (an `ember batch` model folder may have none) a prompt must be token ids,
// and nothing may need text: stop strings, an echo.
std::optional<ApiError> CheckTokenizerNeeds(const ServedModel& model,
                                            const CompletionRequest& req) {
  if (model.tokenizer != nullptr) return std::nullopt;
  for (const PromptInput& in : req.prompts) {
    if (!in.is_token_ids)
      return InvalidRequest("prompt: the model has no tokenizer.json; give the prompt as token ids",
                            "prompt");
  }
  if (!req.params.stop.empty())
    return InvalidRequest("stop: stop strings need the model's tokenizer.json", "stop");
  if (req.echo) return InvalidRequest("echo: needs the model's tokenizer.json", "echo");
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

// Tool calls: which format to parse, and for a forced call (tool_choice "required" or a named
// function) the constraint that makes the sample one call in that format. A called function's
// arguments follow its `parameters` schema when that compiles (json_schema.h); when it does not,
// a function marked `strict` is a 400 and any other gets any JSON object (as OpenAI's non-strict
// functions, the schema is then only a hint).
std::optional<ApiError> ApplyToolChoice(const ServedModel& model, const ChatRequest& req,
                                        PreparedRequest* out) {
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
  if (model.tool_format == ToolCallFormat::kHarmony ||
      model.tool_format == ToolCallFormat::kMistral) {
    return InvalidRequest(
        std::string("tool_choice: forcing a tool call is not supported for ") +
            (model.tool_format == ToolCallFormat::kHarmony ? "harmony models (gpt-oss)"
                                                           : "mistral's tool-call format") +
            ": their calls start with special tokens that the output "
            "constraint cannot write; use tool_choice \"auto\"",
        "tool_choice", "unsupported_value");
  }
  if (!req.params.output_field.empty()) {
    const std::string field = req.params.output_field.substr(0, req.params.output_field.find('.'));
    return InvalidRequest(field + ": structured output cannot be combined with a forced "
                          "tool call (tool_choice)",
                          field);
  }
  if (model.token_texts == nullptr) {
    return InvalidRequest("tool_choice: forcing a tool call needs the model's tokenizer (the "
                          "texts of its tokens), and this model is served without one",
                          "tool_choice", "unsupported_value");
  }
  const RequestJson& tools = req.tools;
  ToolCallPattern pattern;
  for (size_t i = 0; i < tools.size(); ++i) {
    const RequestJson& function = tools[i]["function"];
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
  if (Status st = CheckConstraintCanStart(*constraint, "tool_choice"); !st.ok())
    return InvalidRequest(st.message(), "tool_choice", "unsupported_value");
  for (PreparedPrompt& p : out->prompts) p.request.constraint = constraint;
  return std::nullopt;
}

}  // namespace

std::vector<int32_t> DryBreakerIdsOf(const Tokenizer& tokenizer, int32_t vocab_size,
                                     std::span<const std::string> breakers) {
  std::optional<std::string> text;  // the id's bytes, lent to DryBreakerIds until the next id
  return DryBreakerIds(breakers, vocab_size, [&](int32_t id) -> std::optional<std::string_view> {
    text = id < tokenizer.vocab_size() ? tokenizer.TokenBytes(id) : std::nullopt;
    if (!text) return std::nullopt;
    return *text;
  });
}

std::shared_ptr<const TokenTexts> VocabularyTexts(const Tokenizer& tokenizer, int32_t vocab_size) {
  return TokenTexts::Build(tokenizer.TokenBytesTable(vocab_size));
}

SchemaLimits LimitsFor(const ServedModel& model) {
  SchemaLimits limits;
  limits.vocab_size = model.vocab_size;
  limits.max_n = model.max_n;
  return limits;
}

SamplingDefaults SamplingDefaultsOf(const GenerationDefaults& d) {
  return {.temperature = d.temperature,
          .top_p = d.top_p,
          .min_p = d.min_p,
          .repetition_penalty = d.repetition_penalty,
          .top_k = d.top_k,
          .max_new_tokens = d.max_new_tokens};
}

std::shared_ptr<const std::vector<std::string>> ProtectedStringsOf(const Tokenizer& tokenizer,
                                                                   const ChatTemplate& chat_template) {
  const std::vector<std::string> special = tokenizer.SpecialTokenContents();
  const std::vector<std::string> added = tokenizer.AddedTokenContents();
  return std::make_shared<const std::vector<std::string>>(
      chat_template.ProtectedTokenStrings(special, added));
}

TokenLimits TokenLimitsOf(const Engine& engine) {
  return TokenLimits{engine.vocab_size(), engine.context_length(), engine.kv_capacity_tokens()};
}

Prepared PrepareChat(const ServedModel& model, const RequestJson& body) {
  ChatRequest req;
  if (auto err = ParseChatRequest(body, LimitsFor(model), &req)) return *err;
  if (auto err = CheckModelName(model, req.params)) return *err;
  if (model.chat_template == nullptr || !model.chat_template->has_template()) {
    return InvalidRequest("The model '" + model.name + "' has no chat template, so "
                          "/v1/chat/completions is unavailable; use /v1/completions, or start the "
                          "server with --chat-template FILE",
                          "messages", "no_chat_template");
  }
  // Objects in the client's key order, as transformers renders them (Python dicts keep insertion
  // order and `tojson` prints it). Control-token text inside client strings stays text: the
  // render reports where it landed (client_spans) and the encoder matches no special token there.
  std::shared_ptr<const std::vector<std::string>> protect = model.protected_strings;
  if (protect == nullptr) protect = ProtectedStringsOf(*model.tokenizer, *model.chat_template);
  Result<RenderedPrompt> rendered =
      model.chat_template->RenderPrompt(req.messages, req.tools, /*add_generation_prompt=*/true,
                                        req.chat_template_kwargs, *protect);
  if (!rendered.ok()) {
    return InvalidRequest(
        "the chat template failed to render these messages: " + rendered.message(), "messages",
        "template_error");
  }
  const std::string& text = rendered->text;
  PreparedRequest out = Skeleton(Endpoint::kChat, req.params);
  PreparedPrompt prompt;
  // The rendered template already holds the special tokens (BOS, role markers).
  prompt.request.prompt_ids =
      model.tokenizer->Encode(text, /*add_special_tokens=*/false, rendered->client_spans);
  auto constraint = OutputConstraint(model, req.params);
  if (auto* err = std::get_if<ApiError>(&constraint)) return *err;
  if (auto err = FinishRequest(model, req.params, Endpoint::kChat, "messages",
                               std::get<Constraint>(constraint), &prompt.request))
    return *err;
  out.prompts.push_back(std::move(prompt));
  out.reasoning = model.reasoning_format != ReasoningFormat::kNone;
  out.starts_in_reasoning =
      model.reasoning_format == ReasoningFormat::kThink && PromptEndsInThinkBlock(text);
  out.harmony = model.reasoning_format == ReasoningFormat::kHarmony ||
                model.tool_format == ToolCallFormat::kHarmony;
  if (out.harmony) out.harmony_last_message = HarmonyLastMessage(text);
  if (auto err = ApplyToolChoice(model, req, &out)) return *err;
  return out;
}

Prepared PrepareCompletion(const ServedModel& model, const RequestJson& body,
                           CompletionSource source) {
  CompletionRequest req;
  if (auto err = ParseCompletionRequest(body, LimitsFor(model), &req, source)) return *err;
  if (auto err = CheckModelName(model, req.params)) return *err;
  if (auto err = CheckTokenizerNeeds(model, req)) return *err;
  PreparedRequest out = Skeleton(Endpoint::kCompletion, req.params);
  out.echo_logprobs = req.echo && req.params.top_logprobs >= 0;
  auto constraint = OutputConstraint(model, req.params);
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
