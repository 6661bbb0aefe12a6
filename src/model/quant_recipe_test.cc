// The mixed recipes' rule table (quant_recipe.h): hand-worked layer sets for a few layer counts,
// the 8-expert, 70B, fused-qkv and tied-head cases, the block-size fallback; then against
// llama-quantize itself: every tensor of the small-k fixture files llama-quantize wrote as
// Q4_K_M / Q5_K_M (from small-k-f16.gguf, no importance matrix) has the type RecipeTensorType
// gives and the bytes QuantizeGgmlRows writes from the f16 values.
#include "model/quant_recipe.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "model/ggml_quantize.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "util/testing.h"

namespace ember {
namespace {

constexpr int64_t kWide = 2048;  // rows of whole 256-value blocks

GgmlType TypeOf(QuantRecipe r, const RecipeModel& m, const std::string& name,
                int64_t row_len = kWide) {
  auto t = RecipeTensorType(r, m, name, {kWide, row_len}, GgmlType::kF16);
  EXPECT_TRUE(t.ok()) << t.message();
  return t.ok() ? *t : GgmlType::kF32;
}

std::string Blk(int32_t layer, const std::string& what) {
  return "blk." + std::to_string(layer) + "." + what + ".weight";
}

// The layers whose `what` gets `type`.
std::set<int32_t> LayersOf(QuantRecipe r, const RecipeModel& m, const std::string& what,
                           GgmlType type) {
  std::set<int32_t> out;
  for (int32_t l = 0; l < m.num_layers; ++l)
    if (TypeOf(r, m, Blk(l, what)) == type) out.insert(l);
  return out;
}

TEST(QuantRecipeTest, MoreBitsLayersFirstAndLastEighthAndEveryThird) {
  const std::map<int32_t, std::set<int32_t>> more_bits = {
      {2, {1}},
      {16, {0, 1, 4, 7, 10, 13, 14, 15}},
      {28, {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27}},
      {32, {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}}};
  for (const auto& [layers, want] : more_bits) {
    const RecipeModel m{"llama", layers, 32, 8, 0, true};
    for (QuantRecipe r : {QuantRecipe::kQ4_K_M, QuantRecipe::kQ5_K_M}) {
      EXPECT_EQ(LayersOf(r, m, "attn_v", GgmlType::kQ6_K), want) << layers;
      EXPECT_EQ(LayersOf(r, m, "ffn_down", GgmlType::kQ6_K), want) << layers;
      for (const char* plain : {"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"})
        EXPECT_TRUE(LayersOf(r, m, plain, RecipeBaseType(r)).size() == size_t(layers)) << plain;
    }
    // Q4_K_S: attn_v Q5_K on layers 0-3, ffn_down Q5_K on the first eighth; Q5_K_S: all Q5_K.
    std::set<int32_t> first4, first8th;
    for (int32_t l = 0; l < layers; ++l) {
      if (l < 4) first4.insert(l);
      if (l < layers / 8) first8th.insert(l);
    }
    EXPECT_EQ(LayersOf(QuantRecipe::kQ4_K_S, m, "attn_v", GgmlType::kQ5_K), first4);
    EXPECT_EQ(LayersOf(QuantRecipe::kQ4_K_S, m, "ffn_down", GgmlType::kQ5_K), first8th);
    EXPECT_EQ(LayersOf(QuantRecipe::kQ5_K_S, m, "attn_v", GgmlType::kQ5_K).size(), size_t(layers));
  }
}

TEST(QuantRecipeTest, HeadEmbeddingAndKeptTensors) {
  RecipeModel m{"qwen2", 24, 14, 2, 0, true};
  for (QuantRecipe r :
       {QuantRecipe::kQ4_K_M, QuantRecipe::kQ4_K_S, QuantRecipe::kQ5_K_M, QuantRecipe::kQ5_K_S}) {
    m.has_output = true;
    EXPECT_EQ(TypeOf(r, m, "output.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(TypeOf(r, m, "token_embd.weight"), RecipeBaseType(r));
    m.has_output = false;  // tied: the embedding is the head
    EXPECT_EQ(TypeOf(r, m, "token_embd.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(TypeOf(r, m, "token_embd.weight", 896), GgmlType::kQ8_0);
    for (const char* kept : {"blk.0.attn_norm.weight", "blk.0.attn_q_norm.weight",
                             "blk.0.ffn_gate_inp.weight", "blk.0.attn_q.bias"})
      EXPECT_EQ(TypeOf(r, m, kept), GgmlType::kF16) << kept;
    auto vector = RecipeTensorType(r, m, "rope_freqs.weight", {64}, GgmlType::kF32);
    ASSERT_TRUE(vector.ok());
    EXPECT_EQ(*vector, GgmlType::kF32);
  }
  EXPECT_EQ(RecipeFileType(QuantRecipe::kQ4_K_S), 14u);
  EXPECT_EQ(RecipeFileType(QuantRecipe::kQ4_K_M), 15u);
  EXPECT_EQ(RecipeFileType(QuantRecipe::kQ5_K_S), 16u);
  EXPECT_EQ(RecipeFileType(QuantRecipe::kQ5_K_M), 17u);
  EXPECT_EQ(ParseQuantRecipe("Q4_K_M"), QuantRecipe::kQ4_K_M);
  EXPECT_FALSE(ParseQuantRecipe("q4_k").has_value());
}

TEST(QuantRecipeTest, EightExpertsSeventyBAndFusedQkv) {
  // Exactly 8 experts: attn_v / attn_k Q8_0, attn_output Q5_K in the Q4_K recipes; the experts'
  // ffn_down_exps follow the layer rule, read from the name.
  RecipeModel moe{"qwen3moe", 16, 32, 4, 8, true};
  for (QuantRecipe r : {QuantRecipe::kQ4_K_M, QuantRecipe::kQ4_K_S, QuantRecipe::kQ5_K_M}) {
    EXPECT_EQ(LayersOf(r, moe, "attn_v", GgmlType::kQ8_0).size(), 16u);
    EXPECT_EQ(LayersOf(r, moe, "attn_k", GgmlType::kQ8_0).size(), 16u);
  }
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, moe, Blk(5, "attn_output")), GgmlType::kQ5_K);
  EXPECT_EQ(TypeOf(QuantRecipe::kQ5_K_M, moe, Blk(5, "attn_output")), GgmlType::kQ5_K);
  EXPECT_EQ(LayersOf(QuantRecipe::kQ4_K_M, moe, "ffn_down_exps", GgmlType::kQ6_K),
            (std::set<int32_t>{0, 1, 4, 7, 10, 13, 14, 15}));
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, moe, Blk(5, "ffn_gate_exps")), GgmlType::kQ4_K);
  moe.num_experts = 128;  // no 8-expert rules
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, moe, Blk(5, "attn_v")), GgmlType::kQ4_K);
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, moe, Blk(5, "attn_k")), GgmlType::kQ4_K);
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, moe, Blk(5, "attn_output")), GgmlType::kQ4_K);

  // A 70B (llama with 80 layers and GQA, qwen2 with 80): attn_v Q4_K becomes Q5_K.
  for (const auto& [m, raised] : {std::pair{RecipeModel{"llama", 80, 64, 8, 0, true}, true},
                                  {RecipeModel{"llama", 80, 64, 64, 0, true}, false},
                                  {RecipeModel{"qwen2", 80, 64, 8, 0, true}, true},
                                  {RecipeModel{"qwen3", 80, 64, 8, 0, true}, false}}) {
    const GgmlType want = raised ? GgmlType::kQ5_K : GgmlType::kQ4_K;
    EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, m, Blk(11, "attn_v")), want) << m.arch;
    EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, m, Blk(12, "attn_v")), GgmlType::kQ6_K) << m.arch;
    EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_S, m, Blk(11, "attn_v")), want) << m.arch;
    EXPECT_EQ(TypeOf(QuantRecipe::kQ5_K_M, m, Blk(11, "attn_v")), GgmlType::kQ5_K) << m.arch;
  }

  const RecipeModel phi3{"phi3", 32, 32, 32, 0, true};
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, phi3, Blk(3, "attn_qkv")), GgmlType::kQ5_K);
  EXPECT_EQ(TypeOf(QuantRecipe::kQ5_K_M, phi3, Blk(3, "attn_qkv")), GgmlType::kQ6_K);
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_S, phi3, Blk(3, "attn_qkv")), GgmlType::kQ4_K);
  EXPECT_EQ(TypeOf(QuantRecipe::kQ5_K_S, phi3, Blk(3, "attn_qkv")), GgmlType::kQ5_K);
}

TEST(QuantRecipeTest, RowsNotWholeBlocksFallBack) {
  const RecipeModel m{"llama", 2, 8, 4, 0, true};
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, m, Blk(0, "attn_q"), 128), GgmlType::kQ5_0);
  EXPECT_EQ(TypeOf(QuantRecipe::kQ5_K_M, m, Blk(0, "attn_q"), 128), GgmlType::kQ5_1);
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, m, Blk(1, "attn_v"), 128), GgmlType::kQ8_0);  // Q6_K
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, m, "output.weight", 128), GgmlType::kQ8_0);
  EXPECT_EQ(TypeOf(QuantRecipe::kQ4_K_M, m, Blk(0, "attn_q"), 48), GgmlType::kF16);
  auto head = RecipeTensorType(QuantRecipe::kQ4_K_M, m, "output.weight", {512, 48}, GgmlType::kF32);
  ASSERT_FALSE(head.ok());
  EXPECT_NE(head.message().find("GGUF tensor 'output.weight': rows of 48 values are not whole "
                                "Q8_0 blocks"),
            std::string::npos)
      << head.message();
}

// The f32 values of a GGUF tensor.
std::vector<float> Values(const GgufTensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.num_elements()));
  for (int64_t r = 0; r < t.num_rows(); ++r)
    DequantizeRow(t.type, t.data + r * t.row_bytes(), t.row_length(),
                  out.data() + r * t.row_length());
  return out;
}

TEST(QuantRecipeTest, EqualsLlamaQuantizeTypesAndBlocks) {
  const std::string dir = testing::FixturesDir() + "/gguf";
  EMBER_REQUIRE_DIR(dir);
  auto f16 = GgufFile::Open(dir + "/small-k-f16.gguf");
  ASSERT_TRUE(f16.ok()) << f16.message();
  auto config = GgufModelConfig(*f16);
  ASSERT_TRUE(config.ok()) << config.message();
  auto arch = f16->GetString("general.architecture");
  ASSERT_TRUE(arch.ok());
  const RecipeModel m{std::string(*arch),  config->num_layers,
                      config->num_heads,   config->num_kv_heads,
                      config->num_experts, f16->FindTensor("output.weight") != nullptr};
  std::map<GgmlType, int> compared;
  for (const auto& [file, recipe] : {std::pair{"small-k-q4_k_m.gguf", QuantRecipe::kQ4_K_M},
                                     {"small-k-q5_k_m.gguf", QuantRecipe::kQ5_K_M}}) {
    auto want = GgufFile::Open(dir + "/" + file);
    ASSERT_TRUE(want.ok()) << want.message();
    auto file_type = want->GetUint32("general.file_type");
    ASSERT_TRUE(file_type.ok());
    EXPECT_EQ(*file_type, RecipeFileType(recipe));
    ASSERT_EQ(want->tensors().size(), f16->tensors().size());
    for (const GgufTensorInfo& src : f16->tensors()) {
      const GgufTensorInfo* dst = want->FindTensor(src.name);
      ASSERT_NE(dst, nullptr) << src.name;
      auto type = RecipeTensorType(recipe, m, src.name, src.row_major_shape(), src.type);
      ASSERT_TRUE(type.ok()) << type.message();
      EXPECT_EQ(GgmlTypeName(*type), GgmlTypeName(dst->type)) << file << " " << src.name;
      if (*type != dst->type) continue;
      const std::vector<uint8_t> got = QuantizeGgmlRows(Values(src), src.row_length(), *type, 2);
      ASSERT_EQ(got.size(), dst->nbytes) << src.name;
      EXPECT_EQ(0, std::memcmp(got.data(), dst->data, got.size())) << file << " " << src.name;
      ++compared[*type];
    }
  }
  EXPECT_GT(compared[GgmlType::kQ4_K], 0);
  EXPECT_GT(compared[GgmlType::kQ5_K], 0);
  EXPECT_GT(compared[GgmlType::kQ6_K], 0);
}

}  // namespace
}  // namespace ember
