#include "template/chat_template.h"

#include "template/ast.h"
#include "template/interpreter.h"
#include "util/mapped_file.h"

namespace ember {
namespace {

std::string Located(const tmpl::TemplateError& e) {
  return "chat template line " + std::to_string(e.line) + ", column " + std::to_string(e.column) +
         ": " + e.what();
}

Result<std::shared_ptr<const tmpl::Program>> ParseTemplate(const std::string& source) {
  try {
    return std::shared_ptr<const tmpl::Program>(tmpl::Parse(source));
  } catch (const tmpl::TemplateError& e) {
    return Status::Error(Located(e));
  } catch (const std::exception& e) {  // e.g. bad_alloc
    return Status::Error(std::string("chat template: ") + e.what());
  }
}

// tokenizer_config.json spells special tokens as a string or an AddedToken {"content": ...}.
std::string TokenString(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return "";
}

}  // namespace

Result<ChatTemplate> ChatTemplate::FromSource(std::string source, std::string bos_token,
                                              std::string eos_token) {
  ChatTemplate t;
  EMBER_ASSIGN_OR_RETURN(t.default_, ParseTemplate(source));
  t.tools_source_ = std::move(source);
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  return t;
}

Result<ChatTemplate> ChatTemplate::Load(const std::string& model_dir) {
  std::string config_path = model_dir + "/tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (FileExists(config_path)) {
    EMBER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
    config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      return Status::Error(config_path + ": not a JSON object");
  }
  ChatTemplate t;
  t.bos_token_ = TokenString(config, "bos_token");
  t.eos_token_ = TokenString(config, "eos_token");
  for (const char* key : {"unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    std::string token = TokenString(config, key);
    if (!token.empty()) t.other_special_tokens_.emplace_back(key, token);
  }

  std::string jinja_path = model_dir + "/chat_template.jinja";
  if (FileExists(jinja_path)) {
    EMBER_ASSIGN_OR_RETURN(std::string source, ReadFileToString(jinja_path));
    auto program = ParseTemplate(source);
    if (!program.ok()) return program.status().WithContext(jinja_path);
    t.default_ = *program;
    t.tools_source_ = std::move(source);
    return t;
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return t;
  if (it->is_string()) {
    auto program = ParseTemplate(it->get<std::string>());
    if (!program.ok()) return program.status().WithContext(config_path + ": chat_template");
    t.default_ = *program;
    t.tools_source_ = it->get<std::string>();
    return t;
  }
  if (!it->is_array())
    return Status::Error(config_path + ": chat_template must be a string or a list of {name, template}");
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
        !entry["name"].is_string() || !entry["template"].is_string())
      return Status::Error(config_path + ": chat_template entries must be {name, template} strings");
    std::string name = entry["name"].get<std::string>();
    if (name != "default" && name != "tool_use") continue;
    auto program = ParseTemplate(entry["template"].get<std::string>());
    if (!program.ok()) return program.status().WithContext(config_path + ": chat_template '" + name + "'");
    (name == "default" ? t.default_ : t.tool_use_) = *program;
    // Tools render through "tool_use" when there is one (RenderImpl).
    if (name == "tool_use" || !t.tool_use_) t.tools_source_ = entry["template"].get<std::string>();
  }
  return t;
}

template <typename Json>
Result<std::string> ChatTemplate::RenderImpl(const Json& messages, const Json& tools,
                                             bool add_generation_prompt, const Json& extra_kwargs) const {
  bool has_tools = !tools.is_null();
  const tmpl::Program* program = (has_tools && tool_use_) ? tool_use_.get() : default_.get();
  if (program == nullptr) {
    return Status::Error(has_tools || !tool_use_
                             ? "model has no chat template"
                             : "model has no 'default' chat template (only 'tool_use'); pass tools");
  }
  if (!messages.is_array()) return Status::Error("messages must be a JSON array");
  if (has_tools && !tools.is_array()) return Status::Error("tools must be a JSON array or null");
  if (!extra_kwargs.is_null() && !extra_kwargs.is_object())
    return Status::Error("chat template kwargs must be a JSON object");

  using tmpl::Value;
  std::vector<std::pair<std::string, Value>> vars;
  vars.emplace_back("messages", Value::FromJson(messages));
  vars.emplace_back("tools", Value::FromJson(tools));
  vars.emplace_back("documents", Value::None());
  vars.emplace_back("add_generation_prompt", Value::Bool(add_generation_prompt));
  if (!bos_token_.empty()) vars.emplace_back("bos_token", Value::Str(bos_token_));
  if (!eos_token_.empty()) vars.emplace_back("eos_token", Value::Str(eos_token_));
  for (const auto& [key, token] : other_special_tokens_) vars.emplace_back(key, Value::Str(token));
  if (extra_kwargs.is_object()) {
    for (auto it = extra_kwargs.begin(); it != extra_kwargs.end(); ++it)
      vars.emplace_back(it.key(), Value::FromJson(it.value()));
  }
  try {
    return tmpl::RenderProgram(*program, vars);
  } catch (const tmpl::TemplateError& e) {
    return Status::Error(Located(e));
  } catch (const std::exception& e) {  // e.g. bad_alloc from a hostile template
    return Status::Error(std::string("chat template: ") + e.what());
  }
}

Result<std::string> ChatTemplate::Render(const nlohmann::json& messages, const nlohmann::json& tools,
                                         bool add_generation_prompt, const nlohmann::json& extra_kwargs) const {
  return RenderImpl(messages, tools, add_generation_prompt, extra_kwargs);
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                         const nlohmann::ordered_json& extra_kwargs) const {
  return RenderImpl(messages, tools, add_generation_prompt, extra_kwargs);
}

}  // namespace ember
