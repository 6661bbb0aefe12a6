// config.json parsing (both transformers layouts), generation defaults, and the loader's errors
// for bad folders and corrupt safetensors: each names the file and what is wrong.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <numeric>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/cuda_loader.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "util/half.h"
#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember {
namespace {

using json = nlohmann::json;

std::string ModelDir(const std::string& name) {
  return ember::testing::FixturesDir() + "/models/" + name;
}

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "ember_loader_XXXXXX";
  CHECK(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

ModelConfig ParseFile(const std::string& path) {
  auto text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.message();
  auto c = ParseModelConfig(*text, path);
  EXPECT_TRUE(c.ok()) << c.message();
  return c.ok() ? *c : ModelConfig{};
}

TEST(ConfigTest, V4AndV5LayoutsAgree) {
  for (const char* name : {"llama3", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "mistral", "phi3",
                           "gemma2", "gemma3"}) {
    EMBER_REQUIRE_DIR(ModelDir(name));
    ModelConfig a = ParseFile(ModelDir(name) + "/config.json");
    ModelConfig b = ParseFile(ModelDir(name) + "/config.v4.json");
    EXPECT_EQ(a.model_type, b.model_type) << name;
    EXPECT_EQ(a.head_dim, b.head_dim) << name;
    EXPECT_EQ(a.rotary_dim, b.rotary_dim) << name;
    EXPECT_EQ(a.rope.type, b.rope.type) << name;
    EXPECT_EQ(a.rope.theta, b.rope.theta) << name;
    EXPECT_EQ(a.rope.factor, b.rope.factor) << name;
    EXPECT_EQ(a.rope_local.theta, b.rope_local.theta) << name;
    EXPECT_EQ(a.sliding_window, b.sliding_window) << name;
    EXPECT_EQ(a.layer_types, b.layer_types) << name;
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings) << name;
    EXPECT_EQ(a.torch_dtype, b.torch_dtype) << name;
    EXPECT_EQ(a.num_experts, b.num_experts) << name;
    EXPECT_EQ(a.moe_layers, b.moe_layers) << name;
  }
}

TEST(ConfigTest, MixtureOfExperts) {
  EMBER_REQUIRE_DIR(ModelDir("qwen3_moe"));
  ModelConfig moe = ParseFile(ModelDir("qwen3_moe") + "/config.json");
  EXPECT_EQ(moe.num_experts, 8);
  EXPECT_EQ(moe.num_experts_per_tok, 2);
  EXPECT_EQ(moe.moe_intermediate_size, 32);
  EXPECT_TRUE(moe.norm_topk_prob);
  EXPECT_TRUE(moe.qk_norm);
  EXPECT_EQ(moe.moe_layers, (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(ParseFile(ModelDir("qwen3") + "/config.json").num_experts, 0);
  // 4.x spelling (num_experts), dense layers by mlp_only_layers and decoder_sparse_step.
  const std::string base = R"({"model_type": "qwen3_moe", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2,
      "moe_intermediate_size": 4, )";
  auto c = ParseModelConfig(base + R"("num_experts": 4, "num_experts_per_tok": 2,
      "decoder_sparse_step": 2, "mlp_only_layers": [3]})", "c.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->num_experts, 4);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_EQ(c->moe_layers, (std::vector<uint8_t>{0, 1, 0, 0}));
  c = ParseModelConfig(base + R"("num_experts": 4, "num_experts_per_tok": 5})", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("num_experts_per_tok"), std::string::npos) << c.message();
  c = ParseModelConfig(base + R"("num_experts_per_tok": 2})", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("num_local_experts"), std::string::npos) << c.message();
  c = ParseModelConfig(base + R"("num_experts": 4, "num_experts_per_tok": 2,
      "mlp_only_layers": "all"})", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("mlp_only_layers"), std::string::npos) << c.message();
}

// deepseek_v3: both fixture layouts, the MLA dims (head_dim and rotary_dim become the rope
// dims), the grouped router, dense layers before first_k_dense_replace; a Hub-style config with
// YaRN (DeepSeek-V3's own numbers): softmax scale 1/sqrt(nope + rope) * mscale(40, 1)^2, the
// rope's attention factor mscale / mscale_all_dim = 1, q_lora_rank null.
TEST(ConfigTest, DeepseekV3) {
  EMBER_REQUIRE_DIR(ModelDir("deepseek_v3"));
  for (const char* file : {"/config.json", "/config.v4.json"}) {
    ModelConfig c = ParseFile(ModelDir("deepseek_v3") + file);
    EXPECT_TRUE(c.mla()) << file;
    EXPECT_EQ(c.q_lora_rank, 32) << file;
    EXPECT_EQ(c.kv_lora_rank, 16) << file;
    EXPECT_EQ(c.head_dim, 8) << file;
    EXPECT_EQ(c.rotary_dim, 8) << file;
    EXPECT_TRUE(c.rope_interleave) << file;
    EXPECT_FLOAT_EQ(c.attention_scale, static_cast<float>(1.0 / std::sqrt(24.0))) << file;
    EXPECT_EQ(c.moe_routing, MoeRouting::kSigmoidGrouped) << file;
    EXPECT_EQ(c.num_experts, 8) << file;
    EXPECT_EQ(c.moe_groups, 2) << file;
    EXPECT_EQ(c.moe_top_groups, 1) << file;
    EXPECT_EQ(c.moe_shared_experts, 1) << file;
    EXPECT_FLOAT_EQ(c.moe_routed_scale, 2.5f) << file;
    EXPECT_EQ(c.moe_layers, (std::vector<uint8_t>{0, 1, 1})) << file;
  }
  const std::string base = R"({"model_type": "deepseek_v3", "vocab_size": 10, "hidden_size": 7168,
      "intermediate_size": 8, "num_hidden_layers": 4, "num_attention_heads": 128,
      "q_lora_rank": null, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "n_routed_experts": 256, "num_experts_per_tok": 8,
      "moe_intermediate_size": 2048, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
      "max_position_embeddings": 163840, )";
  auto c = ParseModelConfig(base + R"("rope_theta": 10000, "rope_scaling": {"type": "yarn",
      "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
      "original_max_position_embeddings": 4096}})",
                            "c.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->q_lora_rank, 0);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->rotary_dim, 64);
  EXPECT_EQ(c->rope.type, "yarn");
  EXPECT_NEAR(c->rope.attention_factor, 1.0, 1e-12);
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_FLOAT_EQ(c->attention_scale,
                  static_cast<float>(mscale * mscale / std::sqrt(192.0)));
  EXPECT_EQ(c->moe_layers, (std::vector<uint8_t>{0, 0, 0, 1}));
  c = ParseModelConfig(base + R"("n_group": 3})", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("n_group"), std::string::npos) << c.message();
}

TEST(ConfigTest, GptOss) {
  EMBER_REQUIRE_DIR(ModelDir("gpt_oss"));
  for (const char* file : {"/config.json", "/config.v4.json"}) {
    ModelConfig c = ParseFile(ModelDir("gpt_oss") + file);
    EXPECT_EQ(c.rope.type, "yarn") << file;
    EXPECT_EQ(c.rope.factor, 32.0) << file;  // explicit, not max_position_embeddings / 4096
    EXPECT_EQ(c.rope.original_max_position_embeddings, 4096) << file;
    EXPECT_FALSE(c.rope.truncate) << file;
    EXPECT_NEAR(c.rope.attention_factor, 0.1 * std::log(32.0) + 1.0, 1e-12) << file;
    EXPECT_TRUE(c.attention_bias && c.o_bias && c.attention_sinks) << file;
    EXPECT_EQ(c.num_experts, 4) << file;
    EXPECT_EQ(c.num_experts_per_tok, 2) << file;
    EXPECT_EQ(c.moe_intermediate_size, c.intermediate_size) << file;
    EXPECT_TRUE(c.norm_topk_prob && c.moe_biased) << file;
    EXPECT_EQ(c.moe_activation, MoeActivation::kClampedSwiglu) << file;
    EXPECT_EQ(c.swiglu_limit, 7.0f) << file;
    EXPECT_EQ(c.moe_layers, (std::vector<uint8_t>{1, 1})) << file;
    EXPECT_EQ(c.layer_types,
              (std::vector<LayerType>{LayerType::kSlidingAttention, LayerType::kFullAttention}))
        << file;
  }
  // Hub checkpoints: experts_per_token, no layer_types (even layers slide), mscale pair.
  const std::string base = R"({"model_type": "gpt_oss", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 3, "num_attention_heads": 2,
      "num_local_experts": 4, "sliding_window": 4, )";
  auto c = ParseModelConfig(base + R"("experts_per_token": 3, "rope_scaling": {"rope_type":
      "yarn", "factor": 4.0, "mscale": 2.0, "mscale_all_dim": 1.0}})",
                            "c.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->num_experts_per_tok, 3);
  EXPECT_EQ(c->layer_types,
            (std::vector<LayerType>{LayerType::kSlidingAttention, LayerType::kFullAttention,
                                    LayerType::kSlidingAttention}));
  EXPECT_NEAR(c->rope.attention_factor, (0.2 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1),
              1e-12);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096);  // max_position_embeddings' default
  EXPECT_TRUE(c->rope.truncate);
  c = ParseModelConfig(base + R"("num_experts_per_tok": 2, "quantization_config":
      {"quant_method": "mxfp4"}})",
                       "c.json");
  EXPECT_TRUE(c.ok()) << c.message();  // OpenAI's checkpoints: MXFP4 experts
  c = ParseModelConfig(base + R"("num_experts_per_tok": 2, "quantization_config":
      {"quant_method": "awq"}})",
                       "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("awq"), std::string::npos) << c.message();
  c = ParseModelConfig(base + R"("num_experts_per_tok": 5})", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("num_experts_per_tok"), std::string::npos) << c.message();
}

TEST(ConfigTest, Qwen3Next) {
  EMBER_REQUIRE_DIR(ModelDir("qwen3_next"));
  using LT = LayerType;
  for (const char* file : {"/config.json", "/config.v4.json"}) {
    ModelConfig c = ParseFile(ModelDir("qwen3_next") + file);
    EXPECT_EQ(c.layer_types, (std::vector<LT>{LT::kLinearAttention, LT::kLinearAttention,
                                              LT::kLinearAttention, LT::kFullAttention}))
        << file;
    EXPECT_EQ(c.rotary_dim, 4) << file;  // partial_rotary_factor 0.25 of head_dim 16
    EXPECT_EQ(c.linear.num_key_heads, 2) << file;
    EXPECT_EQ(c.linear.num_value_heads, 4) << file;
    EXPECT_EQ(c.linear.conv_dim(), 2 * 2 * 16 + 4 * 16) << file;
    EXPECT_EQ(c.shared_expert_intermediate_size, 32) << file;
    EXPECT_TRUE(c.attn_output_gate && c.qk_norm && c.norm_topk_prob) << file;
    EXPECT_EQ(c.moe_layers, (std::vector<uint8_t>{1, 1, 1, 1})) << file;
    EXPECT_EQ(KvLayerCount(c), 1) << file;
    EXPECT_EQ(KvLayerIndex(c, 3), 0) << file;
    EXPECT_EQ(KvLayerIndex(c, 0), -1) << file;
    EXPECT_EQ(RecurrentStateFloats(c), 3 * (3 * 128 + 4 * 16 * 16)) << file;
  }
  // Hub (4.x) checkpoints without layer_types: every full_attention_interval-th layer is full;
  // mlp_only_layers and decoder_sparse_step choose the dense layers.
  auto c = ParseModelConfig(R"({"model_type": "qwen3_next", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 4, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 4, "full_attention_interval": 2,
      "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 4,
      "linear_value_head_dim": 4, "num_experts": 2, "num_experts_per_tok": 1,
      "moe_intermediate_size": 4, "shared_expert_intermediate_size": 4,
      "decoder_sparse_step": 1, "mlp_only_layers": [2]})",
                            "c.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->layer_types, (std::vector<LT>{LT::kLinearAttention, LT::kFullAttention,
                                             LT::kLinearAttention, LT::kFullAttention}));
  EXPECT_EQ(c->moe_layers, (std::vector<uint8_t>{1, 1, 0, 1}));
  EXPECT_EQ(c->linear.conv_kernel, 4);  // linear_conv_kernel_dim's default
  // Value heads must be a multiple of the key heads.
  auto bad = ParseModelConfig(R"({"model_type": "qwen3_next", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 4, "num_attention_heads": 2,
      "linear_num_key_heads": 2, "linear_num_value_heads": 3, "linear_key_head_dim": 4,
      "linear_value_head_dim": 4})",
                              "c.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("linear_num_value_heads"), std::string::npos) << bad.message();
  // A cut with no full-attention layer left (2 layers, every 4th full) is refused at the config.
  auto cut = ParseModelConfig(R"({"model_type": "qwen3_next", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
      "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 4,
      "linear_value_head_dim": 4})",
                              "c.json");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.message().find("num_hidden_layers"), std::string::npos) << cut.message();
  EXPECT_NE(cut.message().find("no attention layer"), std::string::npos) << cut.message();
}

TEST(ConfigTest, FamilyFeatures) {
  EMBER_REQUIRE_DIR(ModelDir("gemma3"));
  ModelConfig llama = ParseFile(ModelDir("llama3") + "/config.v4.json");
  EXPECT_EQ(llama.rope.type, "llama3");
  EXPECT_EQ(llama.rope.factor, 8.0);
  EXPECT_EQ(llama.rope.original_max_position_embeddings, 64);
  EXPECT_FALSE(llama.tie_word_embeddings);
  ModelConfig qwen3 = ParseFile(ModelDir("qwen3") + "/config.json");
  EXPECT_EQ(qwen3.head_dim, 32);  // explicit, != hidden / heads
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_TRUE(ParseFile(ModelDir("qwen2") + "/config.json").attention_bias);
  ModelConfig phi3 = ParseFile(ModelDir("phi3") + "/config.v4.json");
  EXPECT_EQ(phi3.rotary_dim, 8);
  EXPECT_TRUE(phi3.fused_qkv);
  ModelConfig mistral = ParseFile(ModelDir("mistral") + "/config.json");
  EXPECT_EQ(mistral.sliding_window, 16);
  EXPECT_EQ(mistral.layer_types[0], LayerType::kSlidingAttention);
  ModelConfig gemma2 = ParseFile(ModelDir("gemma2") + "/config.v4.json");
  EXPECT_EQ(gemma2.layer_types, (std::vector<LayerType>{LayerType::kSlidingAttention, LayerType::kFullAttention}));
  EXPECT_FLOAT_EQ(gemma2.attn_logit_softcapping, 50.0f);
  EXPECT_FLOAT_EQ(gemma2.final_logit_softcapping, 30.0f);
  EXPECT_FLOAT_EQ(gemma2.embedding_scale, 8.0f);
  ModelConfig gemma3 = ParseFile(ModelDir("gemma3") + "/config.v4.json");
  EXPECT_EQ(gemma3.rope.theta, 1000000.0);
  EXPECT_EQ(gemma3.rope_local.theta, 10000.0);
  EXPECT_EQ(gemma3.layer_types[2], LayerType::kSlidingAttention);
  EXPECT_EQ(gemma3.layer_types[3], LayerType::kFullAttention);
  EXPECT_TRUE(gemma3.gelu_tanh);
}

TEST(ConfigTest, UnsupportedModelTypeNamesTheSupportedOnes) {
  auto c = ParseModelConfig(R"({"model_type": "mamba", "vocab_size": 10})", "x/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("x/config.json"), std::string::npos) << c.message();
  EXPECT_NE(c.message().find("\"mamba\""), std::string::npos) << c.message();
  EXPECT_NE(c.message().find("gemma3_text"), std::string::npos) << c.message();
}

TEST(ConfigTest, MissingOrBadFieldsAreNamed) {
  auto c = ParseModelConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8})", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("intermediate_size"), std::string::npos) << c.message();
  c = ParseModelConfig(
      R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"rope_type": "longrope", "factor": 4}})",
      "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("longrope"), std::string::npos) << c.message();
  c = ParseModelConfig(R"({"model_type": "llama", "vocab_size": "many"})", "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("vocab_size"), std::string::npos) << c.message();
}

TEST(ConfigTest, GenerationDefaults) {
  ModelConfig c;
  c.eos_token_ids = {2};
  auto g = ParseGenerationConfig(R"({"temperature": 0.6, "top_k": 20, "eos_token_id": [7, 8]})", "g.json", c);
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_FLOAT_EQ(*g->temperature, 0.6f);
  EXPECT_EQ(*g->top_k, 20);
  EXPECT_FALSE(g->top_p.has_value());
  EXPECT_EQ(g->eos_token_ids, (std::vector<int32_t>{7, 8}));
  auto fallback = ParseGenerationConfig("", "g.json", c);
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->eos_token_ids, (std::vector<int32_t>{2}));
}

TEST(LoaderTest, MissingFolderAndFiles) {
  auto m = Model::Load("/nonexistent/model", {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("/nonexistent/model"), std::string::npos);
  std::string dir = TempDir();
  m = Model::Load(dir, {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("config.json"), std::string::npos) << m.message();
  EMBER_REQUIRE_DIR(ModelDir("qwen2"));
  ASSERT_TRUE(WriteStringToFile(dir + "/config.json", *ReadFileToString(ModelDir("qwen2") + "/config.json")).ok());
  m = Model::Load(dir, {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("model.safetensors"), std::string::npos) << m.message();
}

// Writes a safetensors file from a raw header and data size.
std::string WriteRaw(const std::string& dir, const std::string& header, size_t data_bytes,
                     uint64_t claimed_len = 0) {
  std::string path = dir + "/model.safetensors";
  std::string bytes(8, '\0');
  uint64_t len = claimed_len ? claimed_len : header.size();
  std::memcpy(bytes.data(), &len, 8);
  bytes += header + std::string(data_bytes, '\0');
  CHECK(WriteStringToFile(path, bytes).ok());
  return path;
}

TEST(SafetensorsTest, CorruptFilesAreRejectedWithTheFileNamed) {
  std::string dir = TempDir();
  struct Case {
    std::string header;
    size_t data;
    uint64_t claimed;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8, 1 << 20, "header length"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8, 0, "past the end"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12, 0, "overlapping"},
      {R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8, 0, "does not match its shape"},
      {R"({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", 8, 0, "unsupported dtype"},
      {R"(not json)", 0, 0, "not a JSON object"},
  };
  for (const Case& c : cases) {
    std::string path = WriteRaw(dir, c.header, c.data, c.claimed);
    auto store = WeightStore::OpenFile(path);
    ASSERT_FALSE(store.ok()) << c.expect;
    EXPECT_NE(store.message().find(path), std::string::npos) << store.message();
    EXPECT_NE(store.message().find(c.expect), std::string::npos) << store.message();
  }
  ASSERT_TRUE(WriteStringToFile(dir + "/model.safetensors", "abc").ok());
  auto store = WeightStore::OpenFile(dir + "/model.safetensors");
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.message().find("truncated"), std::string::npos) << store.message();
}

TEST(LoaderTest, TruncatedShardAndShapeMismatch) {
  EMBER_REQUIRE_DIR(ModelDir("llama3"));
  // A copy of the sharded llama3 folder whose last shard lost its tail.
  std::string dir = TempDir();
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors.index.json",
                        "model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors",
                        "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
                        "model-00005-of-00005.safetensors"}) {
    std::string text = *ReadFileToString(ModelDir("llama3") + "/" + f);
    if (std::string(f) == "model-00003-of-00005.safetensors") text.resize(text.size() - 100);
    ASSERT_TRUE(WriteStringToFile(dir + "/" + f, text).ok());
  }
  auto m = Model::Load(dir, {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("model-00003-of-00005.safetensors"), std::string::npos) << m.message();
  // Intact shards, but config.json says a different intermediate_size.
  std::string good = *ReadFileToString(ModelDir("llama3") + "/model-00003-of-00005.safetensors");
  ASSERT_TRUE(WriteStringToFile(dir + "/model-00003-of-00005.safetensors", good).ok());
  ASSERT_TRUE(Model::Load(dir, {}).ok());
  json config = json::parse(*ReadFileToString(ModelDir("llama3") + "/config.json"));
  config["intermediate_size"] = 96;
  ASSERT_TRUE(WriteStringToFile(dir + "/config.json", config.dump()).ok());
  m = Model::Load(dir, {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("mlp."), std::string::npos) << m.message();
  EXPECT_NE(m.message().find("config.json implies"), std::string::npos) << m.message();
}

// One prefill of `tokens` on a freshly loaded model: every logit of the last row is finite.
void ExpectFiniteLogits(Model& m, const std::vector<int32_t>& tokens) {
  ASSERT_TRUE(m.AllocateKvCache(4, 16).ok());
  BatchPlan plan;
  plan.AddSequence(tokens, 0, {0, 1}, true);
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  ASSERT_TRUE(m.Forward(plan, logits).ok());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST(SynthTest, TinyPresetLoadsAndRuns) {
  std::string dir = TempDir() + "/tiny";
  SynthOptions opts;
  opts.preset = "tiny-llama";
  opts.out_dir = dir;
  opts.dtype = DType::kF16;
  opts.max_shard_bytes = 40000;  // force shards + index
  ASSERT_TRUE(WriteSynthCheckpoint(opts).ok());
  EXPECT_TRUE(FileExists(dir + "/model.safetensors.index.json"));
  auto m = Model::Load(dir, {});
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ((*m)->config().rope.type, "llama3");
  EXPECT_TRUE((*m)->config().tie_word_embeddings);
  EXPECT_EQ((*m)->generation_defaults().eos_token_ids, (std::vector<int32_t>{2}));
  ExpectFiniteLogits(**m, {1, 2, 3, 4, 5});
  opts.preset = "gpt-5";
  Status st = WriteSynthCheckpoint(opts);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("llama-3.2-1b"), std::string::npos) << st.message();
}

// The MoE preset, cut to one layer by num_layers: loads as qwen3_moe and runs on the CPU.
TEST(SynthTest, MoePresetWithFewerLayers) {
  std::string dir = TempDir() + "/moe";
  SynthOptions opts;
  opts.preset = "tiny-qwen3-moe";
  opts.out_dir = dir;
  opts.num_layers = 1;
  ASSERT_TRUE(WriteSynthCheckpoint(opts).ok());
  auto m = Model::Load(dir, {});
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ((*m)->config().model_type, "qwen3_moe");
  EXPECT_EQ((*m)->config().num_layers, 1);
  EXPECT_EQ((*m)->config().num_experts, 8);
  ExpectFiniteLogits(**m, {1, 2, 3, 4, 5});
  opts.num_layers = 3;
  Status st = WriteSynthCheckpoint(opts);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--layers 3"), std::string::npos) << st.message();
}

// gpt-oss's shapes on a toy body (fused experts, biases, sinks, layer_types cut to --layers).
TEST(SynthTest, GptOssPreset) {
  std::string dir = TempDir() + "/gpt_oss";
  SynthOptions opts;
  opts.preset = "tiny-gpt-oss";
  opts.out_dir = dir;
  opts.num_layers = 1;
  ASSERT_TRUE(WriteSynthCheckpoint(opts).ok());
  auto m = Model::Load(dir, {});
  ASSERT_TRUE(m.ok()) << m.message();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.model_type, "gpt_oss");
  EXPECT_EQ(c.layer_types, std::vector<LayerType>{LayerType::kSlidingAttention});
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ((*m)->generation_defaults().eos_token_ids,
            (std::vector<int32_t>{200002, 199999, 200012}));
  ExpectFiniteLogits(**m, {1, 2, 3, 4, 5});
}

// The qwen3_next and deepseek_v3 presets' tensor lists on toy bodies: they load (every tensor
// the loaders ask for, at its shape) and run on the CPU.
TEST(SynthTest, HybridAndMlaPresets) {
  for (const auto& [preset, type] : std::vector<std::pair<std::string, std::string>>{
           {"tiny-qwen3-next", "qwen3_next"}, {"tiny-deepseek-v3", "deepseek_v3"}}) {
    SCOPED_TRACE(preset);
    std::string dir = TempDir() + "/" + preset;
    SynthOptions opts;
    opts.preset = preset;
    opts.out_dir = dir;
    ASSERT_TRUE(WriteSynthCheckpoint(opts).ok());
    auto m = Model::Load(dir, {});
    ASSERT_TRUE(m.ok()) << m.message();
    EXPECT_EQ((*m)->config().model_type, type);
    ExpectFiniteLogits(**m, {1, 2, 3, 4, 5});
  }
}

// DeepSeek-V3's layout on a toy body; with mtp its multi-token-prediction module loads too (and
// without, the checkpoint declares one its folder lacks, as transformers' conversions do). The
// module (layer N) is a mixture of experts since N >= first_k_dense_replace (1), also where the
// body's only layer is dense.
TEST(SynthTest, DeepseekPresetWithMtp) {
  for (int layers : {1, 2})
    for (bool mtp : {false, true}) {
      std::string dir = TempDir() + (mtp ? "/deepseek_mtp" : "/deepseek") + std::to_string(layers);
      SynthOptions opts;
      opts.preset = "tiny-deepseek-v3";
      opts.out_dir = dir;
      opts.num_layers = layers;
      opts.mtp = mtp;
      ASSERT_TRUE(WriteSynthCheckpoint(opts).ok());
      auto m = Model::Load(dir, {});
      ASSERT_TRUE(m.ok()) << m.message();
      EXPECT_EQ((*m)->config().model_type, "deepseek_v3");
      EXPECT_EQ((*m)->config().num_nextn_predict_layers, 1);
      ModelLoadOptions module_opts;
      module_opts.mtp_module = true;
      auto module = Model::Load(dir, module_opts);
      EXPECT_EQ(module.ok(), mtp) << (module.ok() ? "" : module.message());
      if (mtp && module.ok()) {
        EXPECT_EQ((*module)->config().moe_layers, std::vector<uint8_t>{1});
      }
    }
  SynthOptions llama;
  llama.preset = "tiny-llama";
  llama.out_dir = TempDir() + "/llama_mtp";
  llama.mtp = true;
  EXPECT_FALSE(WriteSynthCheckpoint(llama).ok());
}

// One safetensors file of (name, dtype, shape, bytes) tensors.
struct RawTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
void WriteSafetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  const uint64_t len = text.size();
  std::string file(reinterpret_cast<const char*>(&len), 8);
  file += text;
  for (const RawTensor& t : tensors) file.append(t.bytes.begin(), t.bytes.end());
  ASSERT_TRUE(WriteStringToFile(path, file).ok());
}

// OpenAI's MXFP4 experts load as the bf16 checkpoint whose gate_up_proj / down_proj are their
// dequantization by transformers' rule (convert_moe_packed_tensors: E2M1 lookup, low nibble
// first, ldexp by scale - 127, then [E, out, in] transposed to [E, in, out]): same logits, bit for
// bit, so the packed layout, the row interleave and the transposes all agree.
TEST(SynthTest, Mxfp4ExpertsLoadAsTheirDequantization) {
  const std::string base = TempDir() + "/base";
  SynthOptions opts;
  opts.preset = "tiny-gpt-oss";
  opts.out_dir = base;
  ASSERT_TRUE(WriteSynthCheckpoint(opts).ok());
  auto store = WeightStore::Open(base);
  ASSERT_TRUE(store.ok()) << store.message();
  auto text = ReadFileToString(base + "/config.json");
  ASSERT_TRUE(text.ok());
  nlohmann::json config = nlohmann::json::parse(*text);
  const int64_t d = config["hidden_size"], inter = config["intermediate_size"];
  const int64_t num = config["num_local_experts"];
  std::vector<RawTensor> packed, reference;
  uint32_t rng = 12345;
  auto next = [&] { return rng = rng * 1664525u + 1013904223u; };
  static const float kE2M1[16] = {0,     0.5f,  1,  1.5f,  2,  3,  4,  6,
                                  -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (const std::string& name : (*store)->Names()) {
    auto view = (*store)->Get(name);
    ASSERT_TRUE(view.ok());
    const bool gate_up = name.ends_with("experts.gate_up_proj");
    if (!gate_up && !name.ends_with("experts.down_proj")) {
      const auto* p = static_cast<const uint8_t*>(view->data);
      RawTensor t{name, view->dtype, view->shape, std::vector<uint8_t>(p, p + view->nbytes)};
      packed.push_back(t);
      reference.push_back(t);
      continue;
    }
    const int64_t out = gate_up ? 2 * inter : d, k = gate_up ? d : inter, groups = k / 32;
    std::vector<uint8_t> blocks(static_cast<size_t>(num * out * groups * 16));
    std::vector<uint8_t> scales(static_cast<size_t>(num * out * groups));
    for (uint8_t& b : blocks) b = static_cast<uint8_t>(next() >> 24);
    // Scales around 2^-5, a few of 2^1..2^3 (both sides of the CUDA kernel's s = 128 edge between
    // its float-bits and fp16 paths), and a few of 2^-127..2^-125 (values below bf16's normal
    // range: its exact slow path).
    for (uint8_t& s : scales) {
      const uint32_t r = next() >> 24;
      s = static_cast<uint8_t>(r % 61 == 0 ? r % 3 : r % 53 == 1 ? 128 + r % 3 : 118 + r % 10);
    }
    // transformers: [E, out, in] dequantized, then transposed to [E, in, out].
    std::vector<uint8_t> deq(static_cast<size_t>(num * k * out) * 2);
    auto* dst = reinterpret_cast<uint16_t*>(deq.data());
    for (int64_t e = 0; e < num; ++e)
      for (int64_t r = 0; r < out; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const size_t blk = static_cast<size_t>((e * out + r) * groups + c / 32);
          const uint8_t byte = blocks[blk * 16 + static_cast<size_t>(c % 32 / 2)];
          const float v = std::ldexp(kE2M1[c % 2 == 0 ? byte & 15 : byte >> 4], scales[blk] - 127);
          dst[(e * k + c) * out + r] = F32ToBf16(v);
        }
    const std::string stem = name.substr(0, name.size() - std::string("_proj").size()) + "_proj";
    packed.push_back({stem + "_blocks", DType::kU8, {num, out, groups, 16}, blocks});
    packed.push_back({stem + "_scales", DType::kU8, {num, out, groups}, scales});
    reference.push_back({name, DType::kBF16, {num, k, out}, deq});
  }
  std::string dirs[2];
  for (int variant = 0; variant < 2; ++variant) {
    dirs[variant] = TempDir();
    nlohmann::json c = config;
    if (variant == 0) c["quantization_config"] = {{"quant_method", "mxfp4"}};
    ASSERT_TRUE(WriteStringToFile(dirs[variant] + "/config.json", c.dump()).ok());
    WriteSafetensors(dirs[variant] + "/model.safetensors", variant == 0 ? packed : reference);
  }
  // The CPU and the CUDA bf16 mode keep the packed experts (Backend::TakesMxfp4Experts) and
  // convert them as their MoE kernels load them (cpu::MatMulMxfp4, cuda/moe.cu), to the same
  // values: the same logits there too, for a 520-token prefill (130 pairs per expert: the
  // tensor-core experts' 128-pair tiles), a 40-token chunk (10: 64-pair tiles) and a decode step
  // (SIMT, or with EMBER_MOE_MMA=1 the 8-pair tiles).
  for (DeviceKind device : {DeviceKind::kCpu, DeviceKind::kCuda}) {
    if (device == DeviceKind::kCuda && CudaDevicesAvailable() == 0) {
      std::printf("no CUDA device: the packed-experts kernels are not tested here\n");
      continue;
    }
    SCOPED_TRACE(device == DeviceKind::kCpu ? "cpu" : "cuda");
    std::vector<float> logits[2][3];  // [variant][step]
    for (int variant = 0; variant < 2; ++variant) {
      ModelLoadOptions opts;
      opts.device = device;
      auto m = Model::Load(dirs[variant], opts);
      ASSERT_TRUE(m.ok()) << m.message();
      ASSERT_TRUE((*m)->AllocateKvCache(36, 16).ok());
      std::vector<int32_t> steps[3];
      for (int32_t i = 0; i < 561; ++i) steps[i < 520 ? 0 : i < 560 ? 1 : 2].push_back(1 + i % 997);
      std::vector<int32_t> blocks(36);
      std::iota(blocks.begin(), blocks.end(), 0);
      for (int step = 0, pos = 0; step < 3; pos += static_cast<int>(steps[step].size()), ++step) {
        BatchPlan plan;
        plan.AddSequence(steps[step], pos, blocks, true);
        logits[variant][step].resize(static_cast<size_t>((*m)->config().vocab_size));
        ASSERT_TRUE((*m)->Forward(plan, logits[variant][step]).ok());
      }
    }
    for (int step = 0; step < 3; ++step) {
      EXPECT_EQ(logits[0][step], logits[1][step]) << "step " << step;
      for (float v : logits[0][step]) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

// `ember synth --mxfp4`: a gpt_oss checkpoint with OpenAI's packed experts that loads and runs.
TEST(SynthTest, Mxfp4SynthLoadsAndRuns) {
  SynthOptions opts;
  opts.preset = "tiny-gpt-oss";
  opts.out_dir = TempDir() + "/mx";
  opts.mxfp4 = true;
  ASSERT_TRUE(WriteSynthCheckpoint(opts).ok());
  auto store = WeightStore::Open(opts.out_dir);
  ASSERT_TRUE(store.ok()) << store.message();
  EXPECT_TRUE((*store)->Has("model.layers.0.mlp.experts.gate_up_proj_blocks"));
  EXPECT_FALSE((*store)->Has("model.layers.0.mlp.experts.gate_up_proj"));
  auto m = Model::Load(opts.out_dir, {});
  ASSERT_TRUE(m.ok()) << m.message();
  ExpectFiniteLogits(**m, {1, 2, 3});
  opts.preset = "tiny-llama";
  opts.out_dir = TempDir() + "/mx2";
  const Status refused = WriteSynthCheckpoint(opts);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("--mxfp4"), std::string::npos) << refused.message();
}

}  // namespace
}  // namespace ember
