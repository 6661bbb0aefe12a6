// `ember chat-template --model DIR [--chat-template FILE]`: reads
// {"messages": [...], "tools": [...], "add_generation_prompt": true, ...kwargs} as JSON on stdin
// and prints the rendered prompt exactly (no added newline), as transformers'
// apply_chat_template(tokenize=False) would.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/model_files.h"
#include "template/chat_template.h"
#include "util/flags.h"
#include "util/mapped_file.h"

namespace ember::app {
namespace {

// Prints a one-line "ember chat-template: MESSAGE" to stderr; returns exit code 1.
int Fail(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  std::fprintf(stderr, "ember chat-template: %s\n", message.c_str());
  return 1;
}

Result<ChatTemplate> LoadTemplate(const std::string& model_dir, const std::string& template_file) {
  std::string bos, eos;
  if (!model_dir.empty()) {
    EMBER_ASSIGN_OR_RETURN(ChatTemplate model_template, LoadModelChatTemplate(model_dir));
    if (template_file.empty()) {
      if (!model_template.has_template())
        return Status::Error(model_dir + " has no chat template (pass --chat-template FILE)");
      return model_template;
    }
    bos = model_template.bos_token();
    eos = model_template.eos_token();
  }
  EMBER_ASSIGN_OR_RETURN(std::string source, ReadFileToString(template_file));
  auto loaded = ChatTemplate::FromSource(std::move(source), std::move(bos), std::move(eos));
  if (!loaded.ok()) return loaded.status().WithContext(template_file);
  return loaded;
}

}  // namespace

int ChatTemplateCommand(int argc, char** argv, int first) {
  std::string model_dir, template_file;
  FlagParser flags(
      "usage: ember chat-template --model DIR [--chat-template FILE] < request.json\n"
      "  stdin: {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true, ...kwargs}\n"
      "  prints the rendered prompt exactly, without a trailing newline");
  flags.AddString("--model", &model_dir, "model folder (chat_template.jinja or tokenizer_config.json) or .gguf file");
  flags.AddString("--chat-template", &template_file, "Jinja file that overrides the model's template");
  bool help = false;
  if (Status st = flags.Parse(argc, argv, first, &help); !st.ok()) return Fail(st.message());
  if (help) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (model_dir.empty() && template_file.empty()) return Fail("--model DIR is required");

  auto tmpl = LoadTemplate(model_dir, template_file);
  if (!tmpl.ok()) return Fail(tmpl.message());

  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  nlohmann::ordered_json request = nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object())
    return Fail("stdin must be a JSON object {\"messages\": [...], ...}");
  if (!request.contains("messages") || !request["messages"].is_array())
    return Fail("stdin field 'messages' must be an array");
  nlohmann::ordered_json tools = request.value("tools", nlohmann::ordered_json());
  if (!tools.is_null() && !tools.is_array())
    return Fail("stdin field 'tools' must be an array or null");
  bool add_generation_prompt = false;
  if (request.contains("add_generation_prompt")) {
    if (!request["add_generation_prompt"].is_boolean())
      return Fail("stdin field 'add_generation_prompt' must be true or false");
    add_generation_prompt = request["add_generation_prompt"].get<bool>();
  }
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  for (auto it = request.begin(); it != request.end(); ++it) {
    if (it.key() != "messages" && it.key() != "tools" && it.key() != "add_generation_prompt")
      kwargs[it.key()] = it.value();
  }
  auto rendered = tmpl->Render(request["messages"], tools, add_generation_prompt, kwargs);
  if (!rendered.ok()) return Fail(rendered.message());
  std::fwrite(rendered->data(), 1, rendered->size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace ember::app
