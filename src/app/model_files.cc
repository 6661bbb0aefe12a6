#include "app/model_files.h"

#include "model/gguf_model.h"
#include "serve/gguf_chat_template.h"
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
  auto loaded = GgufFileChatTemplate(file);
  if (!loaded.ok()) return loaded.status().WithContext(model_path);
  return loaded;
}

std::string TokenizerSource(const std::string& model_path) {
  return IsGgufFile(model_path) ? model_path : model_path + "/tokenizer.json";
}

}  // namespace ember::app
