// ExportGguf (gguf_export.h): config -> `<arch>.*` keys, tokenizer folder -> tokenizer.ggml.*,
// safetensors tensors -> GGUF tensors (renamed, q/k rows permuted, converted or quantized).
#include "model/gguf_export.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numbers>
#include <optional>

#include "backend/cpu/matmul.h"  // ConvertToF32
#include "model/ggml_quantize.h"
#include "model/gguf_model.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/quantize.h"
#include "model/safetensors.h"
#include "tokenizer/gguf_vocab_export.h"
#include "util/half.h"
#include "util/mapped_file.h"

namespace ember {
namespace {

struct ExportType {
  const char* name;
  GgmlType type;
  bool quantized;       // pure: the projections in `type`, the other matrices in float
  uint32_t file_type;   // general.file_type (llama.cpp's llama_ftype)
  std::optional<QuantRecipe> recipe;  // mixed: each tensor's type from quant_recipe.h
};
const ExportType kTypes[] = {
    {"f32", GgmlType::kF32, false, 0, std::nullopt},
    {"f16", GgmlType::kF16, false, 1, std::nullopt},
    {"bf16", GgmlType::kBF16, false, 32, std::nullopt},
    {"q8_0", GgmlType::kQ8_0, true, 7, std::nullopt},
    {"q4_0", GgmlType::kQ4_0, true, 2, std::nullopt},
    {"q4_k", GgmlType::kQ4_K, true, 14, std::nullopt},
    {"q5_k", GgmlType::kQ5_K, true, 16, std::nullopt},
    {"q6_k", GgmlType::kQ6_K, true, 18, std::nullopt},
    {"q4_k_m", GgmlType::kQ4_K, false, 15, QuantRecipe::kQ4_K_M},
    {"q4_k_s", GgmlType::kQ4_K, false, 14, QuantRecipe::kQ4_K_S},
    {"q5_k_m", GgmlType::kQ5_K, false, 17, QuantRecipe::kQ5_K_M},
    {"q5_k_s", GgmlType::kQ5_K, false, 16, QuantRecipe::kQ5_K_S},
};

const ExportType& TypeOf(GgmlType type, std::optional<QuantRecipe> recipe) {
  for (const ExportType& t : kTypes)
    if (recipe ? t.recipe == recipe : !t.recipe && t.type == type) return t;
  return kTypes[0];
}

// config.json model_type -> general.architecture.
const std::pair<const char*, const char*> kArchitectures[] = {
    {"llama", "llama"}, {"mistral", "llama"}, {"qwen2", "qwen2"}, {"qwen3", "qwen3"},
    {"qwen3_moe", "qwen3moe"}, {"gemma2", "gemma2"}, {"gemma3_text", "gemma3"}, {"phi3", "phi3"}};

bool IsGemma(const ModelConfig& c) {
  return c.model_type == "gemma2" || c.model_type == "gemma3_text";
}

// Gemma's layer pattern as GGUF says it: every pattern-th layer global, the others sliding
// (0 when the layers are not that regular).
int32_t SlidingPattern(const ModelConfig& c) {
  int32_t pattern = 0;
  for (int32_t l = 0; l < c.num_layers && pattern == 0; ++l)
    if (c.layer_types[size_t(l)] == LayerType::kFullAttention) pattern = l + 1;
  if (pattern == 0) return 0;
  for (int32_t l = 0; l < c.num_layers; ++l)
    if ((c.layer_types[size_t(l)] == LayerType::kFullAttention) != ((l + 1) % pattern == 0)) return 0;
  return pattern;
}

// What GGUF's gemma2 / gemma3 cannot say (Ember's GGUF loader derives the rest as llama.cpp does).
Status CheckGemma(const ModelConfig& c, const std::string& source) {
  if (SlidingPattern(c) == 0)
    return Status::Error(source + ": layer_types are not every n-th layer global, which GGUF's " +
                         c.model_type + " cannot say");
  const bool is_27b = (c.model_type == "gemma2" && c.num_layers == 46) ||
                      (c.model_type == "gemma3_text" && c.num_layers == 62);
  const double qpas = is_27b ? double(c.hidden_size) / c.num_heads : c.head_dim;
  if (std::fabs(c.attention_scale - 1.0 / std::sqrt(qpas)) > 1e-7)
    return Status::Error(source + ": query_pre_attn_scalar other than llama.cpp's (" +
                         std::to_string(qpas) + ") cannot be written to GGUF");
  if (c.model_type == "gemma3_text" &&
      (c.rope_local.type != "default" || c.rope_local.theta != 10000.0))
    return Status::Error(source + ": sliding layers' rope other than base 10000 unscaled cannot "
                         "be written to GGUF's gemma3");
  return Status::Ok();
}

std::string Lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

GgmlType GgmlOf(DType dtype) {
  return dtype == DType::kF16 ? GgmlType::kF16 : dtype == DType::kBF16 ? GgmlType::kBF16 : GgmlType::kF32;
}

// What the GGUF architectures written here cannot say is refused, naming it.
Status CheckExpressible(const ModelConfig& c, const std::string& source) {
  if (IsGemma(c)) EMBER_RETURN_IF_ERROR(CheckGemma(c, source));
  // phi3: GGUF's sliding window covers every layer (Ember's loader and llama.cpp alike).
  const bool all_slide = c.model_type == "phi3" && c.sliding_window > 0 &&
                         std::count(c.layer_types.begin(), c.layer_types.end(),
                                    LayerType::kSlidingAttention) == c.num_layers;
  for (LayerType t : c.layer_types)
    if (t != LayerType::kFullAttention && !IsGemma(c) && !all_slide)
      return Status::Error(source + ": sliding-window layers (sliding_window " +
                           std::to_string(c.sliding_window) + ") cannot be written to GGUF's " +
                           c.model_type + " architecture");
  const std::string& rope = c.rope.type;
  if (rope != "default" && rope != "linear" && rope != "llama3")
    return Status::Error(source + ": rope_scaling type \"" + rope +
                         "\" is not written (written: default, linear, llama3)");
  if (c.mla() || (c.fused_qkv && c.model_type != "phi3") || c.attn_output_gate ||
      c.shared_expert_intermediate_size > 0)
    return Status::Error(source + ": this " + c.model_type + " layout is not written");
  if (c.num_experts > 0) {  // GGUF's qwen3moe: every layer sparse, top k renormalised
    if (std::find(c.moe_layers.begin(), c.moe_layers.end(), 0) != c.moe_layers.end())
      return Status::Error(source + ": dense layers among the MoE ones (mlp_only_layers, "
                           "decoder_sparse_step) cannot be written to GGUF's qwen3moe");
    if (!c.norm_topk_prob)
      return Status::Error(source + ": norm_topk_prob false cannot be written to GGUF's qwen3moe "
                           "(llama.cpp renormalises the top k)");
  }
  return Status::Ok();
}

// Llama 3 rope scaling as llama.cpp's converter stores it: per-frequency divisors.
std::vector<float> Llama3RopeFactors(const ModelConfig& c) {
  const RopeConfig& r = c.rope;
  const double old_len = r.original_max_position_embeddings;
  const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
  std::vector<float> factors;
  for (int32_t i = 0; i < c.rotary_dim; i += 2) {
    const float freq = 1.0f / std::pow(static_cast<float>(r.theta),
                                       static_cast<float>(i) / static_cast<float>(c.rotary_dim));
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(static_cast<float>(r.factor));
    } else {
      const double smooth =
          (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      factors.push_back(static_cast<float>(1 / ((1 - smooth) / r.factor + smooth)));
    }
  }
  return factors;
}

void WriteHyperparameters(const ModelConfig& c, const std::string& arch, GgufWriter& w) {
  const auto key = [&](const char* suffix) { return arch + "." + suffix; };
  w.AddUint32(key("context_length"), static_cast<uint32_t>(c.max_position_embeddings));
  w.AddUint32(key("embedding_length"), static_cast<uint32_t>(c.hidden_size));
  w.AddUint32(key("block_count"), static_cast<uint32_t>(c.num_layers));
  w.AddUint32(key("feed_forward_length"), static_cast<uint32_t>(c.intermediate_size));
  w.AddUint32(key("attention.head_count"), static_cast<uint32_t>(c.num_heads));
  w.AddUint32(key("attention.head_count_kv"), static_cast<uint32_t>(c.num_kv_heads));
  w.AddUint32(key("attention.key_length"), static_cast<uint32_t>(c.head_dim));
  w.AddUint32(key("attention.value_length"), static_cast<uint32_t>(c.head_dim));
  w.AddFloat32(key("attention.layer_norm_rms_epsilon"), c.rms_norm_eps);
  w.AddFloat32(key("rope.freq_base"), static_cast<float>(c.rope.theta));
  w.AddUint32(key("rope.dimension_count"), static_cast<uint32_t>(c.rotary_dim));
  w.AddUint32(key("vocab_size"), static_cast<uint32_t>(c.vocab_size));
  if (c.num_experts > 0) {
    w.AddUint32(key("expert_count"), static_cast<uint32_t>(c.num_experts));
    w.AddUint32(key("expert_used_count"), static_cast<uint32_t>(c.num_experts_per_tok));
    w.AddUint32(key("expert_feed_forward_length"), static_cast<uint32_t>(c.moe_intermediate_size));
  }
  // phi3: llama.cpp requires the key; a model without a window gets one of the whole context.
  if (c.model_type == "phi3")
    w.AddUint32(key("attention.sliding_window"),
                static_cast<uint32_t>(c.sliding_window > 0 ? c.sliding_window
                                                           : c.max_position_embeddings));
  if (IsGemma(c)) {
    w.AddUint32(key("attention.sliding_window"), static_cast<uint32_t>(c.sliding_window));
    w.AddUint32(key("attention.sliding_window_pattern"), static_cast<uint32_t>(SlidingPattern(c)));
    if (c.attn_logit_softcapping > 0)
      w.AddFloat32(key("attn_logit_softcapping"), c.attn_logit_softcapping);
    if (c.final_logit_softcapping > 0)
      w.AddFloat32(key("final_logit_softcapping"), c.final_logit_softcapping);
  }
  if (c.rope.type == "linear") {
    w.AddString(key("rope.scaling.type"), "linear");
    w.AddFloat32(key("rope.scaling.factor"), static_cast<float>(c.rope.factor));
  }
}

// tokenizer.ggml.* from the tokenizer folder, padded to the model's vocabulary with unused tokens
// (as llama.cpp's converter does).
// `eos`: the generation EOS ids (generation_config.json, else config.json): the tokenizer's EOS
// first, up to two more as tokenizer.ggml.eot_token_id / eom_token_id (Ember's GGUF loader stops
// on all three; llama.cpp also stops on its end-of-generation tokens by their text).
Status WriteVocabulary(const ModelConfig& c, const std::string& dir,
                       const std::vector<int32_t>& eos, GgufWriter& w) {
  if (!FileExists(dir + "/tokenizer.json"))
    return Status::Error(dir + "/tokenizer.json: file not found (a GGUF file carries the "
                         "vocabulary; pass --tokenizer DIR)");
  EMBER_ASSIGN_OR_RETURN(GgufVocab v, GgufVocabFromTokenizerDir(dir));
  if (v.tokens.size() > static_cast<size_t>(c.vocab_size))
    return Status::Error(dir + "/tokenizer.json: " + std::to_string(v.tokens.size()) +
                         " tokens, more than the model's vocab_size " +
                         std::to_string(c.vocab_size));
  for (size_t id = v.tokens.size(); id < static_cast<size_t>(c.vocab_size); ++id) {
    v.tokens.push_back("[PAD" + std::to_string(id) + "]");
    v.token_types.push_back(static_cast<int32_t>(GgufTokenType::kUnused));
    if (!v.scores.empty()) v.scores.push_back(-1e7f - static_cast<float>(id));
  }
  w.AddString("tokenizer.ggml.model", v.model);
  if (v.model == "gpt2") w.AddString("tokenizer.ggml.pre", v.pre);
  w.AddStringArray("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w.AddFloat32Array("tokenizer.ggml.scores", v.scores);
  w.AddInt32Array("tokenizer.ggml.token_type", v.token_types);
  if (!v.merges.empty()) w.AddStringArray("tokenizer.ggml.merges", v.merges);
  const std::pair<const char*, std::optional<int32_t>> ids[] = {
      {"tokenizer.ggml.bos_token_id", v.bos_token_id},
      {"tokenizer.ggml.eos_token_id", v.eos_token_id},
      {"tokenizer.ggml.unknown_token_id", v.unknown_token_id}};
  for (const auto& [key, id] : ids)
    if (id) w.AddUint32(key, static_cast<uint32_t>(*id));
  std::vector<int32_t> extra;
  for (int32_t id : eos)
    if (id != v.eos_token_id.value_or(-1) && id >= 0 && id < c.vocab_size) extra.push_back(id);
  if (!v.eos_token_id && !extra.empty()) {
    w.AddUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(extra.front()));
    extra.erase(extra.begin());
  }
  if (extra.size() > 2)
    return Status::Error(dir + ": " + std::to_string(extra.size() + 1) +
                         " EOS ids in generation_config.json; GGUF holds three (eos, eot, eom)");
  const char* kExtraKeys[] = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
  for (size_t i = 0; i < extra.size(); ++i)
    w.AddUint32(kExtraKeys[i], static_cast<uint32_t>(extra[i]));
  w.AddBool("tokenizer.ggml.add_bos_token", v.add_bos_token.value_or(false));
  w.AddBool("tokenizer.ggml.add_eos_token", v.add_eos_token.value_or(false));
  if (v.add_space_prefix) w.AddBool("tokenizer.ggml.add_space_prefix", *v.add_space_prefix);
  return Status::Ok();
}

// The float32 values of `view`, rows permuted into GGUF's rope order (heads > 0).
std::vector<float> ToF32(const TensorView& view, int32_t heads) {
  int64_t numel = 1;
  for (int64_t d : view.shape) numel *= d;
  std::vector<float> f(static_cast<size_t>(numel));
  cpu::ConvertToF32(view.data, view.dtype, numel, f.data());
  if (heads == 0) return f;
  const int64_t rows = view.shape[0], cols = view.shape.size() > 1 ? view.shape[1] : 1;
  std::vector<float> out(f.size());
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(f.data() + r * cols, cols, out.data() + GgufRopeRow(r, rows, heads) * cols);
  return out;
}

struct Plan {
  std::string gguf_name, name;
  GgmlType type;
  std::vector<int64_t> shape;
  int32_t permute_heads = 0;
  std::vector<std::string> experts;  // a stacked experts tensor: its experts' names, in order
  bool plus_one = false;             // gemma norms: llama.cpp stores 1 + w
};

// "model.layers.3.mlp.experts.5.up_proj.weight" -> 5; -1 for a tensor that is not an expert's.
int64_t ExpertIndex(const std::string& name) {
  const size_t at = name.find(".experts.");
  if (at == std::string::npos) return -1;
  return std::stoll(name.substr(at + 9));
}

// Where a tensor goes: its GGUF name, type and rope permutation.
Result<Plan> PlanTensor(const TensorView& view, const ModelConfig& c, const ExportType& target,
                        const std::string& arch) {
  Plan p{GgufTensorName(view.name, c), view.name, GgmlType::kF32, view.shape, 0, {}, false};
  if (p.gguf_name.empty())
    return Status::Error(view.file + ": tensor \"" + view.name + "\" has no GGUF name in a " +
                         c.model_type + " model");
  if (view.dtype != DType::kF32 && view.dtype != DType::kF16 && view.dtype != DType::kBF16)
    return Status::Error(view.file + ": tensor \"" + view.name + "\" is " +
                         DTypeName(view.dtype) + "; only F32, F16 and BF16 checkpoints are written");
  const std::string& g = p.gguf_name;
  if (arch == "llama" && (g.find(".attn_q.") != std::string::npos ||
                          g.find(".attn_k.") != std::string::npos))
    p.permute_heads = g.find(".attn_q.") != std::string::npos ? c.num_heads : c.num_kv_heads;
  p.plus_one = IsGemma(c) && g.size() >= 11 && g.compare(g.size() - 11, 11, "norm.weight") == 0;
  if (view.shape.size() < 2)
    p.type = GgmlType::kF32;
  else if (target.quantized && IsQuantizedProjection(view.name))
    p.type = target.type;
  else if (target.quantized || target.recipe)  // a recipe: typed once the plan is complete
    p.type = GgmlOf(view.dtype);
  else
    p.type = target.type;
  return p;
}

// Sort key: the embedding, the layers in order, the final norm and head.
std::pair<int64_t, std::string> Order(const std::string& gguf) {
  if (gguf.rfind("token_embd", 0) == 0) return {-1, gguf};
  if (gguf.rfind("blk.", 0) == 0) return {std::stoll(gguf.substr(4)), gguf};
  return {1LL << 40, gguf};
}

// config.json and the general.architecture it is written as; refusals name the file.
Result<std::pair<ModelConfig, std::string>> ReadConfig(const std::string& model_dir) {
  struct stat st;
  if (stat(model_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::Error(model_dir + ": model directory not found");
  const std::string config_path = model_dir + "/config.json";
  if (!FileExists(config_path)) return Status::Error(config_path + ": file not found");
  EMBER_ASSIGN_OR_RETURN(std::string config_text, ReadFileToString(config_path));
  EMBER_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(config_text, config_path));
  std::string arch;
  for (const auto& [type, a] : kArchitectures)
    if (c.model_type == type) arch = a;
  if (arch.empty())
    return Status::Error(config_path + ": architecture \"" + c.model_type +
                         "\" is not written to GGUF by ember quantize (written: " +
                         ExportArchitectures() + ")");
  EMBER_RETURN_IF_ERROR(CheckExpressible(c, config_path));
  return std::pair<ModelConfig, std::string>(std::move(c), arch);
}

Status WriteMetadata(const GgufExportOptions& o, const ModelConfig& c, const std::string& arch,
                     const ExportType& target, GgufWriter& w) {
  const std::string gen_path = o.model_dir + "/generation_config.json";
  std::string gen_text;
  if (FileExists(gen_path)) {
    EMBER_ASSIGN_OR_RETURN(gen_text, ReadFileToString(gen_path));
  }
  EMBER_ASSIGN_OR_RETURN(GenerationDefaults gen, ParseGenerationConfig(gen_text, gen_path, c));
  w.AddString("general.architecture", arch);
  std::string name = o.model_dir;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  w.AddString("general.name", name.substr(name.find_last_of('/') + 1));
  w.AddUint32("general.file_type", target.file_type);
  if (target.quantized || target.recipe) w.AddUint32("general.quantization_version", 2);
  WriteHyperparameters(c, arch, w);
  EMBER_RETURN_IF_ERROR(WriteVocabulary(c, o.tokenizer_dir.empty() ? o.model_dir : o.tokenizer_dir,
                                        gen.eos_token_ids, w));
  if (!o.chat_template.empty()) w.AddString("tokenizer.chat_template", o.chat_template);
  if (!o.chat_template_tool_use.empty())
    w.AddString("tokenizer.chat_template.tool_use", o.chat_template_tool_use);
  return Status::Ok();
}

// A mixed recipe's type for every planned tensor (what the rules read: the written file's shape).
Status ApplyRecipe(QuantRecipe recipe, const ModelConfig& c, const std::string& arch,
                   std::vector<Plan>& plans) {
  RecipeModel m{arch, c.num_layers, c.num_heads, c.num_kv_heads, c.num_experts, false};
  for (const Plan& p : plans) m.has_output |= p.gguf_name == "output.weight";
  for (Plan& p : plans) {
    EMBER_ASSIGN_OR_RETURN(p.type, RecipeTensorType(recipe, m, p.gguf_name, p.shape, p.type));
  }
  return Status::Ok();
}

// Every checkpoint tensor's plan, in file order.
Result<std::vector<Plan>> PlanTensors(const WeightStore& store, const ModelConfig& c,
                                      const ExportType& target, const std::string& arch) {
  std::vector<Plan> plans;
  const bool has_embedding = store.Has("model.embed_tokens.weight");
  for (const std::string& n : store.Names()) {
    // Tied embeddings: one token_embd.weight (from lm_head.weight when only that is stored).
    if (n == "lm_head.weight" && c.tie_word_embeddings && has_embedding) continue;
    // Experts: one stacked [experts, rows, cols] tensor, planned at expert 0.
    const int64_t expert = ExpertIndex(n);
    if (expert > 0) continue;
    EMBER_ASSIGN_OR_RETURN(TensorView view, store.Get(n));
    EMBER_ASSIGN_OR_RETURN(Plan p, PlanTensor(view, c, target, arch));
    if (n == "lm_head.weight" && c.tie_word_embeddings) p.gguf_name = "token_embd.weight";
    if (expert == 0) {
      const std::string prefix = n.substr(0, n.find(".experts.") + 9);
      const std::string suffix = n.substr(n.find('.', prefix.size()));
      for (int32_t e = 0; e < c.num_experts; ++e) {
        p.experts.push_back(prefix + std::to_string(e) + suffix);
        if (!store.Has(p.experts.back()))
          return Status::Error(view.file + ": tensor \"" + p.experts.back() + "\" is missing");
      }
      p.shape.insert(p.shape.begin(), c.num_experts);
    }
    plans.push_back(std::move(p));
  }
  std::sort(plans.begin(), plans.end(),
            [](const Plan& a, const Plan& b) { return Order(a.gguf_name) < Order(b.gguf_name); });
  if (target.recipe) EMBER_RETURN_IF_ERROR(ApplyRecipe(*target.recipe, c, arch, plans));
  return plans;
}

// A planned tensor's bytes in its type (a stacked experts tensor: expert by expert, so that only
// one expert's float values are held at a time).
Result<std::vector<uint8_t>> TensorBytes(const Plan& p, const WeightStore& store, size_t threads) {
  if (p.experts.empty()) {
    EMBER_ASSIGN_OR_RETURN(TensorView view, store.Get(p.name));
    std::vector<float> values = ToF32(view, p.permute_heads);  // [rows, cols]
    if (p.plus_one)
      for (float& v : values) v += 1.0f;
    return QuantizeGgmlRows(values, p.shape.back(), p.type, threads);
  }
  std::vector<uint8_t> out;
  for (const std::string& e : p.experts) {
    EMBER_ASSIGN_OR_RETURN(TensorView view, store.Get(e));
    const std::vector<uint8_t> bytes =
        QuantizeGgmlRows(ToF32(view, 0), p.shape.back(), p.type, threads);
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
  return out;
}

// Declares the tensors (rope_freqs.weight first for Llama 3 rope scaling); each one's bytes are
// converted or quantized when the writer asks. Returns "N tensors (k TYPE, ...)".
Result<std::string> AddTensors(const std::vector<Plan>& plans,
                               std::shared_ptr<const WeightStore> store, const ModelConfig& c,
                               size_t threads, GgufWriter& w) {
  std::map<std::string, int> counts;
  if (c.rope.type == "llama3") {
    const std::vector<float> factors = Llama3RopeFactors(c);
    ++counts["F32"];
    EMBER_RETURN_IF_ERROR(w.AddTensor(
        "rope_freqs.weight", GgmlType::kF32, {static_cast<int64_t>(factors.size())},
        [factors]() -> Result<std::vector<uint8_t>> {
          return QuantizeGgmlRows(factors, static_cast<int64_t>(factors.size()), GgmlType::kF32, 1);
        }));
  }
  for (const Plan& p : plans) {
    ++counts[std::string(GgmlTypeName(p.type))];
    EMBER_RETURN_IF_ERROR(w.AddTensor(
        p.gguf_name, p.type, p.shape,
        [store, p, threads]() { return TensorBytes(p, *store, threads); }));
  }
  int total = 0;
  std::string list;
  for (const auto& [type, n] : counts) {
    list += (list.empty() ? "" : ", ") + std::to_string(n) + " " + type;
    total += n;
  }
  return std::to_string(total) + " tensors (" + list + ")";
}

}  // namespace

Result<ExportTypeChoice> ParseExportType(const std::string& name, const std::string& flag) {
  for (const ExportType& t : kTypes)
    if (Lower(name) == t.name) return ExportTypeChoice{t.type, t.recipe};
  return Status::Error(flag + ": unsupported type '" + name + "' (supported: " + ExportTypeNames() +
                       ")");
}

std::string ExportTypeNames() {
  std::string out;
  for (const ExportType& t : kTypes) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

std::string ExportArchitectures() {
  std::string out;
  for (const auto& [type, arch] : kArchitectures) out += (out.empty() ? "" : ", ") + std::string(type);
  return out;
}

Result<std::string> ExportGguf(const GgufExportOptions& o) {
  EMBER_ASSIGN_OR_RETURN(auto config_arch, ReadConfig(o.model_dir));
  const auto& [c, arch] = config_arch;
  const ExportType& target = TypeOf(o.type, o.recipe);
  std::shared_ptr<const WeightStore> store;
  {
    EMBER_ASSIGN_OR_RETURN(std::unique_ptr<WeightStore> opened, WeightStore::Open(o.model_dir));
    store = std::move(opened);
  }
  GgufWriter w;
  EMBER_RETURN_IF_ERROR(WriteMetadata(o, c, arch, target, w));
  EMBER_ASSIGN_OR_RETURN(std::vector<Plan> plans, PlanTensors(*store, c, target, arch));
  EMBER_ASSIGN_OR_RETURN(std::string tensors,
                         AddTensors(plans, store, c, std::max<size_t>(o.threads, 1), w));
  EMBER_RETURN_IF_ERROR(w.Write(o.out_path));
  return o.out_path + ": " + tensors;
}

}  // namespace ember
