// RequestBuilder: turns a request body (parsed once, in the client's key order) into what the
// engine runs — validates it (openai_schema.h), renders the chat template, tokenizes, and resolves
// the sampling fields, max_tokens and the context check through the one resolver
// (sampling/request_sampling.h). Serves /v1/chat/completions, /v1/completions and `ember batch`
// lines. Stateless apart from the borrowed ServedModel; safe to call from many HTTP threads at
// once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "model/model.h"
#include "sampling/gbnf_constraint.h"
#include "sampling/json_constraint.h"
#include "sampling/request_sampling.h"
#include "serve/api_error.h"
#include "serve/embedding_config.h"
#include "serve/openai_schema.h"
#include "serve/reasoning.h"
#include "serve/tool_calls.h"

namespace ember {
class Tokenizer;
class ChatTemplate;
class Engine;
}  // namespace ember

namespace ember::serve {

// Everything the server knows about the model it serves. Borrowed pointers outlive the server.
struct ServedModel {
  std::string name;                            // the id clients pass as `model`
  // The LoRA adapter of requests that name none (--adapter; "" the base model).
  std::string default_adapter;
  const Tokenizer* tokenizer = nullptr;  // null (batch only): prompts and stops need token ids
  const ChatTemplate* chat_template = nullptr;  // null or !has_template(): chat answers 400
  Engine* engine = nullptr;
  GenerationDefaults defaults;
  int32_t context_length = 0;
  int32_t vocab_size = 0;
  int32_t max_n = 16;
  // Structured output (response_format, grammars, forced tool calls): every token id's text;
  // null without a tokenizer (such requests are then refused). VocabularyTexts() builds it; a
  // constraint that no token of the vocabulary can start is refused per request
  // (CheckConstraintCanStart), so a vocabulary without `{` still serves regexes and grammars.
  std::shared_ptr<const TokenTexts> token_texts;
  // GBNF grammars compiled for token_texts, shared by the requests that send the same grammar
  // (null: each request compiles its own).
  std::shared_ptr<GbnfCache> grammars;
  // DRY's default sequence breakers as token ids (DryBreakerIdsOf), computed once per model; null
  // without a tokenizer. Requests that keep the defaults share it.
  std::shared_ptr<const std::vector<int32_t>> default_dry_breaker_ids;
  // How the model writes tool calls and reasoning (ChooseOutputParsers: from its chat template
  // or the flags). Tool calls kNone: they stay in the content and forcing one (tool_choice) is
  // refused. Reasoning kNone: no reasoning_content. Harmony in either: one HarmonyParser does
  // both halves (never together with another parser).
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  ReasoningFormat reasoning_format = ReasoningFormat::kNone;
  // The token texts client text may not produce as control tokens (ProtectedStringsOf: the
  // special tokens and the template's own markers), computed once at start-up; null: computed
  // for each chat request (never skipped).
  std::shared_ptr<const std::vector<std::string>> protected_strings;
  // How /v1/embeddings pools this model's hidden states (ReadEmbeddingSupport at start-up);
  // unavailable by default.
  EmbeddingSupport embeddings;
};

// ChatTemplate::ProtectedTokenStrings for this tokenizer's special and added tokens.
std::shared_ptr<const std::vector<std::string>> ProtectedStringsOf(const Tokenizer& tokenizer,
                                                                   const ChatTemplate& chat_template);

// DRY's breaker ids (sampling/dry.h) over `tokenizer`'s texts for the model's `vocab_size` ids.
std::vector<int32_t> DryBreakerIdsOf(const Tokenizer& tokenizer, int32_t vocab_size,
                                     std::span<const std::string> breakers);

// The texts structured output needs for `tokenizer`'s ids, over the model's `vocab_size` ids (ids
// past the tokenizer's have no text).
std::shared_ptr<const TokenTexts> VocabularyTexts(const Tokenizer& tokenizer, int32_t vocab_size);

enum class Endpoint { kChat, kCompletion };

// One prompt of a request and the engine request that generates its n samples.
struct PreparedPrompt {
  GenerationRequest request;
  std::string echo_text;  // prepended to every sample's text when `echo` (completions)
};

struct PreparedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::vector<PreparedPrompt> prompts;
  std::vector<std::string> stop;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;
  int32_t top_logprobs = -1;  // -1: no logprobs
  // Completions with echo and logprobs: each choice's logprobs start with its prompt's tokens
  // (top_logprobs alternatives each; the engine request asks for the prompt logprobs).
  bool echo_logprobs = false;
  // vLLM's prompt_logprobs (-1: not asked): returned on each choice (completions) or on the body
  // (chat), as vLLM does.
  int32_t prompt_logprobs = -1;
  // Chat with tools: parse each sample's calls out of its text (kNone: no parsing).
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  bool parallel_tool_calls = true;  // false: a sample ends after its first call
  bool reasoning = false;            // chat: split reasoning_content off (reasoning.h, harmony.h)
  bool starts_in_reasoning = false;  // the prompt ends inside an open <think> block
  // Chat with a harmony model: each sample's text (with harmony's control tokens kept) goes
  // through a HarmonyParser, for reasoning when `reasoning` and for calls when tool_format is
  // kHarmony, instead of the other two parsers. It starts from the prompt's last message.
  bool harmony = false;
  std::string harmony_last_message;  // the prompt from its last <|start|> (HarmonyLastMessage)
};

SchemaLimits LimitsFor(const ServedModel& model);

// generation_config.json's sampling fields, as the resolver takes them.
SamplingDefaults SamplingDefaultsOf(const GenerationDefaults& defaults);
// The sizes of `engine` that a request must fit (TokenLimits).
TokenLimits TokenLimitsOf(const Engine& engine);

using Prepared = std::variant<PreparedRequest, ApiError>;
// `body` in the client's key order: tool schemas, tool-call arguments and chat_template_kwargs
// reach the template, and a response_format JSON schema's properties reach the output, in it.
Prepared PrepareChat(const ServedModel& model, const RequestJson& body);
// `source` kBatchLine: an `ember batch` line (CompletionSource); one prompt.
Prepared PrepareCompletion(const ServedModel& model, const RequestJson& body,
                           CompletionSource source = CompletionSource::kHttpBody);

}  // namespace ember::serve
