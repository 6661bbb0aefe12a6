// The chat template a GGUF file carries: tokenizer.chat_template (and the named
// tokenizer.chat_template.tool_use, used for requests with tools), rendered with the file's own
// bos/eos token strings. One function for everything that reads a .gguf's template (`ember`'s
// subcommands through app/model_files.h, the model library's descriptions). Any thread.
#pragma once

#include "model/gguf.h"
#include "template/chat_template.h"
#include "util/status.h"

namespace ember {

// has_template() is false when the file has neither template; an error when a template is
// present but its vocabulary or source does not load (the message names the key).
Result<ChatTemplate> GgufFileChatTemplate(const GgufFile& file);

}  // namespace ember
