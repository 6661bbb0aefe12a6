// RecipeTensorType (quant_recipe.h): the rule table, then the block-size fallback.
#include "model/quant_recipe.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace ember {
namespace {

struct RecipeInfo {
  QuantRecipe recipe;
  const char* name;
  GgmlType base;
  uint32_t file_type;
};
constexpr RecipeInfo kRecipes[] = {
    {QuantRecipe::kQ4_K_S, "q4_k_s", GgmlType::kQ4_K, 14},
    {QuantRecipe::kQ4_K_M, "q4_k_m", GgmlType::kQ4_K, 15},
    {QuantRecipe::kQ5_K_S, "q5_k_s", GgmlType::kQ5_K, 16},
    {QuantRecipe::kQ5_K_M, "q5_k_m", GgmlType::kQ5_K, 17},
};

const RecipeInfo& Info(QuantRecipe recipe) {
  for (const RecipeInfo& r : kRecipes)
    if (r.recipe == recipe) return r;
  return kRecipes[0];
}

bool Contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ggml's dimension count: up to the last (innermost-first) extent above 1.
size_t GgmlDims(const std::vector<int64_t>& shape) {
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] > 1) return shape.size() - i;
  return 1;
}

// Whether llama-quantize touches the tensor at all.
bool IsQuantizable(const std::string& name, const std::vector<int64_t>& shape) {
  return EndsWith(name, "weight") && GgmlDims(shape) >= 2 && !Contains(name, "_norm.weight") &&
         !Contains(name, "ffn_gate_inp.weight");
}

// "blk.7.attn_v.weight" -> 7; -1 for a tensor outside the layers.
int32_t LayerOf(const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

// The _M recipes' extra bits: the first and last eighth of the layers and every third between.
bool UseMoreBits(int32_t layer, int32_t num_layers) {
  return layer < num_layers / 8 || layer >= 7 * num_layers / 8 || (layer - num_layers / 8) % 3 == 2;
}

// llama.cpp's LLM_TYPE_70B among the architectures written here.
bool Is70B(const RecipeModel& m) {
  if (m.num_layers != 80) return false;
  if (m.arch == "llama") return m.num_experts != 8 && m.num_heads != m.num_kv_heads;
  return m.arch == "qwen2";
}

// The rule table, before the block-size fallback.
GgmlType RuleType(QuantRecipe recipe, const RecipeModel& m, const std::string& name,
                  int64_t row_len) {
  const GgmlType base = RecipeBaseType(recipe);
  const bool m_recipe = recipe == QuantRecipe::kQ4_K_M || recipe == QuantRecipe::kQ5_K_M;
  const bool q4 = recipe == QuantRecipe::kQ4_K_S || recipe == QuantRecipe::kQ4_K_M;
  const bool eight_experts = m.num_experts == 8;
  const int32_t layer = LayerOf(name), n = m.num_layers;
  if (name == "output.weight" || (!m.has_output && name == "token_embd.weight"))
    return row_len % GgmlTraits(base).block_size != 0 ? GgmlType::kQ8_0 : GgmlType::kQ6_K;
  if (name == "token_embd.weight") return base;
  if (Contains(name, "attn_v.weight")) {
    GgmlType t = base;
    if (m_recipe && UseMoreBits(layer, n))
      t = GgmlType::kQ6_K;
    else if (recipe == QuantRecipe::kQ4_K_S && layer < 4)
      t = GgmlType::kQ5_K;
    if (Is70B(m) && t == GgmlType::kQ4_K) t = GgmlType::kQ5_K;
    return eight_experts ? GgmlType::kQ8_0 : t;
  }
  if (Contains(name, "attn_k.weight")) return eight_experts ? GgmlType::kQ8_0 : base;
  if (Contains(name, "attn_q.weight")) return base;
  if (Contains(name, "ffn_down")) {
    if (m_recipe && UseMoreBits(layer, n)) return GgmlType::kQ6_K;
    if (recipe == QuantRecipe::kQ4_K_S && layer < n / 8) return GgmlType::kQ5_K;
    return base;
  }
  if (Contains(name, "attn_output.weight")) return eight_experts && q4 ? GgmlType::kQ5_K : base;
  if (Contains(name, "attn_qkv.weight") && m_recipe)
    return recipe == QuantRecipe::kQ4_K_M ? GgmlType::kQ5_K : GgmlType::kQ6_K;
  return base;
}

}  // namespace

std::optional<QuantRecipe> ParseQuantRecipe(const std::string& name) {
  std::string lower = name;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const RecipeInfo& r : kRecipes)
    if (lower == r.name) return r.recipe;
  return std::nullopt;
}

const char* QuantRecipeName(QuantRecipe recipe) {
  return Info(recipe).name;
}
GgmlType RecipeBaseType(QuantRecipe recipe) {
  return Info(recipe).base;
}
uint32_t RecipeFileType(QuantRecipe recipe) {
  return Info(recipe).file_type;
}

Result<GgmlType> RecipeTensorType(QuantRecipe recipe, const RecipeModel& model,
                                  const std::string& gguf_name, const std::vector<int64_t>& shape,
                                  GgmlType stored) {
  if (shape.empty() || !IsQuantizable(gguf_name, shape)) return stored;
  const int64_t row_len = shape.back();
  GgmlType t = RuleType(recipe, model, gguf_name, row_len);
  if (row_len % GgmlTraits(t).block_size != 0) {
    switch (t) {
      case GgmlType::kQ4_K:
        t = GgmlType::kQ5_0;
        break;
      case GgmlType::kQ5_K:
        t = GgmlType::kQ5_1;
        break;
      case GgmlType::kQ6_K:
        t = GgmlType::kQ8_0;
        break;
      default:
        return Status::Error("GGUF tensor '" + gguf_name + "': rows of " + std::to_string(row_len) +
                             " values are not whole " + std::string(GgmlTypeName(t)) + " blocks (" +
                             QuantRecipeName(recipe) + " has no fallback for it)");
    }
    if (row_len % GgmlTraits(t).block_size != 0) t = GgmlType::kF16;
  }
  return t;
}

}  // namespace ember
