#include "serve/gguf_chat_template.h"

#include <optional>
#include <string>

#include "model/gguf_model.h"

namespace ember {

Result<ChatTemplate> GgufFileChatTemplate(const GgufFile& file) {
  EMBER_ASSIGN_OR_RETURN(std::string source, GgufChatTemplate(file));
  EMBER_ASSIGN_OR_RETURN(std::string tool_use, GgufChatTemplate(file, "tool_use"));
  if (source.empty() && tool_use.empty()) return ChatTemplate();
  EMBER_ASSIGN_OR_RETURN(GgufVocab vocab, GgufVocabOf(file));
  const auto token = [&](std::optional<int32_t> id) {
    return id && *id >= 0 && static_cast<size_t>(*id) < vocab.tokens.size()
               ? vocab.tokens[static_cast<size_t>(*id)]
               : std::string();
  };
  auto loaded = ChatTemplate::FromSources(std::move(source), std::move(tool_use),
                                          token(vocab.bos_token_id), token(vocab.eos_token_id));
  if (!loaded.ok()) return loaded.status().WithContext("tokenizer.chat_template");
  return loaded;
}

}  // namespace ember
