// config.json / generation_config.json -> ModelConfig / GenerationDefaults. Accepts both the
// transformers 4.x layout (torch_dtype, rope_theta + rope_scaling, gemma3 rope_local_base_freq +
// sliding_window_pattern, no layer_types) and the 5.x one (dtype, rope_parameters, layer_types).
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "model/model.h"

namespace ember {

using json = nlohmann::json;

namespace {

const std::vector<std::string> kSupported = {
    "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "phi3", "gemma2", "gemma3_text", "gpt_oss",
    "deepseek_v3", "qwen3_next"};

class Reader {
 public:
  Reader(const json& j, const std::string& source) : j_(j), source_(source) {}

  Status Err(const std::string& field, const std::string& what) const {
    return Status::Error(source_ + ": field \"" + field + "\" " + what);
  }
  bool Present(const std::string& f) const { return j_.contains(f) && !j_[f].is_null(); }

  Result<int32_t> Int(const std::string& f, std::optional<int32_t> def = std::nullopt) const {
    if (!Present(f)) {
      if (def) return *def;
      return Err(f, "is missing (expected an integer)");
    }
    if (!j_[f].is_number_integer()) return Err(f, "must be an integer");
    int64_t v = j_[f].get<int64_t>();
    if (v < 0 || v > INT32_MAX) return Err(f, "is out of range: " + std::to_string(v));
    return static_cast<int32_t>(v);
  }
  Result<double> Num(const std::string& f, std::optional<double> def = std::nullopt) const {
    if (!Present(f)) {
      if (def) return *def;
      return Err(f, "is missing (expected a number)");
    }
    if (!j_[f].is_number()) return Err(f, "must be a number");
    return j_[f].get<double>();
  }
  Result<bool> Bool(const std::string& f, bool def) const {
    if (!Present(f)) return def;
    if (!j_[f].is_boolean()) return Err(f, "must be true or false");
    return j_[f].get<bool>();
  }
  Result<std::string> Str(const std::string& f, std::optional<std::string> def = std::nullopt) const {
    if (!Present(f)) {
      if (def) return *def;
      return Err(f, "is missing (expected a string)");
    }
    if (!j_[f].is_string()) return Err(f, "must be a string");
    return j_[f].get<std::string>();
  }
  Result<std::vector<int32_t>> IntOrList(const std::string& f) const {
    std::vector<int32_t> out;
    if (!Present(f)) return out;
    const json& v = j_[f];
    if (v.is_number_integer()) {
      out.push_back(v.get<int32_t>());
    } else if (v.is_array()) {
      for (const json& e : v) {
        if (!e.is_number_integer()) return Err(f, "must be an integer or a list of integers");
        out.push_back(e.get<int32_t>());
      }
    } else {
      return Err(f, "must be an integer or a list of integers");
    }
    return out;
  }
  const json& j() const { return j_; }
  const std::string& source() const { return source_; }

 private:
  const json& j_;
  std::string source_;
};

// YaRN's magnitude scale for a context extended `factor` times (transformers' yarn_get_mscale).
double YarnMscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// YaRN's attention factor (transformers' _compute_yarn_parameters): attention_factor when
// given, else from mscale / mscale_all_dim when both are, else 0.1 ln(factor) + 1.
Status ParseYarn(const Reader& r, int32_t max_positions, RopeConfig* rope) {
  EMBER_ASSIGN_OR_RETURN(rope->original_max_position_embeddings,
                         r.Int("original_max_position_embeddings", max_positions));
  EMBER_ASSIGN_OR_RETURN(rope->beta_fast, r.Num("beta_fast", 32.0));
  EMBER_ASSIGN_OR_RETURN(rope->beta_slow, r.Num("beta_slow", 1.0));
  EMBER_ASSIGN_OR_RETURN(rope->truncate, r.Bool("truncate", true));
  if (!(rope->factor > 0)) return r.Err("factor", "must be positive");
  if (rope->original_max_position_embeddings <= 0)
    return r.Err("original_max_position_embeddings", "must be positive");
  if (!(rope->beta_fast > 0) || !(rope->beta_slow > 0))
    return r.Err("beta_fast", "and beta_slow must be positive");
  if (r.Present("attention_factor")) {
    EMBER_ASSIGN_OR_RETURN(rope->attention_factor, r.Num("attention_factor"));
    return Status::Ok();
  }
  const auto mscale = [&](double m) { return YarnMscale(rope->factor, m); };
  EMBER_ASSIGN_OR_RETURN(double m, r.Num("mscale", 0.0));
  EMBER_ASSIGN_OR_RETURN(double m_all, r.Num("mscale_all_dim", 0.0));
  rope->mscale_all_dim = m_all;
  rope->attention_factor = m != 0.0 && m_all != 0.0 ? mscale(m) / mscale(m_all) : mscale(1.0);
  return Status::Ok();
}

// Reads one rope description: {rope_type|type, rope_theta?, factor, ...}. `theta` is the default.
Result<RopeConfig> ParseRope(const json* params, double theta, int32_t max_positions,
                             const std::string& source, const std::string& field) {
  RopeConfig rope;
  rope.theta = theta;
  if (params == nullptr || params->is_null()) return rope;
  if (!params->is_object()) return Status::Error(source + ": field \"" + field + "\" must be an object");
  Reader r(*params, source + " (" + field + ")");
  // 5.x and most 4.x configs say rope_type; older 4.x ones say type.
  const std::string type_field = r.Present("rope_type") || !r.Present("type") ? "rope_type" : "type";
  EMBER_ASSIGN_OR_RETURN(std::string type, r.Str(type_field, std::string("default")));
  EMBER_ASSIGN_OR_RETURN(rope.theta, r.Num("rope_theta", theta));
  rope.type = type;
  if (type == "default") return rope;
  if (type == "linear" || type == "llama3") {
    EMBER_ASSIGN_OR_RETURN(rope.factor, r.Num("factor"));
    if (type == "llama3") {
      EMBER_ASSIGN_OR_RETURN(rope.low_freq_factor, r.Num("low_freq_factor"));
      EMBER_ASSIGN_OR_RETURN(rope.high_freq_factor, r.Num("high_freq_factor"));
      EMBER_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                             r.Int("original_max_position_embeddings"));
    }
    return rope;
  }
  if (type == "yarn") {
    EMBER_ASSIGN_OR_RETURN(rope.factor, r.Num("factor"));
    EMBER_RETURN_IF_ERROR(ParseYarn(r, max_positions, &rope));
    return rope;
  }
  return Status::Error(source + ": field \"" + field + "\": rope_type \"" + type +
                       "\" is not supported (supported: default, linear, llama3, yarn)");
}

// qwen3_moe: the experts (4.x says num_experts, 5.x num_local_experts) and which layers use them:
// layer l when it is not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0 (transformers'
// rule; the others keep a dense MLP of intermediate_size).
Status ParseMoe(const Reader& r, ModelConfig* c) {
  const std::string experts_field = r.Present("num_experts") ? "num_experts" : "num_local_experts";
  EMBER_ASSIGN_OR_RETURN(c->num_experts, r.Int(experts_field));
  EMBER_ASSIGN_OR_RETURN(c->num_experts_per_tok, r.Int("num_experts_per_tok"));
  EMBER_ASSIGN_OR_RETURN(c->moe_intermediate_size, r.Int("moe_intermediate_size"));
  EMBER_ASSIGN_OR_RETURN(c->norm_topk_prob, r.Bool("norm_topk_prob", false));
  EMBER_ASSIGN_OR_RETURN(int32_t sparse_step, r.Int("decoder_sparse_step", 1));
  if (c->num_experts <= 0) return r.Err(experts_field, "must be positive");
  if (c->num_experts_per_tok <= 0 || c->num_experts_per_tok > c->num_experts)
    return r.Err("num_experts_per_tok",
                 "must be in [1, " + experts_field + " = " + std::to_string(c->num_experts) + "]");
  if (c->moe_intermediate_size <= 0) return r.Err("moe_intermediate_size", "must be positive");
  if (sparse_step <= 0) return r.Err("decoder_sparse_step", "must be positive");
  std::set<int32_t> dense;
  if (r.Present("mlp_only_layers")) {
    const json& v = r.j()["mlp_only_layers"];
    if (!v.is_array()) return r.Err("mlp_only_layers", "must be a list of layer indices");
    for (const json& e : v) {
      if (!e.is_number_integer()) return r.Err("mlp_only_layers", "must be a list of layer indices");
      dense.insert(e.get<int32_t>());
    }
  }
  c->moe_layers.assign(static_cast<size_t>(c->num_layers), 0);
  for (int32_t l = 0; l < c->num_layers; ++l)
    c->moe_layers[static_cast<size_t>(l)] = !dense.contains(l) && (l + 1) % sparse_step == 0;
  return Status::Ok();
}

// qwen3_next: gated DeltaNet layers (linear_* keys), gated full attention, (1 + w) norms, and
// MoE MLPs (ParseMoe's keys, none when num_experts is 0) with a shared expert.
Status ParseQwen3Next(const Reader& r, ModelConfig* c) {
  LinearAttentionConfig& la = c->linear;
  EMBER_ASSIGN_OR_RETURN(la.num_key_heads, r.Int("linear_num_key_heads"));
  EMBER_ASSIGN_OR_RETURN(la.num_value_heads, r.Int("linear_num_value_heads"));
  EMBER_ASSIGN_OR_RETURN(la.key_head_dim, r.Int("linear_key_head_dim"));
  EMBER_ASSIGN_OR_RETURN(la.value_head_dim, r.Int("linear_value_head_dim"));
  EMBER_ASSIGN_OR_RETURN(la.conv_kernel, r.Int("linear_conv_kernel_dim", 4));
  if (la.num_key_heads <= 0 || la.key_head_dim <= 0 || la.value_head_dim <= 0 ||
      la.conv_kernel < 2)
    return r.Err("linear_num_key_heads",
                 "and linear_key_head_dim, linear_value_head_dim must be positive, "
                 "linear_conv_kernel_dim at least 2");
  if (la.num_value_heads <= 0 || la.num_value_heads % la.num_key_heads != 0)
    return r.Err("linear_num_value_heads", "must be a positive multiple of linear_num_key_heads");
  c->attn_output_gate = true;
  EMBER_ASSIGN_OR_RETURN(int32_t experts, r.Int("num_experts", 0));
  if (experts > 0) {
    EMBER_RETURN_IF_ERROR(ParseMoe(r, c));
    EMBER_ASSIGN_OR_RETURN(c->shared_expert_intermediate_size,
                           r.Int("shared_expert_intermediate_size", 0));
  }
  return Status::Ok();
}

// gpt_oss: every layer's MLP is num_local_experts experts of intermediate_size, the top
// num_experts_per_tok (4.x checkpoints also say experts_per_token) weighted by a softmax over
// their logits: MoeRoute's renormalised top k of the full softmax, the same weights.
Status ParseGptOssMoe(const Reader& r, ModelConfig* c) {
  EMBER_ASSIGN_OR_RETURN(c->num_experts, r.Int("num_local_experts"));
  const std::string k_field = r.Present("num_experts_per_tok") || !r.Present("experts_per_token")
                                  ? "num_experts_per_tok"
                                  : "experts_per_token";
  EMBER_ASSIGN_OR_RETURN(c->num_experts_per_tok, r.Int(k_field));
  EMBER_ASSIGN_OR_RETURN(double limit, r.Num("swiglu_limit", 7.0));
  if (c->num_experts <= 0) return r.Err("num_local_experts", "must be positive");
  if (c->num_experts_per_tok <= 0 || c->num_experts_per_tok > c->num_experts)
    return r.Err(k_field,
                 "must be in [1, num_local_experts = " + std::to_string(c->num_experts) + "]");
  if (!(limit > 0)) return r.Err("swiglu_limit", "must be positive");
  c->moe_intermediate_size = c->intermediate_size;
  c->norm_topk_prob = true;
  c->moe_biased = true;
  c->moe_activation = MoeActivation::kClampedSwiglu;
  c->swiglu_limit = static_cast<float>(limit);
  c->moe_layers.assign(static_cast<size_t>(c->num_layers), 1);
  return Status::Ok();
}

// deepseek_v3: multi-head latent attention (the q/kv LoRA ranks and head dims), the rope over
// qk_rope_head_dim (head_dim and rotary_dim become it), softmax scale 1/sqrt(nope + rope) times
// mscale(factor, mscale_all_dim)^2 under YaRN, and the grouped sigmoid router: layers from
// first_k_dense_replace on are n_routed_experts experts plus n_shared_experts shared ones.
Status ParseDeepseek(const Reader& r, ModelConfig* c) {
  EMBER_ASSIGN_OR_RETURN(c->q_lora_rank, r.Int("q_lora_rank", 0));  // null: q_proj
  EMBER_ASSIGN_OR_RETURN(c->kv_lora_rank, r.Int("kv_lora_rank"));
  EMBER_ASSIGN_OR_RETURN(c->qk_nope_head_dim, r.Int("qk_nope_head_dim"));
  EMBER_ASSIGN_OR_RETURN(c->qk_rope_head_dim, r.Int("qk_rope_head_dim"));
  EMBER_ASSIGN_OR_RETURN(c->v_head_dim, r.Int("v_head_dim"));
  EMBER_ASSIGN_OR_RETURN(c->rope_interleave, r.Bool("rope_interleave", true));
  if (c->kv_lora_rank <= 0) return r.Err("kv_lora_rank", "must be positive");
  if (c->qk_nope_head_dim <= 0 || c->v_head_dim <= 0)
    return r.Err("qk_nope_head_dim", "and v_head_dim must be positive");
  if (c->qk_rope_head_dim <= 0 || c->qk_rope_head_dim % 2 != 0)
    return r.Err("qk_rope_head_dim", "must be positive and even");
  if (c->attention_bias)
    return r.Err("attention_bias", "is not supported for deepseek_v3 (biased MLA projections)");
  c->attention_bias = c->o_bias = false;
  c->head_dim = c->rotary_dim = c->qk_rope_head_dim;
  double scale = 1.0 / std::sqrt(static_cast<double>(c->qk_nope_head_dim + c->qk_rope_head_dim));
  if (c->rope.type == "yarn" && c->rope.mscale_all_dim != 0.0) {
    const double m = YarnMscale(c->rope.factor, c->rope.mscale_all_dim);
    scale *= m * m;
  }
  c->attention_scale = static_cast<float>(scale);
  EMBER_ASSIGN_OR_RETURN(c->num_experts, r.Int("n_routed_experts"));
  EMBER_ASSIGN_OR_RETURN(c->num_experts_per_tok, r.Int("num_experts_per_tok"));
  EMBER_ASSIGN_OR_RETURN(c->moe_intermediate_size, r.Int("moe_intermediate_size"));
  EMBER_ASSIGN_OR_RETURN(c->norm_topk_prob, r.Bool("norm_topk_prob", true));
  EMBER_ASSIGN_OR_RETURN(c->moe_groups, r.Int("n_group", 1));
  EMBER_ASSIGN_OR_RETURN(c->moe_top_groups, r.Int("topk_group", 1));
  EMBER_ASSIGN_OR_RETURN(c->moe_shared_experts, r.Int("n_shared_experts", 0));
  EMBER_ASSIGN_OR_RETURN(double routed_scale, r.Num("routed_scaling_factor", 1.0));
  EMBER_ASSIGN_OR_RETURN(c->first_dense_layers, r.Int("first_k_dense_replace", 0));
  EMBER_ASSIGN_OR_RETURN(c->num_nextn_predict_layers, r.Int("num_nextn_predict_layers", 0));
  if (c->num_nextn_predict_layers < 0) return r.Err("num_nextn_predict_layers", "must be >= 0");
  c->moe_routed_scale = static_cast<float>(routed_scale);
  c->moe_routing = MoeRouting::kSigmoidGrouped;
  if (c->num_experts <= 0) return r.Err("n_routed_experts", "must be positive");
  if (c->num_experts_per_tok <= 0 || c->num_experts_per_tok > c->num_experts)
    return r.Err("num_experts_per_tok",
                 "must be in [1, n_routed_experts = " + std::to_string(c->num_experts) + "]");
  if (c->moe_intermediate_size <= 0) return r.Err("moe_intermediate_size", "must be positive");
  if (c->moe_groups <= 0 || c->num_experts % c->moe_groups != 0 ||
      c->num_experts / c->moe_groups < 2)
    return r.Err("n_group", "must divide n_routed_experts into groups of at least 2");
  if (c->moe_top_groups <= 0 || c->moe_top_groups > c->moe_groups)
    return r.Err("topk_group", "must be in [1, n_group]");
  if (c->num_experts_per_tok > c->moe_top_groups * (c->num_experts / c->moe_groups))
    return r.Err("num_experts_per_tok", "exceeds the experts of the topk_group kept groups");
  c->moe_layers.assign(static_cast<size_t>(c->num_layers), 0);
  for (int32_t l = c->first_dense_layers; l < c->num_layers; ++l)
    c->moe_layers[static_cast<size_t>(l)] = 1;
  return Status::Ok();
}

}  // namespace

int32_t KvLayerCount(const ModelConfig& c) {
  int32_t n = 0;
  for (LayerType t : c.layer_types) n += t != LayerType::kLinearAttention;
  return n;
}

int32_t KvLayerIndex(const ModelConfig& c, int32_t layer) {
  if (c.layer_types[static_cast<size_t>(layer)] == LayerType::kLinearAttention) return -1;
  int32_t index = 0;
  for (int32_t l = 0; l < layer; ++l)
    index += c.layer_types[static_cast<size_t>(l)] != LayerType::kLinearAttention;
  return index;
}

int64_t RecurrentStateFloats(const ModelConfig& c) {
  return (c.num_layers - KvLayerCount(c)) * c.linear.state_floats();
}

std::string SupportedModelTypes() {
  std::string s;
  for (const std::string& t : kSupported) s += (s.empty() ? "" : ", ") + t;
  return s;
}

Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error(source + ": not a JSON object");
  Reader r(j, source);
  ModelConfig c;
  EMBER_ASSIGN_OR_RETURN(c.model_type, r.Str("model_type"));
  if (std::find(kSupported.begin(), kSupported.end(), c.model_type) == kSupported.end())
    return Status::Error(source + ": model_type \"" + c.model_type +
                         "\" is not supported (supported: " + SupportedModelTypes() + ")");
  const std::string& t = c.model_type;
  const bool gemma = t == "gemma2" || t == "gemma3_text";
  EMBER_ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size"));
  EMBER_ASSIGN_OR_RETURN(c.hidden_size, r.Int("hidden_size"));
  EMBER_ASSIGN_OR_RETURN(c.intermediate_size, r.Int("intermediate_size"));
  EMBER_ASSIGN_OR_RETURN(c.num_layers, r.Int("num_hidden_layers"));
  EMBER_ASSIGN_OR_RETURN(c.num_heads, r.Int("num_attention_heads"));
  EMBER_ASSIGN_OR_RETURN(c.num_kv_heads, r.Int("num_key_value_heads", c.num_heads));
  if (c.num_heads <= 0 || c.hidden_size <= 0 || c.num_layers <= 0 || c.vocab_size <= 0 ||
      c.intermediate_size <= 0)
    return Status::Error(source + ": vocab_size, hidden_size, intermediate_size, num_hidden_layers"
                                  " and num_attention_heads must be positive");
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0)
    return r.Err("num_key_value_heads", "must divide num_attention_heads (" +
                                            std::to_string(c.num_heads) + ")");
  EMBER_ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim", c.hidden_size / c.num_heads));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) return r.Err("head_dim", "must be positive and even");
  EMBER_ASSIGN_OR_RETURN(c.max_position_embeddings, r.Int("max_position_embeddings", 4096));
  EMBER_ASSIGN_OR_RETURN(double eps, r.Num("rms_norm_eps", 1e-6));
  c.rms_norm_eps = static_cast<float>(eps);
  EMBER_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", gemma));
  if (r.Present("dtype")) { EMBER_ASSIGN_OR_RETURN(c.torch_dtype, r.Str("dtype")); }
  else { EMBER_ASSIGN_OR_RETURN(c.torch_dtype, r.Str("torch_dtype", std::string("float32"))); }

  // ---- rope (5.x rope_parameters, or 4.x rope_theta + rope_scaling) ----
  double partial = 1.0;
  EMBER_ASSIGN_OR_RETURN(partial, r.Num("partial_rotary_factor", 1.0));
  if (r.Present("rope_parameters")) {
    const json& rp = j["rope_parameters"];
    if (rp.is_object() && rp.contains("full_attention")) {  // per layer type (gemma3)
      EMBER_ASSIGN_OR_RETURN(
          c.rope, ParseRope(&rp["full_attention"], 10000.0, c.max_position_embeddings, source,
                            "rope_parameters.full_attention"));
      const json* local = rp.contains("sliding_attention") ? &rp["sliding_attention"] : nullptr;
      EMBER_ASSIGN_OR_RETURN(c.rope_local, ParseRope(local, 10000.0, c.max_position_embeddings,
                                                     source, "rope_parameters.sliding_attention"));
    } else {
      EMBER_ASSIGN_OR_RETURN(
          c.rope, ParseRope(&rp, 10000.0, c.max_position_embeddings, source, "rope_parameters"));
      c.rope_local = c.rope;
      if (rp.is_object() && rp.contains("partial_rotary_factor") &&
          rp["partial_rotary_factor"].is_number())
        partial = rp["partial_rotary_factor"].get<double>();
    }
  } else {
    EMBER_ASSIGN_OR_RETURN(double theta, r.Num("rope_theta", 10000.0));
    const json* scaling = r.Present("rope_scaling") ? &j["rope_scaling"] : nullptr;
    EMBER_ASSIGN_OR_RETURN(
        c.rope, ParseRope(scaling, theta, c.max_position_embeddings, source, "rope_scaling"));
    c.rope_local = c.rope;
    if (t == "gemma3_text") {  // 4.x: scaling applies to global layers; local uses its own base
      EMBER_ASSIGN_OR_RETURN(double local_theta, r.Num("rope_local_base_freq", 10000.0));
      c.rope_local = RopeConfig{};
      c.rope_local.theta = local_theta;
    }
  }
  if (partial <= 0.0 || partial > 1.0) return r.Err("partial_rotary_factor", "must be in (0, 1]");
  c.rotary_dim = static_cast<int32_t>(c.head_dim * partial);
  c.rotary_dim -= c.rotary_dim % 2;

  // ---- per-layer attention type ----
  int32_t window = 0;
  if (r.Present("sliding_window")) { EMBER_ASSIGN_OR_RETURN(window, r.Int("sliding_window")); }
  c.layer_types.assign(static_cast<size_t>(c.num_layers), LayerType::kFullAttention);
  if (r.Present("layer_types")) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || lt.size() != static_cast<size_t>(c.num_layers))
      return r.Err("layer_types", "must be a list of num_hidden_layers entries");
    for (size_t i = 0; i < lt.size(); ++i) {
      std::string s = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (s == "sliding_attention") c.layer_types[i] = LayerType::kSlidingAttention;
      else if (s == "linear_attention" && t == "qwen3_next")
        c.layer_types[i] = LayerType::kLinearAttention;
      else if (s != "full_attention")
        return r.Err("layer_types",
                     "entry " + std::to_string(i) +
                         " must be \"full_attention\" or \"sliding_attention\"" +
                         (t == "qwen3_next" ? " or \"linear_attention\"" : ""));
    }
  } else if (t == "gemma2" || t == "gpt_oss") {  // no layer_types: even layers slide
    for (int32_t i = 0; i < c.num_layers; i += 2) c.layer_types[i] = LayerType::kSlidingAttention;
  } else if (t == "gemma3_text") {
    EMBER_ASSIGN_OR_RETURN(int32_t pattern, r.Int("sliding_window_pattern", 6));
    if (pattern <= 0) return r.Err("sliding_window_pattern", "must be positive");
    for (int32_t i = 0; i < c.num_layers; ++i)
      if ((i + 1) % pattern != 0) c.layer_types[i] = LayerType::kSlidingAttention;
  } else if (t == "qwen2" || t == "qwen3" || t == "qwen3_moe") {
    EMBER_ASSIGN_OR_RETURN(bool use_sw, r.Bool("use_sliding_window", false));
    EMBER_ASSIGN_OR_RETURN(int32_t max_window_layers, r.Int("max_window_layers", c.num_layers));
    if (use_sw)
      for (int32_t i = max_window_layers; i < c.num_layers; ++i)
        c.layer_types[i] = LayerType::kSlidingAttention;
  } else if (t == "qwen3_next") {  // 4.x: every full_attention_interval-th layer is full
    EMBER_ASSIGN_OR_RETURN(int32_t interval, r.Int("full_attention_interval", 4));
    if (interval <= 0) return r.Err("full_attention_interval", "must be positive");
    for (int32_t i = 0; i < c.num_layers; ++i)
      if ((i + 1) % interval != 0) c.layer_types[i] = LayerType::kLinearAttention;
  } else if (t == "mistral" || t == "phi3") {
    if (window > 0) c.layer_types.assign(c.layer_types.size(), LayerType::kSlidingAttention);
  }
  if (KvLayerCount(c) == 0)
    return r.Err("num_hidden_layers",
                 "leaves no attention layer (every layer is linear attention by layer_types or "
                 "full_attention_interval); Ember's engine needs one: its paged KV pool carries "
                 "the sequences");
  bool any_sliding = false;
  for (LayerType lt : c.layer_types) any_sliding |= lt == LayerType::kSlidingAttention;
  if (any_sliding && window <= 0) return r.Err("sliding_window", "must be a positive integer when layers slide");
  c.sliding_window = any_sliding ? window : 0;

  // ---- family features ----
  EMBER_ASSIGN_OR_RETURN(bool attn_bias, r.Bool("attention_bias", false));
  c.attention_bias = t == "qwen2" || attn_bias;
  c.o_bias = attn_bias && t != "qwen2";  // qwen2's o_proj has none (and no attention_bias field)
  c.attention_sinks = t == "gpt_oss";
  c.qk_norm = t == "qwen3" || t == "qwen3_moe" || t == "gemma3_text" || t == "qwen3_next";
  c.fused_qkv = t == "phi3";
  c.gemma_norms = gemma;
  std::string act_field = r.Present("hidden_activation") ? "hidden_activation" : "hidden_act";
  EMBER_ASSIGN_OR_RETURN(std::string act, r.Str(act_field, std::string(gemma ? "gelu_pytorch_tanh" : "silu")));
  if (act == "gelu_pytorch_tanh" || (gemma && act == "gelu")) c.gelu_tanh = true;
  else if (act != "silu") return r.Err(act_field, "\"" + act + "\" is not supported (silu, gelu_pytorch_tanh)");
  if (gemma) {
    c.embedding_scale = std::sqrt(static_cast<float>(c.hidden_size));
    EMBER_ASSIGN_OR_RETURN(double qpas, r.Num("query_pre_attn_scalar", c.head_dim));
    c.attention_scale = static_cast<float>(1.0 / std::sqrt(qpas));
    EMBER_ASSIGN_OR_RETURN(double s1, r.Num("attn_logit_softcapping", 0.0));
    EMBER_ASSIGN_OR_RETURN(double s2, r.Num("final_logit_softcapping", 0.0));
    c.attn_logit_softcapping = static_cast<float>(s1);
    c.final_logit_softcapping = static_cast<float>(s2);
  } else {
    c.attention_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  }
  if (t == "qwen3_moe") EMBER_RETURN_IF_ERROR(ParseMoe(r, &c));
  if (t == "qwen3_next") EMBER_RETURN_IF_ERROR(ParseQwen3Next(r, &c));
  if (t == "gpt_oss") EMBER_RETURN_IF_ERROR(ParseGptOssMoe(r, &c));
  if (t == "deepseek_v3") EMBER_RETURN_IF_ERROR(ParseDeepseek(r, &c));
  if (r.Present("quantization_config")) {  // weights in a quantized format
    const json& q = j["quantization_config"];
    const std::string method =
        q.is_object() && q.contains("quant_method") && q["quant_method"].is_string()
            ? q["quant_method"].get<std::string>()
            : "?";
    // OpenAI's gpt-oss checkpoints: MXFP4 experts (model.cc: packed, or dequantized to bf16).
    if (!(method == "mxfp4" && t == "gpt_oss"))
      return r.Err("quantization_config",
                   "(quant_method \"" + method +
                       "\"): quantized checkpoints are not supported (only gpt_oss's mxfp4 "
                       "experts); Ember loads float32, float16 and bfloat16 weights");
  }
  if (r.Present("bos_token_id")) { EMBER_ASSIGN_OR_RETURN(c.bos_token_id, r.Int("bos_token_id")); }
  EMBER_ASSIGN_OR_RETURN(c.eos_token_ids, r.IntOrList("eos_token_id"));
  return c;
}

Result<GenerationDefaults> ParseGenerationConfig(const std::string& json_text,
                                                 const std::string& source,
                                                 const ModelConfig& config) {
  GenerationDefaults g;
  g.eos_token_ids = config.eos_token_ids;
  g.bos_token_id = config.bos_token_id;
  if (json_text.empty()) return g;
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error(source + ": not a JSON object");
  Reader r(j, source);
  auto opt_float = [&](const std::string& f, std::optional<float>* out) -> Status {
    if (!r.Present(f)) return Status::Ok();
    EMBER_ASSIGN_OR_RETURN(double v, r.Num(f));
    *out = static_cast<float>(v);
    return Status::Ok();
  };
  auto opt_int = [&](const std::string& f, std::optional<int32_t>* out) -> Status {
    if (!r.Present(f)) return Status::Ok();
    EMBER_ASSIGN_OR_RETURN(int32_t v, r.Int(f));
    *out = v;
    return Status::Ok();
  };
  EMBER_RETURN_IF_ERROR(opt_float("temperature", &g.temperature));
  EMBER_RETURN_IF_ERROR(opt_float("top_p", &g.top_p));
  EMBER_RETURN_IF_ERROR(opt_float("min_p", &g.min_p));
  EMBER_RETURN_IF_ERROR(opt_float("repetition_penalty", &g.repetition_penalty));
  EMBER_RETURN_IF_ERROR(opt_int("top_k", &g.top_k));
  EMBER_RETURN_IF_ERROR(opt_int("max_new_tokens", &g.max_new_tokens));
  EMBER_RETURN_IF_ERROR(opt_int("bos_token_id", &g.bos_token_id));
  if (r.Present("do_sample")) { EMBER_ASSIGN_OR_RETURN(g.do_sample, r.Bool("do_sample", false)); }
  if (r.Present("eos_token_id")) { EMBER_ASSIGN_OR_RETURN(g.eos_token_ids, r.IntOrList("eos_token_id")); }
  return g;
}

}  // namespace ember
