// OpenGgufWeights (gguf_model.h): GGUF tensor names -> Ember's (Hugging Face) names, each tensor
// read in place or materialized once (dequantized to float32, q/k rows un-permuted, gemma norms
// shifted back) into buffers the store keeps.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "model/gguf_model.h"
#include "util/parallel.h"

namespace ember {
namespace {

// Where one Ember tensor comes from: rows [first_row, first_row + rows) of a GGUF tensor (all of
// it, or one expert of a stacked [experts, rows, cols] tensor), and how to rearrange it.
struct Placement {
  std::string name;  // Ember's
  const GgufTensorInfo* info = nullptr;
  std::vector<int64_t> shape;  // Ember's (row-major)
  int64_t first_row = 0;
  int32_t permute_heads = 0;  // llama q/k: undo the converter's rope permutation over these heads
  bool minus_one = false;     // gemma norms: stored as 1 + w
};

struct Holder {  // what the views point into
  std::shared_ptr<const GgufFile> file;
  std::vector<std::vector<uint8_t>> buffers;
};

bool IsGemma(const ModelConfig& c) {
  return c.model_type == "gemma2" || c.model_type == "gemma3_text";
}

// The Hugging Face name of a per-layer GGUF tensor suffix ("attn_q.weight"), "" when unknown.
std::string LayerTensorName(const std::string& suffix, const ModelConfig& c) {
  const bool gemma = IsGemma(c);
  static const std::map<std::string, std::string> kCommon = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_output.bias", "self_attn.o_proj.bias"},
      {"attn_qkv.weight", "self_attn.qkv_proj.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"ffn_gate_inp.weight", "mlp.gate.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
  };
  if (suffix == "ffn_up.weight")
    return c.fused_qkv ? "mlp.gate_up_proj.weight" : "mlp.up_proj.weight";
  if (suffix == "ffn_norm.weight")
    return gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight";
  auto it = kCommon.find(suffix);
  return it == kCommon.end() ? "" : it->second;
}

// Stacked experts: GGUF suffix -> the per-expert Hugging Face projection.
const std::map<std::string, std::string> kExpertTensors = {
    {"ffn_gate_exps.weight", "gate_proj.weight"},
    {"ffn_up_exps.weight", "up_proj.weight"},
    {"ffn_down_exps.weight", "down_proj.weight"},
};

// Appends the placements of one GGUF tensor; an error names a tensor Ember has no use for.
Status Place(const GgufTensorInfo& info, const ModelConfig& c, const std::string& path,
             std::vector<Placement>* out) {
  Placement p;
  p.info = &info;
  p.shape = info.row_major_shape();
  const std::string& n = info.name;
  if (n == "token_embd.weight")
    p.name = "model.embed_tokens.weight";
  else if (n == "output_norm.weight")
    p.name = "model.norm.weight";
  else if (n == "output.weight")
    p.name = "lm_head.weight";
  int64_t layer = -1;
  std::string suffix;
  if (p.name.empty() && n.rfind("blk.", 0) == 0) {
    const size_t dot = n.find('.', 4);
    if (dot != std::string::npos && dot > 4 && dot <= 4 + 9 &&
        n.find_first_not_of("0123456789", 4) == dot) {
      layer = std::stoll(n.substr(4, dot - 4));
      suffix = n.substr(dot + 1);
    }
  }
  const auto unused = [&] {
    return Status::Error(path + ": tensor '" + n + "' is not part of a " + c.model_type +
                         " model as Ember reads it");
  };
  if (p.name.empty() && (layer < 0 || layer >= c.num_layers)) return unused();
  const std::string prefix = "model.layers." + std::to_string(layer) + ".";
  if (auto it = kExpertTensors.find(suffix); p.name.empty() && it != kExpertTensors.end()) {
    if (c.num_experts == 0 || p.shape.size() != 3 || p.shape[0] != c.num_experts)
      return Status::Error(path + ": tensor '" + n + "' must be [expert_count = " +
                           std::to_string(c.num_experts) + ", rows, cols]");
    for (int64_t e = 0; e < p.shape[0]; ++e) {
      Placement expert = p;
      expert.name = prefix + "mlp.experts." + std::to_string(e) + "." + it->second;
      expert.shape = {p.shape[1], p.shape[2]};
      expert.first_row = e * p.shape[1];
      out->push_back(std::move(expert));
    }
    return Status::Ok();
  }
  if (p.name.empty()) {
    const std::string hf = LayerTensorName(suffix, c);
    if (hf.empty()) return unused();
    p.name = prefix + hf;
    // llama.cpp's llama converter interleaves each head's rope halves in q and k.
    if (c.model_type == "llama" &&
        (suffix.rfind("attn_q.", 0) == 0 || suffix.rfind("attn_k.", 0) == 0)) {
      p.permute_heads = suffix[5] == 'q' ? c.num_heads : c.num_kv_heads;
      if (p.shape.empty() || p.shape[0] != int64_t{p.permute_heads} * c.head_dim)
        return Status::Error(path + ": tensor '" + n + "' must have " +
                             std::to_string(int64_t{p.permute_heads} * c.head_dim) +
                             " rows (heads x head dim)");
    }
  }
  const bool is_norm = n.size() >= 11 && n.compare(n.size() - 11, 11, "norm.weight") == 0;
  p.minus_one = IsGemma(c) && is_norm;
  out->push_back(std::move(p));
  return Status::Ok();
}

// The GGUF row (or element, for a vector) that holds Ember's row r: within each head of `dim`
// rows, Ember's [first half | second half] layout from GGML's interleaved (pairs) layout.
int64_t SourceRow(int64_t r, int64_t rows, int32_t heads) {
  if (heads <= 0) return r;
  const int64_t dim = rows / heads, half = dim / 2;
  const int64_t head = r / dim, i = r % dim;
  return head * dim + 2 * (i % half) + i / half;
}

bool TakenAsStored(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16;
}

DType EmberDType(GgmlType type) {
  return type == GgmlType::kF16    ? DType::kF16
         : type == GgmlType::kBF16 ? DType::kBF16
                                   : DType::kF32;
}

// The block-quantized DType a GGUF type is, if Ember has one (same block layout).
std::optional<DType> QuantizedDType(GgmlType type) {
  if (type == GgmlType::kQ8_0) return DType::kQ8_0;
  if (type == GgmlType::kQ4_0) return DType::kQ4_0;
  if (type == GgmlType::kQ4_K) return DType::kQ4_K;
  if (type == GgmlType::kQ5_K) return DType::kQ5_K;
  if (type == GgmlType::kQ6_K) return DType::kQ6_K;
  return std::nullopt;
}

// True for the matrices only MatMul (and, for the embedding, Embedding) reads: these may stay
// block-quantized. Experts, routers, norms and biases are dequantized whatever the backend.
bool IsPlainMatrix(const Placement& p) {
  static const char* kSuffixes[] = {"q_proj.weight",    "k_proj.weight",    "v_proj.weight",
                                    "o_proj.weight",    "qkv_proj.weight",  "gate_proj.weight",
                                    "up_proj.weight",   "down_proj.weight", "gate_up_proj.weight"};
  if (p.shape.size() != 2 || p.minus_one || p.name.find(".experts.") != std::string::npos)
    return false;
  if (p.name == "lm_head.weight" || p.name == "model.embed_tokens.weight") return true;
  for (const char* s : kSuffixes) {
    const std::string suffix = std::string(".") + s;
    if (p.name.size() > suffix.size() &&
        p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  }
  return false;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The view of one placement: into the mapping, or into a new buffer of `holder`. A matrix of a
// type `keep` accepts stays block-quantized (its rows moved as they are where q/k are unpermuted).
Result<TensorView> Materialize(const Placement& p, const std::string& path, Holder* holder,
                               const KeepQuantized& keep) {
  const GgufTensorInfo& info = *p.info;
  TensorView view;
  view.name = p.name;
  view.shape = p.shape;
  view.file = path + " (tensor " + info.name + ")";
  const int64_t row_len = info.row_length();
  const int64_t numel = NumElements(p.shape);
  const int64_t rows = row_len == 0 ? 0 : numel / row_len;
  const uint64_t row_bytes = info.row_bytes();
  const uint8_t* first = info.data + static_cast<uint64_t>(p.first_row) * row_bytes;
  const std::optional<DType> quantized = QuantizedDType(info.type);
  const bool kept = quantized && keep && IsPlainMatrix(p) && keep(*quantized);
  if ((TakenAsStored(info.type) || kept) && !p.minus_one && p.permute_heads == 0) {
    view.dtype = kept ? *quantized : EmberDType(info.type);
    view.data = first;
    view.nbytes = static_cast<size_t>(rows) * row_bytes;
    return view;
  }
  if (!GgmlTraits(info.type).dequantizable)
    return Status::Error(view.file + ": type " + std::string(GgmlTypeName(info.type)) +
                         " is not supported (supported: " + DequantizableTypeNames() + ")");
  std::vector<uint8_t>& buffer = holder->buffers.emplace_back();
  if ((TakenAsStored(info.type) || kept) && !p.minus_one && rows > 1) {  // rows moved as they are
    buffer.resize(static_cast<size_t>(rows) * row_bytes);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(buffer.data() + r * row_bytes,
                  first + SourceRow(r, rows, p.permute_heads) * row_bytes, row_bytes);
    view.dtype = kept ? *quantized : EmberDType(info.type);
  } else {
    buffer.resize(static_cast<size_t>(numel) * sizeof(float));
    float* out = reinterpret_cast<float*>(buffer.data());
    ForEachOnThreads(static_cast<size_t>(rows), std::thread::hardware_concurrency(), [&](size_t r) {
      const int64_t src = rows > 1 ? SourceRow(int64_t(r), rows, p.permute_heads) : int64_t(r);
      DequantizeRow(info.type, first + src * row_bytes, row_len, out + r * row_len);
    });
    if (rows == 1 && p.permute_heads > 0) {  // a q/k bias: its elements are the "rows"
      std::vector<float> v(out, out + row_len);
      for (int64_t i = 0; i < row_len; ++i)
        out[i] = v[size_t(SourceRow(i, row_len, p.permute_heads))];
    }
    if (p.minus_one)
      for (int64_t i = 0; i < numel; ++i) out[i] -= 1.0f;
    view.dtype = DType::kF32;
  }
  view.data = buffer.data();
  view.nbytes = buffer.size();
  return view;
}

// "blk.N.attn_q.weight" for a missing "model.layers.N.self_attn.q_proj.weight".
std::string DescribeMissing(const std::string& name, const ModelConfig& c) {
  const std::string gguf = GgufTensorName(name, c);
  if (gguf.empty()) return "tensor \"" + name + "\"";
  return "GGUF tensor '" + gguf + "' (Ember's " + name + ")";
}

}  // namespace

std::string GgufTensorName(const std::string& name, const ModelConfig& c) {
  if (name == "model.embed_tokens.weight") return "token_embd.weight";
  if (name == "model.norm.weight") return "output_norm.weight";
  if (name == "lm_head.weight") return "output.weight";
  const std::string layers = "model.layers.";
  if (name.rfind(layers, 0) != 0) return "";
  const size_t dot = name.find('.', layers.size());
  if (dot == std::string::npos) return "";
  const std::string layer = name.substr(layers.size(), dot - layers.size());
  const std::string rest = name.substr(dot + 1);
  static const char* kSuffixes[] = {
      "attn_norm.weight",    "attn_q.weight",       "attn_q.bias",
      "attn_k.weight",       "attn_k.bias",         "attn_v.weight",
      "attn_v.bias",         "attn_output.weight",  "attn_output.bias",
      "attn_qkv.weight",     "attn_q_norm.weight",  "attn_k_norm.weight",
      "ffn_gate.weight",     "ffn_up.weight",       "ffn_down.weight",
      "ffn_norm.weight",     "ffn_gate_inp.weight", "post_attention_norm.weight",
      "post_ffw_norm.weight"};
  for (const char* s : kSuffixes)
    if (LayerTensorName(s, c) == rest) return "blk." + layer + "." + s;
  for (const auto& [s, hf] : kExpertTensors)
    if (rest.find("mlp.experts.") == 0 && rest.size() > hf.size() &&
        rest.compare(rest.size() - hf.size(), hf.size(), hf) == 0)
      return "blk." + layer + "." + s;
  return "";
}

int64_t GgufRopeRow(int64_t r, int64_t rows, int32_t heads) { return SourceRow(r, rows, heads); }

Result<std::unique_ptr<WeightStore>> OpenGgufWeights(std::shared_ptr<const GgufFile> file,
                                                     const ModelConfig& config,
                                                     const KeepQuantized& keep,
                                                     std::string* summary) {
  const std::string& path = file->path();
  std::vector<Placement> placements;
  for (const GgufTensorInfo& info : file->tensors()) {
    if (info.name == "rope_freqs.weight") continue;  // read into the config (GgufModelConfig)
    EMBER_RETURN_IF_ERROR(Place(info, config, path, &placements));
  }
  auto holder = std::make_shared<Holder>();
  holder->file = file;
  std::vector<TensorView> views;
  views.reserve(placements.size());
  std::map<std::string, int> in_place, dequantized, kept;  // GGUF type name -> tensors
  int unpermuted = 0, shifted = 0;
  for (const Placement& p : placements) {
    EMBER_ASSIGN_OR_RETURN(TensorView view, Materialize(p, path, holder.get(), keep));
    const std::string type(GgmlTypeName(p.info->type));
    if (IsBlockQuantized(view.dtype))
      ++kept[type];
    else if (view.data >= static_cast<const void*>(p.info->data) &&
        view.data < static_cast<const void*>(p.info->data + p.info->nbytes))
      ++in_place[type];
    else if (!TakenAsStored(p.info->type))
      ++dequantized[type];
    unpermuted += p.permute_heads > 0;
    shifted += p.minus_one;
    views.push_back(std::move(view));
  }
  auto list = [](const std::map<std::string, int>& counts) {
    std::string out;
    for (const auto& [type, count] : counts)
      out += (out.empty() ? "" : ", ") + std::to_string(count) + " " + type;
    return out;
  };
  *summary = path + ": " + std::to_string(views.size()) + " tensors";
  if (!in_place.empty()) *summary += "; read in place: " + list(in_place);
  if (!kept.empty()) *summary += "; kept quantized for the backend's kernels: " + list(kept);
  if (!dequantized.empty())
    *summary += "; dequantized to f32 at load (the backend has no kernels for them): " +
                list(dequantized);
  if (unpermuted > 0)
    *summary += "; q/k rows of " + std::to_string(unpermuted) +
                " tensors put back in the Hugging Face rope order";
  if (shifted > 0)
    *summary += "; " + std::to_string(shifted) + " gemma norm weights stored as 1 + w shifted back";
  const ModelConfig c = config;
  return WeightStore::FromViews(path, std::move(views), std::move(holder),
                                static_cast<int64_t>(file->file_size()),
                                [c](const std::string& name) { return DescribeMissing(name, c); });
}

}  // namespace ember
