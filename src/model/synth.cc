#include "model/synth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "util/half.h"
#include "util/mapped_file.h"

namespace ember {
namespace {

using json = nlohmann::json;

struct Preset {
  std::string name;
  json config;      // config.json (transformers 4.x layout, as on the Hub)
  json generation;  // generation_config.json
};

json LlamaConfig(int hidden, int inter, int layers, int heads, int kv, int head_dim, bool tied,
                 double rope_factor) {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", 128256},
              {"hidden_size", hidden},
              {"intermediate_size", inter},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kv},
              {"head_dim", head_dim},
              {"hidden_act", "silu"},
              {"max_position_embeddings", 131072},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 500000.0},
              {"rope_scaling",
               {{"factor", rope_factor},
                {"high_freq_factor", 4.0},
                {"low_freq_factor", 1.0},
                {"original_max_position_embeddings", 8192},
                {"rope_type", "llama3"}}},
              {"attention_bias", false},
              {"mlp_bias", false},
              {"tie_word_embeddings", tied},
              {"bos_token_id", 128000},
              {"eos_token_id", 128001},
              {"torch_dtype", "bfloat16"}};
}

json Qwen3Config(int hidden, int inter, int layers, int heads, int kv, bool tied) {
  return json{{"architectures", {"Qwen3ForCausalLM"}},
              {"model_type", "qwen3"},
              {"vocab_size", 151936},
              {"hidden_size", hidden},
              {"intermediate_size", inter},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kv},
              {"head_dim", 128},
              {"hidden_act", "silu"},
              {"max_position_embeddings", 40960},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 1000000.0},
              {"rope_scaling", nullptr},
              {"attention_bias", false},
              {"use_sliding_window", false},
              {"sliding_window", nullptr},
              {"max_window_layers", layers},
              {"tie_word_embeddings", tied},
              {"bos_token_id", 151643},
              {"eos_token_id", 151645},
              {"torch_dtype", "bfloat16"}};
}

// Qwen3-MoE: Qwen3 attention, every MLP a mixture of `experts` experts of width `moe_inter`.
json Qwen3MoeConfig(int hidden, int layers, int heads, int kv, int experts, int top_k,
                    int moe_inter) {
  json c = Qwen3Config(hidden, 6144, layers, heads, kv, false);
  c["architectures"] = {"Qwen3MoeForCausalLM"};
  c["model_type"] = "qwen3_moe";
  c["num_experts"] = experts;
  c["num_experts_per_tok"] = top_k;
  c["moe_intermediate_size"] = moe_inter;
  c["norm_topk_prob"] = true;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = json::array();
  return c;
}

// gpt-oss: biased attention with sinks, alternating sliding (128) and full layers, YaRN rope,
// every MLP `experts` biased experts of width `hidden` (fused gate_up_proj, clamped SwiGLU).
json GptOssConfig(int layers, int experts) {
  json types = json::array();
  for (int l = 0; l < layers; ++l)
    types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  return json{{"architectures", {"GptOssForCausalLM"}},
              {"model_type", "gpt_oss"},
              {"vocab_size", 201088},
              {"hidden_size", 2880},
              {"intermediate_size", 2880},
              {"num_hidden_layers", layers},
              {"num_attention_heads", 64},
              {"num_key_value_heads", 8},
              {"head_dim", 64},
              {"hidden_act", "silu"},
              {"max_position_embeddings", 131072},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 150000.0},
              {"rope_scaling",
               {{"rope_type", "yarn"},
                {"factor", 32.0},
                {"beta_fast", 32.0},
                {"beta_slow", 1.0},
                {"original_max_position_embeddings", 4096},
                {"truncate", false}}},
              {"sliding_window", 128},
              {"layer_types", types},
              {"attention_bias", true},
              {"num_local_experts", experts},
              {"num_experts_per_tok", 4},
              {"experts_per_token", 4},
              {"swiglu_limit", 7.0},
              {"tie_word_embeddings", false},
              {"bos_token_id", 199998},
              {"eos_token_id", 200002},
              {"pad_token_id", 199999},
              {"torch_dtype", "bfloat16"}};
}

// Qwen3-Next-80B-A3B: three gated DeltaNet layers then a gated full-attention layer, repeating;
// every MLP 512 experts (top 10) beside a sigmoid-gated shared expert.
json Qwen3NextConfig() {
  const int layers = 48;
  json types = json::array();
  for (int l = 0; l < layers; ++l)
    types.push_back(l % 4 == 3 ? "full_attention" : "linear_attention");
  return json{{"architectures", {"Qwen3NextForCausalLM"}},
              {"model_type", "qwen3_next"},
              {"vocab_size", 151936},
              {"hidden_size", 2048},
              {"intermediate_size", 5120},
              {"num_hidden_layers", layers},
              {"num_attention_heads", 16},
              {"num_key_value_heads", 2},
              {"head_dim", 256},
              {"hidden_act", "silu"},
              {"max_position_embeddings", 262144},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000000.0},
              {"rope_scaling", nullptr},
              {"partial_rotary_factor", 0.25},
              {"attention_bias", false},
              {"layer_types", types},
              {"linear_conv_kernel_dim", 4},
              {"linear_key_head_dim", 128},
              {"linear_value_head_dim", 128},
              {"linear_num_key_heads", 16},
              {"linear_num_value_heads", 32},
              {"num_experts", 512},
              {"num_experts_per_tok", 10},
              {"moe_intermediate_size", 512},
              {"shared_expert_intermediate_size", 512},
              {"norm_topk_prob", true},
              {"decoder_sparse_step", 1},
              {"mlp_only_layers", json::array()},
              {"tie_word_embeddings", false},
              {"bos_token_id", 151643},
              {"eos_token_id", 151645},
              {"torch_dtype", "bfloat16"}};
}

// DeepSeek-V3 (671B): multi-head latent attention (q LoRA 1536, latent 512 + rope 64), three
// dense layers then MoE layers of 256 experts (top 8 of 4 kept groups of 8) and a shared expert.
json DeepseekV3Config() {
  return json{{"architectures", {"DeepseekV3ForCausalLM"}},
              {"model_type", "deepseek_v3"},
              {"vocab_size", 129280},
              {"hidden_size", 7168},
              {"intermediate_size", 18432},
              {"num_hidden_layers", 61},
              {"num_attention_heads", 128},
              {"num_key_value_heads", 128},
              {"head_dim", 64},
              {"q_lora_rank", 1536},
              {"kv_lora_rank", 512},
              {"qk_nope_head_dim", 128},
              {"qk_rope_head_dim", 64},
              {"v_head_dim", 128},
              {"hidden_act", "silu"},
              {"max_position_embeddings", 163840},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000.0},
              {"rope_interleave", true},
              {"rope_scaling",
               {{"type", "yarn"},
                {"factor", 40.0},
                {"beta_fast", 32.0},
                {"beta_slow", 1.0},
                {"mscale", 1.0},
                {"mscale_all_dim", 1.0},
                {"original_max_position_embeddings", 4096}}},
              {"attention_bias", false},
              {"first_k_dense_replace", 3},
              {"moe_intermediate_size", 2048},
              {"n_routed_experts", 256},
              {"n_shared_experts", 1},
              {"num_experts_per_tok", 8},
              {"n_group", 8},
              {"topk_group", 4},
              {"norm_topk_prob", true},
              {"routed_scaling_factor", 2.5},
              {"num_nextn_predict_layers", 1},
              {"tie_word_embeddings", false},
              {"bos_token_id", 0},
              {"eos_token_id", 1},
              {"torch_dtype", "bfloat16"}};
}

// deepseek_v3's layout (multi-head latent attention, grouped sigmoid routing, shared experts,
// first_k_dense_replace dense layers) with one multi-token-prediction module declared, as in
// DeepSeek-V3's config; SynthOptions::mtp writes its tensors.
json DeepseekConfig(int hidden, int inter, int layers, int heads, int experts, int top_k,
                    int moe_inter, int vocab) {
  return json{{"architectures", {"DeepseekV3ForCausalLM"}},
              {"model_type", "deepseek_v3"},
              {"vocab_size", vocab},
              {"hidden_size", hidden},
              {"intermediate_size", inter},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", heads},
              {"hidden_act", "silu"},
              {"max_position_embeddings", 4096},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000.0},
              {"attention_bias", false},
              {"q_lora_rank", hidden / 2},
              {"kv_lora_rank", hidden / 4},
              {"qk_nope_head_dim", hidden / heads},
              {"qk_rope_head_dim", hidden / heads / 2},
              {"v_head_dim", hidden / heads},
              {"n_routed_experts", experts},
              {"num_experts_per_tok", top_k},
              {"moe_intermediate_size", moe_inter},
              {"n_group", 4},
              {"topk_group", 2},
              {"n_shared_experts", 1},
              {"first_k_dense_replace", 1},
              {"routed_scaling_factor", 2.5},
              {"norm_topk_prob", true},
              {"num_nextn_predict_layers", 1},
              {"tie_word_embeddings", false},
              {"bos_token_id", 0},
              {"eos_token_id", 1},
              {"torch_dtype", "bfloat16"}};
}

std::vector<Preset> Presets() {
  json llama_gen = {{"bos_token_id", 128000}, {"eos_token_id", {128001, 128008, 128009}},
                    {"do_sample", true}, {"temperature", 0.6}, {"top_p", 0.9}};
  json qwen_gen = {{"bos_token_id", 151643}, {"eos_token_id", {151645, 151643}},
                   {"pad_token_id", 151643}, {"do_sample", true}, {"temperature", 0.6},
                   {"top_k", 20}, {"top_p", 0.95}};
  json tiny = LlamaConfig(64, 128, 2, 4, 2, 16, true, 8.0);
  tiny["vocab_size"] = 512;
  tiny["max_position_embeddings"] = 1024;
  tiny["bos_token_id"] = 1;
  tiny["eos_token_id"] = 2;
  // Qwen3's real vocabulary (so qwen3's tokenizer and chat template fit) on a toy body: fast
  // enough for the server's chat tests.
  json tiny_qwen3 = Qwen3Config(64, 128, 2, 4, 2, true);
  tiny_qwen3["head_dim"] = 16;
  json tiny_qwen3_moe = Qwen3MoeConfig(64, 2, 4, 2, 8, 2, 32);
  tiny_qwen3_moe["head_dim"] = 16;
  json gpt_oss_gen = {{"bos_token_id", 199998},
                      {"eos_token_id", {200002, 199999, 200012}},
                      {"pad_token_id", 199999},
                      {"do_sample", true}};
  json tiny_gpt_oss = GptOssConfig(2, 8);
  for (const char* key : {"hidden_size", "intermediate_size"}) tiny_gpt_oss[key] = 64;
  tiny_gpt_oss["num_attention_heads"] = 4;
  tiny_gpt_oss["num_key_value_heads"] = 2;
  tiny_gpt_oss["head_dim"] = 16;
  tiny_gpt_oss["num_experts_per_tok"] = tiny_gpt_oss["experts_per_token"] = 2;
  // The qwen3_next preset's tensors on a toy body (its loader's checks).
  json tiny_next = Qwen3NextConfig();
  for (const auto& [key, value] :
       std::vector<std::pair<const char*, int>>{{"hidden_size", 64}, {"intermediate_size", 128},
                                                {"num_attention_heads", 4}, {"head_dim", 16},
                                                {"linear_key_head_dim", 16},
                                                {"linear_value_head_dim", 16},
                                                {"linear_num_key_heads", 2},
                                                {"linear_num_value_heads", 4}, {"num_experts", 4},
                                                {"num_experts_per_tok", 2},
                                                {"moe_intermediate_size", 32},
                                                {"shared_expert_intermediate_size", 32},
                                                {"vocab_size", 512}, {"num_hidden_layers", 4},
                                                {"max_position_embeddings", 1024}})
    tiny_next[key] = value;
  tiny_next["layer_types"].erase(tiny_next["layer_types"].begin() + 4, tiny_next["layer_types"].end());
  return {
      {"llama-3.2-1b", LlamaConfig(2048, 8192, 16, 32, 8, 64, true, 32.0), llama_gen},
      {"llama-3.2-3b", LlamaConfig(3072, 8192, 28, 24, 8, 128, true, 32.0), llama_gen},
      {"llama-3.1-8b", LlamaConfig(4096, 14336, 32, 32, 8, 128, false, 8.0), llama_gen},
      {"qwen3-0.6b", Qwen3Config(1024, 3072, 28, 16, 8, true), qwen_gen},
      {"qwen3-8b", Qwen3Config(4096, 12288, 36, 32, 8, false), qwen_gen},
      {"qwen3-30b-a3b", Qwen3MoeConfig(2048, 48, 32, 4, 128, 8, 768), qwen_gen},
      {"tiny-llama", tiny, json{{"bos_token_id", 1}, {"eos_token_id", 2}}},
      {"tiny-qwen3", tiny_qwen3, qwen_gen},
      {"tiny-qwen3-moe", tiny_qwen3_moe, qwen_gen},
      {"gpt-oss-20b", GptOssConfig(24, 32), gpt_oss_gen},
      {"gpt-oss-120b", GptOssConfig(36, 128), gpt_oss_gen},
      {"tiny-gpt-oss", tiny_gpt_oss, gpt_oss_gen},
      {"qwen3-next-80b-a3b", Qwen3NextConfig(), qwen_gen},
      {"deepseek-v3", DeepseekV3Config(), json{{"bos_token_id", 0}, {"eos_token_id", 1}}},
      {"tiny-qwen3-next", tiny_next, json{{"bos_token_id", 1}, {"eos_token_id", 2}}},
      {"tiny-deepseek-v3", DeepseekConfig(256, 512, 4, 8, 16, 4, 128, 4096),
       json{{"bos_token_id", 0}, {"eos_token_id", 1}}},
  };
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool is_norm = false;  // filled with ones
  // 0: the checkpoint's dtype; 1 / 2: MXFP4 blocks / scales (U8).
  int mxfp4 = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// One expert set's matrices (mlp.experts.E.*) and a dense MLP's (`prefix` + {gate,up,down}_proj).
void AddMlp(std::vector<TensorSpec>& t, const std::string& prefix, int64_t inter, int64_t d) {
  t.push_back({prefix + "gate_proj.weight", {inter, d}});
  t.push_back({prefix + "up_proj.weight", {inter, d}});
  t.push_back({prefix + "down_proj.weight", {d, inter}});
}
void AddExperts(std::vector<TensorSpec>& t, const std::string& p, int64_t experts, int64_t inter,
                int64_t d) {
  t.push_back({p + "mlp.gate.weight", {experts, d}});
  for (int64_t e = 0; e < experts; ++e)
    AddMlp(t, p + "mlp.experts." + std::to_string(e) + ".", inter, d);
}

// qwen3_next's layer l (model.cc's LoadLinearAttention / LoadGatedQuery / LoadSharedExpert).
void AddQwen3NextLayer(std::vector<TensorSpec>& t, const json& c, int64_t l) {
  const int64_t d = c["hidden_size"], heads = c["num_attention_heads"];
  const int64_t kv = c["num_key_value_heads"], hd = c["head_dim"];
  const std::string p = "model.layers." + std::to_string(l) + ".";
  t.push_back({p + "input_layernorm.weight", {d}, true});
  t.push_back({p + "post_attention_layernorm.weight", {d}, true});
  if (c["layer_types"][static_cast<size_t>(l)] == "linear_attention") {
    const int64_t kh = c["linear_num_key_heads"], vh = c["linear_num_value_heads"];
    const int64_t dk = c["linear_key_head_dim"], dv = c["linear_value_head_dim"];
    const int64_t kernel = c["linear_conv_kernel_dim"], conv = 2 * kh * dk + vh * dv;
    const std::string a = p + "linear_attn.";
    t.push_back({a + "in_proj_qkvz.weight", {2 * kh * dk + 2 * vh * dv, d}});
    t.push_back({a + "in_proj_ba.weight", {2 * vh, d}});
    t.push_back({a + "conv1d.weight", {conv, 1, kernel}});
    t.push_back({a + "A_log", {vh}});
    t.push_back({a + "dt_bias", {vh}});
    t.push_back({a + "norm.weight", {dv}, true});
    t.push_back({a + "out_proj.weight", {d, vh * dv}});
  } else {
    t.push_back({p + "self_attn.q_proj.weight", {2 * heads * hd, d}});
    t.push_back({p + "self_attn.k_proj.weight", {kv * hd, d}});
    t.push_back({p + "self_attn.v_proj.weight", {kv * hd, d}});
    t.push_back({p + "self_attn.o_proj.weight", {d, heads * hd}});
    t.push_back({p + "self_attn.q_norm.weight", {hd}, true});
    t.push_back({p + "self_attn.k_norm.weight", {hd}, true});
  }
  AddExperts(t, p, c["num_experts"], c["moe_intermediate_size"], d);
  AddMlp(t, p + "mlp.shared_expert.", c["shared_expert_intermediate_size"], d);
  t.push_back({p + "mlp.shared_expert_gate.weight", {1, d}});
}

// One deepseek_v3 decoder layer's tensors under prefix p (MLA; a mixture of experts unless dense).
void AddDeepseekLayer(const json& c, const std::string& p, bool dense, std::vector<TensorSpec>* t) {
  const int64_t d = c["hidden_size"], heads = c["num_attention_heads"];
  const int64_t q_lora = c["q_lora_rank"], kv_lora = c["kv_lora_rank"];
  const int64_t nope = c["qk_nope_head_dim"], rope = c["qk_rope_head_dim"], v = c["v_head_dim"];
  const std::string a = p + "self_attn.";
  t->push_back({p + "input_layernorm.weight", {d}, true});
  t->push_back({a + "q_a_proj.weight", {q_lora, d}});
  t->push_back({a + "q_a_layernorm.weight", {q_lora}, true});
  t->push_back({a + "q_b_proj.weight", {heads * (nope + rope), q_lora}});
  t->push_back({a + "kv_a_proj_with_mqa.weight", {kv_lora + rope, d}});
  t->push_back({a + "kv_a_layernorm.weight", {kv_lora}, true});
  t->push_back({a + "kv_b_proj.weight", {heads * (nope + v), kv_lora}});
  t->push_back({a + "o_proj.weight", {d, heads * v}});
  t->push_back({p + "post_attention_layernorm.weight", {d}, true});
  auto mlp = [&](const std::string& q, int64_t inter) {
    t->push_back({q + "gate_proj.weight", {inter, d}});
    t->push_back({q + "up_proj.weight", {inter, d}});
    t->push_back({q + "down_proj.weight", {d, inter}});
  };
  if (dense) return mlp(p + "mlp.", c["intermediate_size"].get<int64_t>());
  const int64_t experts = c["n_routed_experts"], moe_inter = c["moe_intermediate_size"];
  t->push_back({p + "mlp.gate.weight", {experts, d}});
  t->push_back({p + "mlp.gate.e_score_correction_bias", {experts}});
  for (int64_t e = 0; e < experts; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".", moe_inter);
  mlp(p + "mlp.shared_experts.", c["n_shared_experts"].get<int64_t>() * moe_inter);
}

// deepseek_v3's tensors; with `mtp` also its multi-token-prediction module, stored as the real
// checkpoint stores it: layer N = num_hidden_layers (a MoE block, enorm, hnorm, eh_proj,
// shared_head.norm; its embed_tokens and shared_head.head left out: they equal the main ones).
std::vector<TensorSpec> DeepseekTensors(const json& c, bool mtp) {
  const int64_t d = c["hidden_size"], vocab = c["vocab_size"], layers = c["num_hidden_layers"];
  const int64_t first_dense = c["first_k_dense_replace"];
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {vocab, d}});
  for (int64_t l = 0; l < layers; ++l)
    AddDeepseekLayer(c, "model.layers." + std::to_string(l) + ".", l < first_dense, &t);
  if (mtp) {
    const std::string p = "model.layers." + std::to_string(layers) + ".";
    AddDeepseekLayer(c, p, layers < first_dense, &t);
    t.push_back({p + "enorm.weight", {d}, true});
    t.push_back({p + "hnorm.weight", {d}, true});
    t.push_back({p + "eh_proj.weight", {d, 2 * d}});
    t.push_back({p + "shared_head.norm.weight", {d}, true});
  }
  t.push_back({"model.norm.weight", {d}, true});
  t.push_back({"lm_head.weight", {vocab, d}});
  return t;
}

std::vector<TensorSpec> TensorsOf(const json& c, bool mtp) {
  if (c["model_type"] == "deepseek_v3") return DeepseekTensors(c, mtp);
  const int64_t d = c["hidden_size"], inter = c["intermediate_size"], vocab = c["vocab_size"];
  const int64_t layers = c["num_hidden_layers"], heads = c["num_attention_heads"];
  const int64_t kv = c["num_key_value_heads"], hd = c["head_dim"];
  const bool moe = c["model_type"] == "qwen3_moe";
  const bool qwen3 = c["model_type"] == "qwen3" || moe;
  const bool gpt_oss = c["model_type"] == "gpt_oss";
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {vocab, d}});
  for (int64_t l = 0; l < layers; ++l) {
    if (c["model_type"] == "qwen3_next") {
      AddQwen3NextLayer(t, c, l);
      continue;
    }
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {d}, true});
    t.push_back({p + "self_attn.q_proj.weight", {heads * hd, d}});
    t.push_back({p + "self_attn.k_proj.weight", {kv * hd, d}});
    t.push_back({p + "self_attn.v_proj.weight", {kv * hd, d}});
    if (qwen3) {
      t.push_back({p + "self_attn.q_norm.weight", {hd}, true});
      t.push_back({p + "self_attn.k_norm.weight", {hd}, true});
    }
    t.push_back({p + "self_attn.o_proj.weight", {d, heads * hd}});
    t.push_back({p + "post_attention_layernorm.weight", {d}, true});
    if (gpt_oss) {
      for (auto [name, n] : {std::pair{"q", heads * hd}, {"k", kv * hd}, {"v", kv * hd}, {"o", d}})
        t.push_back({p + "self_attn." + name + "_proj.bias", {n}});
      t.push_back({p + "self_attn.sinks", {heads}});
      const int64_t experts = c["num_local_experts"];
      t.push_back({p + "mlp.router.weight", {experts, d}});
      t.push_back({p + "mlp.router.bias", {experts}});
      if (c.contains("quantization_config")) {  // MXFP4, [E, out, in / 32, 16] and scales
        const std::string q = p + "mlp.experts.";
        t.push_back({q + "gate_up_proj_blocks", {experts, 2 * inter, d / 32, 16}, false, 1});
        t.push_back({q + "gate_up_proj_scales", {experts, 2 * inter, d / 32}, false, 2});
        t.push_back({q + "down_proj_blocks", {experts, d, inter / 32, 16}, false, 1});
        t.push_back({q + "down_proj_scales", {experts, d, inter / 32}, false, 2});
      } else {
        t.push_back({p + "mlp.experts.gate_up_proj", {experts, d, 2 * inter}});
        t.push_back({p + "mlp.experts.down_proj", {experts, inter, d}});
      }
      t.push_back({p + "mlp.experts.gate_up_proj_bias", {experts, 2 * inter}});
      t.push_back({p + "mlp.experts.down_proj_bias", {experts, d}});
      continue;
    }
    if (moe) {
      const int64_t experts = c["num_experts"], moe_inter = c["moe_intermediate_size"];
      t.push_back({p + "mlp.gate.weight", {experts, d}});
      for (int64_t e = 0; e < experts; ++e) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        t.push_back({q + "gate_proj.weight", {moe_inter, d}});
        t.push_back({q + "up_proj.weight", {moe_inter, d}});
        t.push_back({q + "down_proj.weight", {d, moe_inter}});
      }
      continue;
    }
    t.push_back({p + "mlp.gate_proj.weight", {inter, d}});
    t.push_back({p + "mlp.up_proj.weight", {inter, d}});
    t.push_back({p + "mlp.down_proj.weight", {d, inter}});
  }
  t.push_back({"model.norm.weight", {d}, true});
  if (!c["tie_word_embeddings"].get<bool>()) t.push_back({"lm_head.weight", {vocab, d}});
  return t;
}

// splitmix64: a tiny deterministic generator, one stream per tensor.
struct Rng {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform with standard deviation 0.02 (|x| < 0.0347): small, so activations stay sane.
  float Small() {
    const float u = static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    return (2.0f * u - 1.0f) * 0.034641f;
  }
};

DType DTypeOf(const TensorSpec& spec, DType dtype) {
  return spec.mxfp4 ? DType::kU8 : dtype;
}

Status WriteTensor(std::FILE* f, const TensorSpec& spec, DType dtype, uint64_t seed,
                   const std::string& path) {
  Rng rng{seed};
  const int64_t chunk = 1 << 20;
  dtype = DTypeOf(spec, dtype);
  std::vector<uint8_t> buf(static_cast<size_t>(chunk) * DTypeSize(dtype));
  for (int64_t done = 0; done < spec.numel(); done += chunk) {
    const int64_t count = std::min(chunk, spec.numel() - done);
    for (int64_t i = 0; i < count; ++i) {
      if (spec.mxfp4 != 0) {  // random E2M1 pairs; scales 118..120 (values up to 6 * 2^-7)
        const uint64_t r = rng.Next() >> 40;
        buf[static_cast<size_t>(i)] =
            static_cast<uint8_t>(spec.mxfp4 == 1 ? r & 0xff : 118 + r % 3);
        continue;
      }
      const float v = spec.is_norm ? 1.0f : rng.Small();
      if (dtype == DType::kF32) {
        std::memcpy(buf.data() + i * 4, &v, 4);
      } else {
        const uint16_t h = dtype == DType::kF16 ? F32ToF16(v) : F32ToBf16(v);
        std::memcpy(buf.data() + i * 2, &h, 2);
      }
    }
    const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
    if (std::fwrite(buf.data(), 1, bytes, f) != bytes) return Status::Error(path + ": write failed (disk full?)");
  }
  return Status::Ok();
}

Status WriteShard(const std::string& path, const std::vector<TensorSpec>& specs,
                  const std::vector<size_t>& indices, DType dtype, uint64_t seed) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0;
  for (size_t i : indices) {
    const DType type = DTypeOf(specs[i], dtype);
    const size_t bytes = static_cast<size_t>(specs[i].numel()) * DTypeSize(type);
    header[specs[i].name] = {{"dtype", DTypeName(type)},
                             {"shape", specs[i].shape},
                             {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // keep tensor data 8-byte aligned
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return Status::Error(path + ": cannot create file");
  const uint64_t len = text.size();
  if (std::fwrite(&len, 8, 1, f.get()) != 1 || std::fwrite(text.data(), 1, text.size(), f.get()) != text.size())
    return Status::Error(path + ": write failed");
  for (size_t i : indices)
    EMBER_RETURN_IF_ERROR(WriteTensor(f.get(), specs[i], dtype, seed * 1000003ULL + i, path));
  // The shard leaves the page cache once on disk: the write path caches it in 4 KB folios, and a
  // later load that reads it from disk through MappedFile's MADV_HUGEPAGE mapping gets 2 MB ones,
  // which the CPU decode streams faster (docs/perf.md).
  const int fd = fileno(f.get());
  if (std::fflush(f.get()) != 0 || fdatasync(fd) != 0) return Status::Error(path + ": write failed");
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // advice: nothing to do when it is refused
  return Status::Ok();
}

Status CopyFile(const std::string& from, const std::string& to) {
  EMBER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(from));
  return WriteStringToFile(to, text);
}

}  // namespace

std::vector<std::string> SynthPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : Presets()) names.push_back(p.name);
  return names;
}

Status WriteSynthCheckpoint(const SynthOptions& options) {
  const Preset* preset = nullptr;
  const auto presets = Presets();
  for (const Preset& p : presets)
    if (p.name == options.preset) preset = &p;
  if (preset == nullptr) {
    std::string names;
    for (const std::string& n : SynthPresetNames()) names += (names.empty() ? "" : ", ") + n;
    return Status::Error("--like: unknown preset \"" + options.preset + "\" (known: " + names + ")");
  }
  if (options.dtype == DType::kI32) return Status::Error("--dtype must be bf16, f16 or f32");
  const std::string& dir = options.out_dir;
  if (dir.empty()) return Status::Error("--out is required");
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return Status::Error(dir + ": cannot create directory");
  json config = preset->config;
  if (options.num_layers > 0) {
    if (options.num_layers > config["num_hidden_layers"].get<int>())
      return Status::Error("--layers " + std::to_string(options.num_layers) + ": the preset has " +
                           std::to_string(config["num_hidden_layers"].get<int>()));
    config["num_hidden_layers"] = options.num_layers;
    if (config.contains("max_window_layers")) config["max_window_layers"] = options.num_layers;
    if (config.contains("layer_types")) {
      json& types = config["layer_types"];
      types.erase(types.begin() + options.num_layers, types.end());
    }
  }
  if (options.mxfp4) {
    if (config["model_type"] != "gpt_oss")
      return Status::Error("--mxfp4: only the gpt_oss presets have MXFP4 experts");
    config["quantization_config"] = {{"quant_method", "mxfp4"}};
  }
  config["torch_dtype"] = options.dtype == DType::kF32 ? "float32" : options.dtype == DType::kF16 ? "float16" : "bfloat16";
  config["transformers_version"] = "4.51.0";
  EMBER_RETURN_IF_ERROR(WriteStringToFile(dir + "/config.json", config.dump(2) + "\n"));
  EMBER_RETURN_IF_ERROR(WriteStringToFile(dir + "/generation_config.json", preset->generation.dump(2) + "\n"));
  if (!options.tokenizer_dir.empty()) {
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      const std::string from = options.tokenizer_dir + "/" + name;
      if (!FileExists(from)) return Status::Error("--tokenizer: " + from + " not found");
      EMBER_RETURN_IF_ERROR(CopyFile(from, dir + "/" + name));
    }
  }
  if (options.mtp && config["model_type"] != "deepseek_v3")
    return Status::Error("--mtp: only the deepseek_v3 presets have a multi-token-prediction module");
  const std::vector<TensorSpec> specs = TensorsOf(config, options.mtp);
  // Greedy split into shards of at most max_shard_bytes (a tensor never straddles shards).
  std::vector<std::vector<size_t>> shards(1);
  int64_t shard_bytes = 0, total_bytes = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t bytes =
        specs[i].numel() * static_cast<int64_t>(DTypeSize(DTypeOf(specs[i], options.dtype)));
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  if (shards.size() == 1) return WriteShard(dir + "/model.safetensors", specs, shards[0], options.dtype, options.seed);
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    EMBER_RETURN_IF_ERROR(WriteShard(dir + "/" + name, specs, shards[s], options.dtype, options.seed));
    for (size_t i : shards[s]) weight_map[specs[i].name] = name;
  }
  json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  return WriteStringToFile(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

Status WriteSynthLoraAdapter(const SynthLoraOptions& options) {
  EMBER_ASSIGN_OR_RETURN(const std::string text,
                         ReadFileToString(options.model_dir + "/config.json"));
  const json c = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (c.is_discarded()) return Status::Error(options.model_dir + "/config.json: not JSON");
  const int64_t d = c.value("hidden_size", 0), inter = c.value("intermediate_size", 0);
  const int64_t heads = c.value("num_attention_heads", 0);
  const int64_t kv = c.value("num_key_value_heads", heads);
  const int64_t hd = c.value("head_dim", heads > 0 ? d / heads : 0);
  const std::map<std::string, std::pair<int64_t, int64_t>> shapes = {  // module: (out, in)
      {"q_proj", {heads * hd, d}}, {"k_proj", {kv * hd, d}},       {"v_proj", {kv * hd, d}},
      {"o_proj", {d, heads * hd}}, {"gate_proj", {inter, d}},      {"up_proj", {inter, d}},
      {"down_proj", {d, inter}}};
  std::vector<TensorSpec> specs;
  for (int64_t l = 0; l < c.value("num_hidden_layers", 0); ++l) {
    for (const std::string& m : options.targets) {
      auto it = shapes.find(m);
      if (it == shapes.end()) return Status::Error("synth LoRA: unknown target " + m);
      const std::string block = m == "gate_proj" || m == "up_proj" || m == "down_proj"
                                    ? "mlp." : "self_attn.";
      const std::string name =
          "base_model.model.model.layers." + std::to_string(l) + "." + block + m;
      specs.push_back({name + ".lora_A.weight", {options.rank, it->second.second}});
      specs.push_back({name + ".lora_B.weight", {it->second.first, options.rank}});
    }
  }
  const std::string& dir = options.out_dir;
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return Status::Error(dir + ": cannot create directory");
  const json config = {{"peft_type", "LORA"},   {"task_type", "CAUSAL_LM"},
                       {"r", options.rank},     {"lora_alpha", options.alpha},
                       {"target_modules", options.targets}, {"bias", "none"},
                       {"use_rslora", false},   {"lora_dropout", 0.0}};
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(
      std::fopen((dir + "/adapter_config.json").c_str(), "wb"), &std::fclose);
  const std::string config_text = config.dump(1);
  if (!f || std::fwrite(config_text.data(), 1, config_text.size(), f.get()) != config_text.size())
    return Status::Error(dir + "/adapter_config.json: write failed");
  std::vector<size_t> all(specs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return WriteShard(dir + "/adapter_model.safetensors", specs, all, options.dtype, options.seed);
}

}  // namespace ember
