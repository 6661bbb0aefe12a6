// Where a model's tokenizer and chat template come from: `model_path` (--model) is a Hugging Face
// folder or one .gguf file (model/gguf_model.h), and each subcommand asks here rather than for
// DIR/tokenizer.json itself. Plain functions; any thread.
#pragma once

#include <memory>
#include <string>

#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace ember::app {

// The model's tokenizer: the folder's tokenizer.json (+ tokenizer_config.json), or the GGUF
// file's tokenizer.ggml.* vocabulary; null when a folder has no tokenizer.json.
Result<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& model_path);
// The model's chat template: the folder's (ChatTemplate::Load), or the GGUF file's
// tokenizer.chat_template with its bos/eos tokens; has_template() is false when there is none.
Result<ChatTemplate> LoadModelChatTemplate(const std::string& model_path);
// Where a tokenizer would come from, for messages ("DIR/tokenizer.json" or the .gguf path).
std::string TokenizerSource(const std::string& model_path);

}  // namespace ember::app
