// EmbeddingSupport: how the served model turns a prompt into an embedding, decided once at
// start-up from its folder. A sentence-transformers layout (modules.json naming a Pooling module
// whose config.json picks pooling_mode_lasttoken, _mean_tokens or _cls_token, and optionally a
// Normalize module) is followed; a layout with a module Ember cannot run (Dense, max or
// weighted-mean pooling, ...) makes embeddings unavailable with the reason. Without modules.json a
// decoder model embeds by its last token's final hidden state, L2-normalized (the
// Qwen3-Embedding / e5-mistral convention). Plain values, read-only after start-up.
#pragma once

#include <string>

#include "engine/pooling.h"

namespace ember::serve {

struct EmbeddingSupport {
  bool available = false;
  PoolingSpec pooling;
  std::string source;              // where the rule came from (log line, /v1/models)
  std::string unavailable_reason;  // when !available: why, for the 400 and the log
};

// Reads `model_dir`/modules.json and the pooling module's config.json when present.
EmbeddingSupport ReadEmbeddingSupport(const std::string& model_dir);

}  // namespace ember::serve
