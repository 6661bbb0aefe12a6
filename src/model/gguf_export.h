// `ember quantize`: a Hugging Face safetensors folder -> one GGUF v3 file as llama.cpp's converter
// and llama-quantize lay it out (tensor names blk.N.*, `<arch>.*` hyperparameters, the
// tokenizer.ggml.* vocabulary of gguf_vocab_export.h, tokenizer.chat_template, llama's q/k rows
// permuted for GGML's rope, Llama 3 rope scaling as rope_freqs.weight), so that Ember's GGUF
// loader (gguf_model.h) and llama.cpp both read it.
//
// Types: f32 / f16 / bf16 store every matrix in that type; q8_0 / q4_0 / q4_k / q5_k / q6_k
// ("pure") quantize the projections model/quantize.h names (the same reference quantizers as
// --quantize, so a GGUF file and the folder loaded with --quantize T hold the same blocks) and
// keep the embedding, lm_head and other matrices in the checkpoint's float type; the mixed
// recipes q4_k_m / q4_k_s / q5_k_m / q5_k_s give each tensor -- embedding, head and stacked
// experts included -- the type llama-quantize gives it (model/quant_recipe.h), quantized by
// model/ggml_quantize.h. Vectors (norms, biases) are F32.
// Architectures written: llama, mistral (as GGUF's llama), qwen2, qwen3, qwen3_moe (qwen3moe: each
// layer's experts stacked into one [experts, rows, cols] tensor per projection, kept in float by
// the pure types like --quantize keeps them, quantized by the recipes), gemma2, gemma3_text (gemma3: norms stored as 1 + w, the sliding window
// and its every-n-th-layer pattern, softcaps), phi3 (fused qkv / gate_up as attn_qkv / ffn_up; a
// model without a window gets attention.sliding_window = its context, which llama.cpp requires and
// which changes nothing); any other is refused by name, as are what those
// GGUF architectures cannot say (llama-family sliding windows, yarn/longrope scaling, dense layers
// among MoE ones, norm_topk_prob false, gemma layer patterns that are not every n-th layer, a
// query_pre_attn_scalar other than llama.cpp's, a scaled or non-10000 gemma3 local rope).
// The file is written to a temporary file and renamed (model/gguf_writer.h). Thread-compatible;
// quantizes on `threads` threads.
#pragma once

#include <cstddef>
#include <string>

#include <optional>

#include "model/gguf_quants.h"
#include "model/quant_recipe.h"
#include "util/status.h"

namespace ember {

struct GgufExportOptions {
  std::string model_dir;      // config.json, safetensors, tokenizer files
  std::string tokenizer_dir;  // "" : model_dir
  std::string out_path;       // the .gguf file
  GgmlType type = GgmlType::kF16;
  std::optional<QuantRecipe> recipe;  // a mixed recipe; `type` is then its base (Q4_K / Q5_K)
  size_t threads = 1;
  // tokenizer.chat_template and tokenizer.chat_template.tool_use ("" : not written); the caller
  // reads them (ChatTemplate::Load's default_source / tool_use_source).
  std::string chat_template, chat_template_tool_use;
};

// What `ember quantize --type` writes: one type, or a mixed recipe over its base type.
struct ExportTypeChoice {
  GgmlType type = GgmlType::kF16;
  std::optional<QuantRecipe> recipe;
};
// "f32", "F16", "q4_k", "q4_k_m", ... -> the choice; else an error naming `flag`, the name and
// ExportTypeNames().
Result<ExportTypeChoice> ParseExportType(const std::string& name, const std::string& flag);
std::string ExportTypeNames();  // "f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, ..."
std::string ExportArchitectures();  // "llama, mistral, qwen2, qwen3, qwen3_moe, gemma2, ..."

// Writes the file; returns a one-line summary (tensors per type, bytes). Errors name the folder,
// file, tensor or option at fault; no file is left behind on error.
Result<std::string> ExportGguf(const GgufExportOptions& options);

}  // namespace ember
