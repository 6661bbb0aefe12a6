// GGUF -> ModelConfig, GgufVocab, chat template and WeightStore (see gguf_model.h).
#include "model/gguf_model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "util/parallel.h"

namespace ember {
namespace {

// general.architecture -> Ember's model_type.
const std::pair<const char*, const char*> kArchitectures[] = {
    {"llama", "llama"},   {"qwen2", "qwen2"},        {"qwen3", "qwen3"}, {"qwen3moe", "qwen3_moe"},
    {"gemma2", "gemma2"}, {"gemma3", "gemma3_text"}, {"phi3", "phi3"},
};

// Typed reads of `<arch>.*` keys: a missing required key is the reader's error naming it; an
// optional one gives the default.
class Meta {
 public:
  Meta(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}
  std::string Key(const std::string& suffix) const { return arch_ + "." + suffix; }
  bool Has(const std::string& suffix) const { return file_.HasKey(Key(suffix)); }

  Result<int32_t> Int(const std::string& suffix, std::optional<int32_t> def = std::nullopt) const {
    const std::string key = Key(suffix);
    if (def && !file_.HasKey(key)) return *def;
    EMBER_ASSIGN_OR_RETURN(int64_t v, file_.GetInt(key));
    if (v < 0 || v > INT32_MAX)
      return Status::Error(file_.path() + ": metadata key '" + key + "' is " + std::to_string(v) +
                           ", expected a value in [0, 2^31)");
    return static_cast<int32_t>(v);
  }
  Result<double> Num(const std::string& suffix, std::optional<double> def = std::nullopt) const {
    const std::string key = Key(suffix);
    if (def && !file_.HasKey(key)) return *def;
    return file_.GetFloat(key);
  }
  Status Err(const std::string& suffix, const std::string& what) const {
    return Status::Error(file_.path() + ": metadata key '" + Key(suffix) + "' " + what);
  }
  const GgufFile& file() const { return file_; }

 private:
  const GgufFile& file_;
  std::string arch_;
};

Result<std::optional<int32_t>> OptionalId(const GgufFile& file, const std::string& key) {
  if (!file.HasKey(key)) return std::optional<int32_t>();
  EMBER_ASSIGN_OR_RETURN(int64_t v, file.GetInt(key));
  // Files mark "no such token" with -1 (or its uint32 image).
  if (v < 0 || v >= INT32_MAX) return std::optional<int32_t>();
  return std::optional<int32_t>(static_cast<int32_t>(v));
}

Result<std::optional<bool>> OptionalBool(const GgufFile& file, const std::string& key) {
  if (!file.HasKey(key)) return std::optional<bool>();
  EMBER_ASSIGN_OR_RETURN(bool v, file.GetBool(key));
  return std::optional<bool>(v);
}

// <arch>.rope.scaling.*: none, linear, yarn (longrope's per-dimension factors are refused).
Status ParseRopeScaling(const Meta& m, RopeConfig* rope) {
  std::string type = "none";
  if (m.Has("rope.scaling.type")) {
    EMBER_ASSIGN_OR_RETURN(std::string_view t, m.file().GetString(m.Key("rope.scaling.type")));
    type = std::string(t);
  }
  EMBER_ASSIGN_OR_RETURN(double factor, m.Num("rope.scaling.factor", 0.0));
  if (type == "none" || (type == "linear" && factor == 1.0)) return Status::Ok();
  if (!(factor > 0))
    return m.Err("rope.scaling.factor", "must be positive for " + type + " scaling");
  rope->factor = factor;
  if (type == "linear") {
    rope->type = "linear";
    return Status::Ok();
  }
  if (type == "yarn") {
    rope->type = "yarn";
    EMBER_ASSIGN_OR_RETURN(rope->original_max_position_embeddings,
                           m.Int("rope.scaling.original_context_length"));
    EMBER_ASSIGN_OR_RETURN(rope->beta_fast, m.Num("rope.scaling.yarn_beta_fast", 32.0));
    EMBER_ASSIGN_OR_RETURN(rope->beta_slow, m.Num("rope.scaling.yarn_beta_slow", 1.0));
    // transformers' default attention factor, unless the file gives one.
    EMBER_ASSIGN_OR_RETURN(rope->attention_factor,
                           m.Num("rope.scaling.attn_factor", 0.1 * std::log(factor) + 1.0));
    return Status::Ok();
  }
  return m.Err("rope.scaling.type", "is \"" + type + "\": not supported (none, linear, yarn)");
}

// rope_freqs.weight: per-frequency divisors of the inverse frequencies (how llama.cpp's converter
// stores Llama 3.1's rope scaling; the same frequencies as transformers' "llama3" rope).
Status ReadRopeFreqs(const GgufFile& file, int32_t rotary_dim, RopeConfig* rope) {
  const GgufTensorInfo* info = file.FindTensor("rope_freqs.weight");
  if (info == nullptr) return Status::Ok();
  if (info->dims.size() != 1 || info->dims[0] != rotary_dim / 2 ||
      !GgmlTraits(info->type).dequantizable)
    return Status::Error(file.path() + ": tensor 'rope_freqs.weight' must be " +
                         std::to_string(rotary_dim / 2) +
                         " float values (rope.dimension_count / 2)");
  rope->freq_factors.resize(static_cast<size_t>(rotary_dim / 2));
  DequantizeRow(info->type, info->data, rotary_dim / 2, rope->freq_factors.data());
  for (float f : rope->freq_factors)
    if (!(f > 0))
      return Status::Error(file.path() + ": tensor 'rope_freqs.weight' holds a value <= 0");
  return Status::Ok();
}

// Which layers slide and their window: in gemma2 every second layer is global, in gemma3 every
// sixth (llama.cpp's patterns; <arch>.attention.sliding_window_pattern overrides them), and phi3
// slides everywhere when the file gives a window (as transformers does).
Status ParseSlidingWindow(const Meta& m, ModelConfig* c) {
  const std::string& t = c->model_type;
  c->layer_types.assign(static_cast<size_t>(c->num_layers), LayerType::kFullAttention);
  const bool slides = t == "gemma2" || t == "gemma3_text" || t == "phi3";
  if (!slides || !m.Has("attention.sliding_window")) {
    if (t == "gemma2" || t == "gemma3_text")
      return m.Err("attention.sliding_window", "is missing (gemma layers slide)");
    return Status::Ok();
  }
  EMBER_ASSIGN_OR_RETURN(c->sliding_window, m.Int("attention.sliding_window"));
  if (c->sliding_window <= 0) {
    if (t == "phi3") return Status::Ok();
    return m.Err("attention.sliding_window", "must be positive");
  }
  EMBER_ASSIGN_OR_RETURN(int32_t pattern,
                         m.Int("attention.sliding_window_pattern", t == "gemma2"        ? 2
                                                                   : t == "gemma3_text" ? 6
                                                                                        : 0));
  if (t != "phi3" && pattern <= 0)
    return m.Err("attention.sliding_window_pattern", "must be positive");
  for (int32_t l = 0; l < c->num_layers; ++l) {
    const bool slide = t == "phi3" || (l + 1) % pattern != 0;
    if (slide) c->layer_types[static_cast<size_t>(l)] = LayerType::kSlidingAttention;
  }
  return Status::Ok();
}

// Gemma: softcaps, the sqrt(hidden) embedding scale, and the query scale llama.cpp uses (GGUF does
// not store query_pre_attn_scalar: head_dim^-0.5, but (hidden / heads)^-0.5 for the 27B models,
// gemma2's 46 layers and gemma3's 62).
Status ParseGemma(const Meta& m, ModelConfig* c) {
  c->gemma_norms = true;
  c->gelu_tanh = true;
  c->embedding_scale = std::sqrt(static_cast<float>(c->hidden_size));
  const bool is_27b = (c->model_type == "gemma2" && c->num_layers == 46) ||
                      (c->model_type == "gemma3_text" && c->num_layers == 62);
  const double qpas = is_27b ? double(c->hidden_size) / c->num_heads : c->head_dim;
  c->attention_scale = static_cast<float>(1.0 / std::sqrt(qpas));
  EMBER_ASSIGN_OR_RETURN(double attn_cap, m.Num("attn_logit_softcapping", 0.0));
  EMBER_ASSIGN_OR_RETURN(double final_cap, m.Num("final_logit_softcapping", 0.0));
  c->attn_logit_softcapping = static_cast<float>(attn_cap);
  c->final_logit_softcapping = static_cast<float>(final_cap);
  if (c->model_type == "gemma3_text") {  // local layers keep a 10000 base, unscaled
    c->rope_local = RopeConfig{};
    c->rope_local.theta = 10000.0;
  }
  return Status::Ok();
}

Status ParseExperts(const Meta& m, ModelConfig* c) {
  EMBER_ASSIGN_OR_RETURN(c->num_experts, m.Int("expert_count"));
  EMBER_ASSIGN_OR_RETURN(c->num_experts_per_tok, m.Int("expert_used_count"));
  EMBER_ASSIGN_OR_RETURN(c->moe_intermediate_size, m.Int("expert_feed_forward_length"));
  if (c->num_experts <= 0) return m.Err("expert_count", "must be positive");
  if (c->num_experts_per_tok <= 0 || c->num_experts_per_tok > c->num_experts)
    return m.Err("expert_used_count", "must be in [1, expert_count]");
  if (c->moe_intermediate_size <= 0) return m.Err("expert_feed_forward_length", "must be positive");
  c->norm_topk_prob = true;  // llama.cpp's qwen3moe renormalises the top k
  c->moe_layers.assign(static_cast<size_t>(c->num_layers), 1);
  if (c->intermediate_size == 0) c->intermediate_size = c->moe_intermediate_size;
  return Status::Ok();
}

Status ParseShape(const Meta& m, ModelConfig* c) {
  EMBER_ASSIGN_OR_RETURN(c->hidden_size, m.Int("embedding_length"));
  EMBER_ASSIGN_OR_RETURN(c->num_layers, m.Int("block_count"));
  EMBER_ASSIGN_OR_RETURN(
      c->intermediate_size,
      m.Int("feed_forward_length",
            c->model_type == "qwen3_moe" ? std::optional<int32_t>(0) : std::nullopt));
  EMBER_ASSIGN_OR_RETURN(c->num_heads, m.Int("attention.head_count"));
  EMBER_ASSIGN_OR_RETURN(c->num_kv_heads, m.Int("attention.head_count_kv", c->num_heads));
  EMBER_ASSIGN_OR_RETURN(c->max_position_embeddings, m.Int("context_length"));
  if (c->hidden_size <= 0) return m.Err("embedding_length", "must be positive");
  if (c->num_layers <= 0 || c->num_layers > 65536)
    return m.Err("block_count", "must be in [1, 65536]");
  if (c->num_heads <= 0) return m.Err("attention.head_count", "must be positive");
  if (c->max_position_embeddings <= 0) return m.Err("context_length", "must be positive");
  if (c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads != 0)
    return m.Err("attention.head_count_kv",
                 "must divide attention.head_count (" + std::to_string(c->num_heads) + ")");
  EMBER_ASSIGN_OR_RETURN(c->head_dim, m.Int("attention.key_length", c->hidden_size / c->num_heads));
  EMBER_ASSIGN_OR_RETURN(int32_t value_dim, m.Int("attention.value_length", c->head_dim));
  if (c->head_dim <= 0 || c->head_dim % 2 != 0)
    return m.Err("attention.key_length", "must be positive and even");
  if (value_dim != c->head_dim)
    return m.Err("attention.value_length", "(" + std::to_string(value_dim) +
                                               ") must equal attention.key_length (" +
                                               std::to_string(c->head_dim) + ")");
  EMBER_ASSIGN_OR_RETURN(double eps, m.Num("attention.layer_norm_rms_epsilon"));
  c->rms_norm_eps = static_cast<float>(eps);
  EMBER_ASSIGN_OR_RETURN(c->rotary_dim, m.Int("rope.dimension_count", c->head_dim));
  if (c->rotary_dim <= 0 || c->rotary_dim > c->head_dim || c->rotary_dim % 2 != 0)
    return m.Err("rope.dimension_count",
                 "must be even and in [2, head dim " + std::to_string(c->head_dim) + "]");
  return Status::Ok();
}

}  // namespace

bool IsGgufFile(const std::string& path) {
  struct stat st;
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0 &&
         stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string SupportedGgufArchitectures() {
  std::string out;
  for (const auto& [arch, type] : kArchitectures)
    out += (out.empty() ? "" : ", ") + std::string(arch);
  return out;
}

Result<ModelConfig> GgufModelConfig(const GgufFile& file) {
  EMBER_ASSIGN_OR_RETURN(std::string_view arch_view, file.GetString("general.architecture"));
  const std::string arch(arch_view);
  ModelConfig c;
  for (const auto& [name, type] : kArchitectures)
    if (arch == name) c.model_type = type;
  if (c.model_type.empty())
    return Status::Error(file.path() + ": general.architecture \"" + arch +
                         "\" is not supported (supported: " + SupportedGgufArchitectures() + ")");
  const Meta m(file, arch);
  const std::string& t = c.model_type;
  EMBER_RETURN_IF_ERROR(ParseShape(m, &c));
  EMBER_ASSIGN_OR_RETURN(std::span<const std::string_view> tokens,
                         file.GetStringArray("tokenizer.ggml.tokens"));
  c.vocab_size = static_cast<int32_t>(tokens.size());
  if (m.Has("vocab_size")) {
    EMBER_ASSIGN_OR_RETURN(int32_t declared, m.Int("vocab_size"));
    if (declared != c.vocab_size)
      return m.Err("vocab_size", "is " + std::to_string(declared) +
                                     " but tokenizer.ggml.tokens has " +
                                     std::to_string(c.vocab_size) + " tokens");
  }
  if (const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
      embd != nullptr && embd->num_rows() != c.vocab_size)
    return Status::Error(file.path() + ": tensor 'token_embd.weight' has " +
                         std::to_string(embd->num_rows()) + " rows but tokenizer.ggml.tokens has " +
                         std::to_string(c.vocab_size) + " tokens");
  c.tie_word_embeddings = file.FindTensor("output.weight") == nullptr;
  c.torch_dtype = "GGUF";
  EMBER_ASSIGN_OR_RETURN(c.rope.theta, m.Num("rope.freq_base", 10000.0));
  EMBER_RETURN_IF_ERROR(ParseRopeScaling(m, &c.rope));
  EMBER_RETURN_IF_ERROR(ReadRopeFreqs(file, c.rotary_dim, &c.rope));
  if (file.FindTensor("rope_factors_long.weight") != nullptr)
    return Status::Error(file.path() +
                         ": tensor 'rope_factors_long.weight' (LongRoPE scaling) is "
                         "not supported");
  c.rope_local = c.rope;
  EMBER_RETURN_IF_ERROR(ParseSlidingWindow(m, &c));

  c.attention_bias = t == "qwen2" || file.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.o_bias = file.FindTensor("blk.0.attn_output.bias") != nullptr;
  c.qk_norm = t == "qwen3" || t == "qwen3_moe" || t == "gemma3_text";
  c.fused_qkv = t == "phi3";
  c.attention_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  if (t == "gemma2" || t == "gemma3_text") EMBER_RETURN_IF_ERROR(ParseGemma(m, &c));
  if (t == "qwen3_moe") EMBER_RETURN_IF_ERROR(ParseExperts(m, &c));
  if (c.intermediate_size <= 0) return m.Err("feed_forward_length", "must be positive");

  EMBER_ASSIGN_OR_RETURN(c.bos_token_id, OptionalId(file, "tokenizer.ggml.bos_token_id"));
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
    EMBER_ASSIGN_OR_RETURN(std::optional<int32_t> id, OptionalId(file, key));
    if (id && *id >= c.vocab_size)
      return Status::Error(file.path() + ": metadata key '" + key + "' is " + std::to_string(*id) +
                           ", outside the vocabulary (" + std::to_string(c.vocab_size) + ")");
    if (id &&
        std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), *id) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(*id);
  }
  return c;
}

GenerationDefaults GgufGenerationDefaults(const ModelConfig& config) {
  GenerationDefaults g;
  g.eos_token_ids = config.eos_token_ids;
  g.bos_token_id = config.bos_token_id;
  return g;
}

Result<GgufVocab> GgufVocabOf(const GgufFile& file) {
  GgufVocab v;
  EMBER_ASSIGN_OR_RETURN(std::string_view model, file.GetString("tokenizer.ggml.model"));
  v.model = std::string(model);
  if (file.HasKey("tokenizer.ggml.pre")) {
    EMBER_ASSIGN_OR_RETURN(std::string_view pre, file.GetString("tokenizer.ggml.pre"));
    v.pre = std::string(pre);
  }
  EMBER_ASSIGN_OR_RETURN(std::span<const std::string_view> tokens,
                         file.GetStringArray("tokenizer.ggml.tokens"));
  v.tokens.assign(tokens.begin(), tokens.end());
  if (file.HasKey("tokenizer.ggml.scores")) {
    EMBER_ASSIGN_OR_RETURN(v.scores, file.GetFloatArray("tokenizer.ggml.scores"));
  }
  if (file.HasKey("tokenizer.ggml.token_type")) {
    EMBER_ASSIGN_OR_RETURN(std::vector<int64_t> types,
                           file.GetIntArray("tokenizer.ggml.token_type"));
    for (int64_t type : types)
      v.token_types.push_back(type < 0 || type > 255 ? -1 : static_cast<int32_t>(type));
  }
  if (file.HasKey("tokenizer.ggml.merges")) {
    EMBER_ASSIGN_OR_RETURN(std::span<const std::string_view> merges,
                           file.GetStringArray("tokenizer.ggml.merges"));
    v.merges.assign(merges.begin(), merges.end());
  }
  EMBER_ASSIGN_OR_RETURN(v.bos_token_id, OptionalId(file, "tokenizer.ggml.bos_token_id"));
  EMBER_ASSIGN_OR_RETURN(v.eos_token_id, OptionalId(file, "tokenizer.ggml.eos_token_id"));
  EMBER_ASSIGN_OR_RETURN(v.unknown_token_id, OptionalId(file, "tokenizer.ggml.unknown_token_id"));
  EMBER_ASSIGN_OR_RETURN(v.padding_token_id, OptionalId(file, "tokenizer.ggml.padding_token_id"));
  EMBER_ASSIGN_OR_RETURN(v.add_bos_token, OptionalBool(file, "tokenizer.ggml.add_bos_token"));
  EMBER_ASSIGN_OR_RETURN(v.add_eos_token, OptionalBool(file, "tokenizer.ggml.add_eos_token"));
  EMBER_ASSIGN_OR_RETURN(v.add_space_prefix, OptionalBool(file, "tokenizer.ggml.add_space_prefix"));
  return v;
}

Result<std::string> GgufChatTemplate(const GgufFile& file, const std::string& name) {
  const std::string key = name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + name;
  if (!file.HasKey(key)) return std::string();
  EMBER_ASSIGN_OR_RETURN(std::string_view source, file.GetString(key));
  return std::string(source);
}

}  // namespace ember
