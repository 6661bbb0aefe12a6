#include "app/model_files.h"

#include "model/gguf_model.h"
#include "util/mapped_file.h"

namespace ember::app {

Result<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& model_path) {
  if (IsGgufFile(model_path)) {
    EMBER_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(model_path));
    EMBER_ASSIGN_OR_RETURN(GgufVocab vocab, GgufVocabOf(file));
    auto tokenizer = Tokenizer::FromGgufVocab(vocab);
    if (!tokenizer.ok()) return tokenizer.status().WithContext(model_path);
    return std::move(*tokenizer);
  }
  if (!FileExists(model_path + "/tokenizer.json")) return std::unique_ptr<Tokenizer>();
  return Tokenizer::Load(model_path);
}

Result<ChatTemplate> LoadModelChatTemplate(const std::string& model_path) {
  if (!IsGgufFile(model_path)) return ChatTemplate::Load(model_path);
  EMBER_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(model_path));
  EMBER_ASSIGN_OR_RETURN(std::string source, GgufChatTemplate(file));
  EMBER_ASSIGN_OR_RETURN(std::string tool_use, GgufChatTemplate(file, "tool_use"));
  if (source.empty() && tool_use.empty()) return ChatTemplate();
  EMBER_ASSIGN_OR_RETURN(GgufVocab vocab, GgufVocabOf(file));
  auto token = [&](const std::optional<int32_t>& id) {
    return id && size_t(*id) < vocab.tokens.size() ? vocab.tokens[size_t(*id)] : std::string();
  };
  auto loaded = ChatTemplate::FromSources(std::move(source), std::move(tool_use),
                                          token(vocab.bos_token_id), token(vocab.eos_token_id));
  if (!loaded.ok()) return loaded.status().WithContext(model_path + ": tokenizer.chat_template");
  return loaded;
}

std::string TokenizerSource(const std::string& model_path) {
  return IsGgufFile(model_path) ? model_path : model_path + "/tokenizer.json";
}

}  // namespace ember::app
