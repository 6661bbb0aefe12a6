// llama.cpp's mixed k-quant recipes (Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M), as `ember quantize --type
// q4_k_m` applies them: which GGML type each GGUF tensor gets, by name, layer, row length and the
// model's shape -- the same choice as llama-quantize without --pure, --imatrix or type overrides
// (its llama_tensor_get_type in src/llama-quant.cpp), for the architectures ember quantize writes:
//  - quantized at all: names ending "weight", 2-D or 3-D (stacked experts), not norms
//    ("_norm.weight") nor the MoE router (ffn_gate_inp); the rest keep their stored type;
//  - the head (output.weight; token_embd.weight when tied) Q6_K, Q8_0 when its rows are not whole
//    256-value blocks; an untied token_embd.weight the base type;
//  - attn_v: Q6_K on "more bits" layers in the _M recipes (the first and last eighth and every
//    third layer between), Q5_K on layers 0-3 in Q4_K_S; Q4_K raised to Q5_K in a 70B (llama with
//    80 layers and GQA, qwen2 with 80); Q8_0 in a model of exactly 8 experts (attn_k too);
//  - ffn_down (and ffn_down_exps): Q6_K on "more bits" layers in the _M recipes, Q5_K on the first
//    eighth in Q4_K_S; attn_output Q5_K in a Q4_K recipe of an 8-expert model; a fused attn_qkv
//    Q5_K (Q4_K_M) / Q6_K (Q5_K_M); everything else (attn_q, attn_k, ffn_gate, ffn_up) the base;
//  - rows not a whole number of the chosen type's blocks fall back: Q4_K -> Q5_0, Q5_K -> Q5_1,
//    Q6_K -> Q8_0, then F16 when rows are not whole 32-value blocks either (Q8_0 itself has no
//    fallback: an error, as llama-quantize's).
// The table is that of the llama.cpp source of Feb 2025 that the tests check it against (its
// llama-quantize, byte for byte). Newer llama.cpp sources route a fused attn_qkv through the
// attn_v rules instead (Q6_K on "more bits" layers, else the base type): phi3's Q4_K_M / Q5_K_M
// files from those differ there.
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/gguf_quants.h"
#include "util/status.h"

namespace ember {

enum class QuantRecipe { kQ4_K_S, kQ4_K_M, kQ5_K_S, kQ5_K_M };

// What the rules read of the model (from the GGUF metadata the file gets).
struct RecipeModel {
  std::string arch;  // general.architecture: "llama", "qwen2", "qwen3moe", "gemma3", ...
  int32_t num_layers = 0;
  int32_t num_heads = 0, num_kv_heads = 0;
  int32_t num_experts = 0;  // 0: dense
  bool has_output = true;   // an output.weight; false (tied) gives token_embd the head's rule
};

// "q4_k_m" -> kQ4_K_M, ... (any case), else nullopt.
std::optional<QuantRecipe> ParseQuantRecipe(const std::string& name);
const char* QuantRecipeName(QuantRecipe recipe);  // "q4_k_m"
GgmlType RecipeBaseType(QuantRecipe recipe);      // Q4_K or Q5_K
uint32_t RecipeFileType(QuantRecipe recipe);      // general.file_type (llama_ftype): 14..17

// The type of GGUF tensor `gguf_name` of `shape` (outermost first; the row length last) stored
// as `stored`. Errors name the tensor (a head whose rows are not whole 32-value blocks).
Result<GgmlType> RecipeTensorType(QuantRecipe recipe, const RecipeModel& model,
                                  const std::string& gguf_name, const std::vector<int64_t>& shape,
                                  GgmlType stored);

}  // namespace ember
