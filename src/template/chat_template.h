// ChatTemplate: renders a model's Jinja chat template exactly as transformers'
// apply_chat_template does (jinja2 ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// transformers' tojson/raise_exception/strftime_now). The template is parsed once at Load and is
// immutable afterwards: Render is const and safe to call from many threads at once.
//
// Key order: transformers keeps JSON object key order (Python dicts), and `tojson` prints it. A
// plain nlohmann::json sorts keys, so callers that care (tools schemas) should pass
// nlohmann::ordered_json to the ordered overload.
//
// Client data is bounded and kept in its place: messages, tools and kwargs nesting deeper than
// kMaxInputDepth are refused before any recursion sees them; kwargs may not use a name the render
// itself defines (ReservedTemplateVariables); and RenderPrompt keeps control-token text written
// by the client out of the template's control tokens (client_text.h).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "template/client_text.h"
#include "util/status.h"

namespace ember {

namespace tmpl {
struct Program;
}

// The names a render defines itself: its variables (messages, tools, documents,
// add_generation_prompt, the special tokens), the interpreter's globals (range, namespace,
// raise_exception, strftime_now, ...) and jinja2's reserved names (loop, caller, ...).
const std::vector<std::string>& ReservedTemplateVariables();
// An error naming the first key of `kwargs` (chat_template_kwargs) that is reserved, or when
// kwargs is not an object (null is fine: no kwargs).
Status CheckTemplateKwargs(const nlohmann::json& kwargs);
Status CheckTemplateKwargs(const nlohmann::ordered_json& kwargs);

class ChatTemplate {
 public:
  // messages, tools and kwargs nesting deeper than this (arrays/objects) are refused.
  static constexpr int kMaxInputDepth = 128;

  // Reads DIR/chat_template.jinja if present, else tokenizer_config.json's chat_template (string
  // or list of {name, template}); bos/eos tokens from tokenizer_config.json. A model without a
  // template loads fine and reports has_template() == false.
  static Result<ChatTemplate> Load(const std::string& model_dir);
  // Parses `source` (a syntax error names line:column). An empty bos/eos token is left undefined.
  static Result<ChatTemplate> FromSource(std::string source, std::string bos_token, std::string eos_token);
  // The same with a "tool_use" template beside the default (either may be "", not both): a GGUF
  // file's tokenizer.chat_template and tokenizer.chat_template.tool_use.
  static Result<ChatTemplate> FromSources(std::string default_source, std::string tool_use_source,
                                          std::string bos_token, std::string eos_token);

  bool has_template() const { return default_ != nullptr || tool_use_ != nullptr; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // The source of the template that renders requests with tools ("" without a template): the
  // server reads the model's tool-call syntax from it.
  const std::string& tools_source() const { return tools_source_; }
  // The sources of the default and the "tool_use" templates as the folder gives them ("" for one
  // it lacks): what `ember quantize` writes as tokenizer.chat_template(.tool_use).
  const std::string& default_source() const { return default_source_; }
  const std::string& tool_use_source() const { return tool_use_source_; }

  // messages: JSON array; tools: JSON array or null; extra_kwargs: JSON object (may be empty).
  // raise_exception and runtime errors come back as an error naming line:column.
  Result<std::string> Render(const nlohmann::json& messages, const nlohmann::json& tools,
                             bool add_generation_prompt, const nlohmann::json& extra_kwargs) const;
  Result<std::string> Render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                             bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs) const;

  // The strings to keep out of client text (RenderPrompt's protected_strings): every special
  // token, and the other added tokens that the template writes itself (DeepSeek's <｜User｜>,
  // Qwen3's <tool_call>), except whitespace and those the template looks for inside strings
  // (Qwen3 reads '</think>' and '<tool_response>' out of message content: they stay as sent).
  std::vector<std::string> ProtectedTokenStrings(std::span<const std::string> special_tokens,
                                                 std::span<const std::string> added_tokens) const;

  // Render for the tokenizer: every occurrence of a `protected_strings` entry (the tokenizer's
  // special tokens, Tokenizer::SpecialTokenContents) inside a client string — message fields,
  // tool definitions, kwargs values and keys — is reported in client_spans (encode them with
  // Tokenizer::Encode's no_special_spans); the text is Render's whenever the client wrote none.
  Result<RenderedPrompt> RenderPrompt(const nlohmann::json& messages, const nlohmann::json& tools,
                                      bool add_generation_prompt, const nlohmann::json& extra_kwargs,
                                      std::span<const std::string> protected_strings) const;
  Result<RenderedPrompt> RenderPrompt(const nlohmann::ordered_json& messages,
                                      const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                      const nlohmann::ordered_json& extra_kwargs,
                                      std::span<const std::string> protected_strings) const;

 private:
  // `guard` (may be null) escapes client strings; the text comes back escaped.
  template <typename Json>
  Result<std::string> RenderImpl(const Json& messages, const Json& tools, bool add_generation_prompt,
                                 const Json& extra_kwargs, const ClientTextGuard* guard) const;
  void NoteInspectedLiterals(std::string sources);
  template <typename Json>
  Result<RenderedPrompt> RenderPromptImpl(const Json& messages, const Json& tools,
                                          bool add_generation_prompt, const Json& extra_kwargs,
                                          std::span<const std::string> protected_strings) const;

  std::shared_ptr<const tmpl::Program> default_;   // may be null when only tool_use exists
  std::shared_ptr<const tmpl::Program> tool_use_;  // the "tool_use" named template, if any
  std::string tools_source_;
  std::string default_source_, tool_use_source_;
  std::string bos_token_;
  std::string eos_token_;
  // unk/pad/sep/cls/mask tokens from tokenizer_config.json: transformers passes its whole
  // special_tokens_map to the template.
  std::vector<std::pair<std::string, std::string>> other_special_tokens_;
  // String literals the templates search client strings for (`'</think>' in content`).
  std::vector<std::string> inspected_literals_;
  std::string sources_;  // the text of every parsed template
};

}  // namespace ember
