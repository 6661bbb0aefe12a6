// ChatTemplate: renders a model's Jinja chat template exactly as transformers'
// apply_chat_template does (jinja2 ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// transformers' tojson/raise_exception/strftime_now). The template is parsed once at Load and is
// immutable afterwards: Render is const and safe to call from many threads at once.
//
// Key order: transformers keeps JSON object key order (Python dicts), and `tojson` prints it. A
// plain nlohmann::json sorts keys, so callers that care (tools schemas) should pass
// nlohmann::ordered_json to the ordered overload.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace ember {

namespace tmpl {
struct Program;
}

class ChatTemplate {
 public:
  // Reads DIR/chat_template.jinja if present, else tokenizer_config.json's chat_template (string
  // or list of {name, template}); bos/eos tokens from tokenizer_config.json. A model without a
  // template loads fine and reports has_template() == false.
  static Result<ChatTemplate> Load(const std::string& model_dir);
  // Parses `source` (a syntax error names line:column). An empty bos/eos token is left undefined.
  static Result<ChatTemplate> FromSource(std::string source, std::string bos_token, std::string eos_token);

  bool has_template() const { return default_ != nullptr || tool_use_ != nullptr; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // The source of the template that renders requests with tools ("" without a template): the
  // server reads the model's tool-call syntax from it.
  const std::string& tools_source() const { return tools_source_; }

  // messages: JSON array; tools: JSON array or null; extra_kwargs: JSON object (may be empty).
  // raise_exception and runtime errors come back as an error naming line:column.
  Result<std::string> Render(const nlohmann::json& messages, const nlohmann::json& tools,
                             bool add_generation_prompt, const nlohmann::json& extra_kwargs) const;
  Result<std::string> Render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                             bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs) const;

 private:
  template <typename Json>
  Result<std::string> RenderImpl(const Json& messages, const Json& tools, bool add_generation_prompt,
                                 const Json& extra_kwargs) const;

  std::shared_ptr<const tmpl::Program> default_;   // may be null when only tool_use exists
  std::shared_ptr<const tmpl::Program> tool_use_;  // the "tool_use" named template, if any
  std::string tools_source_;
  std::string bos_token_;
  std::string eos_token_;
  // unk/pad/sep/cls/mask tokens from tokenizer_config.json: transformers passes its whole
  // special_tokens_map to the template.
  std::vector<std::pair<std::string, std::string>> other_special_tokens_;
};

}  // namespace ember
