// A model from one GGUF file (llama.cpp's format): the ModelConfig from its `<arch>.*` metadata,
// the tokenizer vocabulary (tokenizer.ggml.*), the chat template, and a WeightStore whose tensors
// carry the Hugging Face names LoadWeights reads. Tensors whose type Ember's backends take (F32,
// F16, BF16) are read in place from the mapping; quantized ones are dequantized to float32 at
// load (quantized kernels are a later step; the load log says so), and what llama.cpp's converter
// rearranged is put back: llama's q/k rows (permuted for GGML's interleaved rope) and gemma's norm
// weights (stored as 1 + w). Architectures: llama (and mistral, which GGUF calls llama), qwen2,
// qwen3, qwen3moe, gemma2, gemma3, phi3; any other is refused by name. Errors name the file and
// the GGUF key or tensor. Pure functions over an immutable GgufFile; safe from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "model/gguf.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tokenizer/gguf_vocab.h"
#include "util/status.h"

namespace ember {

// True for a path that names a regular file ending in ".gguf".
bool IsGgufFile(const std::string& path);
// The general.architecture values GgufModelConfig accepts, comma separated.
std::string SupportedGgufArchitectures();

Result<ModelConfig> GgufModelConfig(const GgufFile& file);
// Generation defaults: EOS ids from tokenizer.ggml.eos_token_id (plus the end-of-turn and
// end-of-message ids where the file names them), the BOS id; no sampling defaults.
GenerationDefaults GgufGenerationDefaults(const ModelConfig& config);
Result<GgufVocab> GgufVocabOf(const GgufFile& file);
// tokenizer.chat_template (name ""), or a named template such as tokenizer.chat_template.tool_use
// (name "tool_use"); "" when the file has none.
Result<std::string> GgufChatTemplate(const GgufFile& file, const std::string& name = "");

// The GGUF (llama.cpp) name of Ember's (Hugging Face) tensor `name` for `config`
// ("model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight"; a stacked experts tensor's
// name for each of its experts), or "" for a name GGUF has none for.
std::string GgufTensorName(const std::string& name, const ModelConfig& config);
// llama.cpp's converter interleaves each head's rope halves of llama's q and k: the GGUF row that
// holds Hugging Face row `r` of a [rows = heads x head dim] matrix (heads 0: r itself).
int64_t GgufRopeRow(int64_t r, int64_t rows, int32_t heads);

// Whether the backend takes matrices of a block-quantized DType as they are (null: none).
using KeepQuantized = std::function<bool(DType)>;

// The weights of `file` under Ember's tensor names, for `config` (from GgufModelConfig). The store
// keeps the file (its mapping) alive. `*summary` is set to a line for the load log saying what
// was read in place, kept quantized, dequantized to float32 (counted per GGUF type) and rearranged.
Result<std::unique_ptr<WeightStore>> OpenGgufWeights(std::shared_ptr<const GgufFile> file,
                                                     const ModelConfig& config,
                                                     const KeepQuantized& keep,
                                                     std::string* summary);

}  // namespace ember
