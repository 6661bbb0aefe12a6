#include "template/chat_template.h"

#include <algorithm>

#include "template/ast.h"
#include "template/builtins.h"
#include "template/interpreter.h"
#include "util/json_bounds.h"
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

// The template's view of client JSON: every string and key escaped by `guard` (when given).
// Recursive: callers bound the depth first (ChatTemplate::kMaxInputDepth).
template <typename Json>
tmpl::Value ClientValue(const Json& j, const ClientTextGuard* guard) {
  using tmpl::Value;
  auto text = [guard](const std::string& s) { return guard ? guard->Escape(s) : s; };
  switch (j.type()) {
    case nlohmann::json::value_t::string: return Value::Str(text(j.template get_ref<const std::string&>()));
    case nlohmann::json::value_t::array: {
      tmpl::List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(ClientValue(e, guard));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      tmpl::Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.items.emplace_back(Value::Str(text(it.key())), ClientValue(it.value(), guard));
      return Value::MakeDict(std::move(d));
    }
    default: return Value::FromJson(j);  // a scalar
  }
}

template <typename Json>
Status CheckDepth(const Json& j, const char* what) {
  if (JsonValueDepth(j) <= ChatTemplate::kMaxInputDepth) return Status::Ok();
  return Status::Error(std::string(what) + ": nests deeper than " +
                       std::to_string(ChatTemplate::kMaxInputDepth) + " arrays/objects");
}

template <typename Json>
Status CheckKwargs(const Json& kwargs) {
  if (kwargs.is_null()) return Status::Ok();
  if (!kwargs.is_object()) return Status::Error("chat template kwargs must be a JSON object");
  const std::vector<std::string>& reserved = ReservedTemplateVariables();
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
    if (std::find(reserved.begin(), reserved.end(), it.key()) != reserved.end()) {
      return Status::Error("chat_template_kwargs." + it.key() +
                           ": the chat template defines this name itself; it cannot be passed");
    }
  }
  return Status::Ok();
}

// The string literals a template looks for inside other strings: operands of `in` / `not in`,
// and arguments of method calls (`content.split('</think>')`), filters and tests.
class InspectedLiterals {
 public:
  void Walk(const tmpl::Body& body) {
    for (const tmpl::StmtPtr& s : body) Walk(*s);
  }
  std::vector<std::string> Take() { return std::move(found_); }

 private:
  void Walk(const tmpl::Stmt& s) {
    for (const tmpl::ExprPtr* e : {&s.expr, &s.cond, &s.filter}) Walk(e->get());
    for (const tmpl::ExprPtr& e : s.conds) Walk(e.get());
    for (const tmpl::ExprPtr& e : s.defaults) Walk(e.get());
    for (const tmpl::Body& b : s.bodies) Walk(b);
    Walk(s.body);
    Walk(s.else_body);
  }
  void Walk(const tmpl::Expr* e) {
    if (e == nullptr) return;
    const bool method_call = e->kind == tmpl::ExprKind::kCall && !e->children.empty() &&
                             e->children[0] && e->children[0]->kind == tmpl::ExprKind::kGetAttr;
    if (e->kind == tmpl::ExprKind::kBinary && (e->name == "in" || e->name == "not in"))
      Note(e->children[0].get());
    if (method_call || e->kind == tmpl::ExprKind::kFilter || e->kind == tmpl::ExprKind::kTest) {
      for (const tmpl::ExprPtr& a : e->args) Note(a.get());
    }
    for (const tmpl::ExprPtr& c : e->children) Walk(c.get());
    for (const tmpl::ExprPtr& a : e->args) Walk(a.get());
    for (const auto& [name, value] : e->kwargs) Walk(value.get());
  }
  void Note(const tmpl::Expr* e) {
    if (e != nullptr && e->kind == tmpl::ExprKind::kLiteral && e->literal.is_string())
      found_.push_back(e->literal.str());
  }
  std::vector<std::string> found_;
};

}  // namespace

const std::vector<std::string>& ReservedTemplateVariables() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = {"messages",  "tools",     "documents", "add_generation_prompt",
                                  "bos_token", "eos_token", "unk_token", "sep_token",
                                  "pad_token", "cls_token", "mask_token", "loop",
                                  "caller",    "varargs",   "kwargs",    "self"};
    for (const auto& [name, value] : tmpl::MakeGlobals()) n.push_back(name);
    return n;
  }();
  return names;
}

Status CheckTemplateKwargs(const nlohmann::json& kwargs) { return CheckKwargs(kwargs); }
Status CheckTemplateKwargs(const nlohmann::ordered_json& kwargs) { return CheckKwargs(kwargs); }

Result<ChatTemplate> ChatTemplate::FromSource(std::string source, std::string bos_token,
                                              std::string eos_token) {
  return FromSources(std::move(source), std::string(), std::move(bos_token), std::move(eos_token));
}

Result<ChatTemplate> ChatTemplate::FromSources(std::string default_source,
                                               std::string tool_use_source, std::string bos_token,
                                               std::string eos_token) {
  ChatTemplate t;
  if (!default_source.empty() || tool_use_source.empty()) {
    EMBER_ASSIGN_OR_RETURN(t.default_, ParseTemplate(default_source));
  }
  if (!tool_use_source.empty()) {
    auto program = ParseTemplate(tool_use_source);
    if (!program.ok()) return program.status().WithContext("the 'tool_use' template");
    t.tool_use_ = *program;
  }
  // Tools render through "tool_use" when there is one (RenderImpl).
  t.tools_source_ = tool_use_source.empty() ? default_source : tool_use_source;
  t.default_source_ = std::move(default_source);
  t.tool_use_source_ = std::move(tool_use_source);
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  t.NoteInspectedLiterals(t.default_source_ + t.tool_use_source_);
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
    t.default_source_ = source;
    t.tools_source_ = std::move(source);
    t.NoteInspectedLiterals(t.tools_source_);
    return t;
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return t;
  if (it->is_string()) {
    auto program = ParseTemplate(it->get<std::string>());
    if (!program.ok()) return program.status().WithContext(config_path + ": chat_template");
    t.default_ = *program;
    t.default_source_ = it->get<std::string>();
    t.tools_source_ = it->get<std::string>();
    t.NoteInspectedLiterals(t.tools_source_);
    return t;
  }
  if (!it->is_array())
    return Status::Error(config_path + ": chat_template must be a string or a list of {name, template}");
  std::string sources;
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
        !entry["name"].is_string() || !entry["template"].is_string())
      return Status::Error(config_path + ": chat_template entries must be {name, template} strings");
    std::string name = entry["name"].get<std::string>();
    if (name != "default" && name != "tool_use") continue;
    auto program = ParseTemplate(entry["template"].get<std::string>());
    if (!program.ok()) return program.status().WithContext(config_path + ": chat_template '" + name + "'");
    (name == "default" ? t.default_ : t.tool_use_) = *program;
    (name == "default" ? t.default_source_ : t.tool_use_source_) = entry["template"].get<std::string>();
    sources += entry["template"].get<std::string>();
    // Tools render through "tool_use" when there is one (RenderImpl).
    if (name == "tool_use" || !t.tool_use_) t.tools_source_ = entry["template"].get<std::string>();
  }
  t.NoteInspectedLiterals(std::move(sources));
  return t;
}

template <typename Json>
Result<std::string> ChatTemplate::RenderImpl(const Json& messages, const Json& tools,
                                             bool add_generation_prompt, const Json& extra_kwargs,
                                             const ClientTextGuard* guard) const {
  bool has_tools = !tools.is_null();
  const tmpl::Program* program = (has_tools && tool_use_) ? tool_use_.get() : default_.get();
  if (program == nullptr) {
    return Status::Error(has_tools || !tool_use_
                             ? "model has no chat template"
                             : "model has no 'default' chat template (only 'tool_use'); pass tools");
  }
  if (!messages.is_array()) return Status::Error("messages must be a JSON array");
  if (has_tools && !tools.is_array()) return Status::Error("tools must be a JSON array or null");
  EMBER_RETURN_IF_ERROR(CheckKwargs(extra_kwargs));
  // The conversion below and the interpreter recurse over the values: bound their depth first.
  EMBER_RETURN_IF_ERROR(CheckDepth(messages, "messages"));
  EMBER_RETURN_IF_ERROR(CheckDepth(tools, "tools"));
  EMBER_RETURN_IF_ERROR(CheckDepth(extra_kwargs, "chat_template_kwargs"));

  using tmpl::Value;
  std::vector<std::pair<std::string, Value>> vars;
  vars.emplace_back("messages", ClientValue(messages, guard));
  vars.emplace_back("tools", ClientValue(tools, guard));
  vars.emplace_back("documents", Value::None());
  vars.emplace_back("add_generation_prompt", Value::Bool(add_generation_prompt));
  if (!bos_token_.empty()) vars.emplace_back("bos_token", Value::Str(bos_token_));
  if (!eos_token_.empty()) vars.emplace_back("eos_token", Value::Str(eos_token_));
  for (const auto& [key, token] : other_special_tokens_) vars.emplace_back(key, Value::Str(token));
  if (extra_kwargs.is_object()) {
    for (auto it = extra_kwargs.begin(); it != extra_kwargs.end(); ++it)
      vars.emplace_back(it.key(), ClientValue(it.value(), guard));
  }
  try {
    return tmpl::RenderProgram(*program, vars);
  } catch (const tmpl::TemplateError& e) {
    return Status::Error(Located(e));
  } catch (const std::exception& e) {  // e.g. bad_alloc from a hostile template
    return Status::Error(std::string("chat template: ") + e.what());
  }
}

template <typename Json>
Result<RenderedPrompt> ChatTemplate::RenderPromptImpl(
    const Json& messages, const Json& tools, bool add_generation_prompt, const Json& extra_kwargs,
    std::span<const std::string> protected_strings) const {
  EMBER_ASSIGN_OR_RETURN(ClientTextGuard guard, ClientTextGuard::Make(protected_strings));
  auto rendered = RenderImpl(messages, tools, add_generation_prompt, extra_kwargs, &guard);
  // An error may quote client text (raise_exception): show it as the client wrote it.
  if (!rendered.ok()) return Status::Error(guard.Restore(rendered.message()).text);
  return guard.Restore(*rendered);
}

Result<std::string> ChatTemplate::Render(const nlohmann::json& messages, const nlohmann::json& tools,
                                         bool add_generation_prompt, const nlohmann::json& extra_kwargs) const {
  return RenderImpl(messages, tools, add_generation_prompt, extra_kwargs, nullptr);
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                         const nlohmann::ordered_json& extra_kwargs) const {
  return RenderImpl(messages, tools, add_generation_prompt, extra_kwargs, nullptr);
}

void ChatTemplate::NoteInspectedLiterals(std::string sources) {
  sources_ = std::move(sources);
  InspectedLiterals walker;
  for (const auto* program : {default_.get(), tool_use_.get()})
    if (program != nullptr) walker.Walk(program->body);
  inspected_literals_ = walker.Take();
}

std::vector<std::string> ChatTemplate::ProtectedTokenStrings(
    std::span<const std::string> special_tokens, std::span<const std::string> added_tokens) const {
  std::vector<std::string> out(special_tokens.begin(), special_tokens.end());
  for (const std::string& token : added_tokens) {
    if (token.empty() || std::find(out.begin(), out.end(), token) != out.end()) continue;
    // Only the template's own markers: added tokens that are ordinary text (Gemma's whitespace
    // runs and HTML tags) must keep tokenizing as the reference does.
    const bool whitespace = token.find_first_not_of(" \t\n\r") == std::string::npos;
    if (whitespace || sources_.find(token) == std::string::npos) continue;
    const bool inspected =
        std::any_of(inspected_literals_.begin(), inspected_literals_.end(),
                    [&](const std::string& literal) { return literal.find(token) != std::string::npos; });
    if (!inspected) out.push_back(token);
  }
  return out;
}

Result<RenderedPrompt> ChatTemplate::RenderPrompt(const nlohmann::json& messages,
                                                  const nlohmann::json& tools,
                                                  bool add_generation_prompt,
                                                  const nlohmann::json& extra_kwargs,
                                                  std::span<const std::string> protected_strings) const {
  return RenderPromptImpl(messages, tools, add_generation_prompt, extra_kwargs, protected_strings);
}

Result<RenderedPrompt> ChatTemplate::RenderPrompt(const nlohmann::ordered_json& messages,
                                                  const nlohmann::ordered_json& tools,
                                                  bool add_generation_prompt,
                                                  const nlohmann::ordered_json& extra_kwargs,
                                                  std::span<const std::string> protected_strings) const {
  return RenderPromptImpl(messages, tools, add_generation_prompt, extra_kwargs, protected_strings);
}

}  // namespace ember
