#include "model/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/cpu/matmul.h"  // ConvertToF32
#include "model/safetensors.h"
#include "util/mapped_file.h"
#include "util/sha256.h"

namespace ember {

namespace {

using json = nlohmann::json;

const char* const kTargetNames[kNumLoraTargets] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};

bool IsSupportedModule(const std::string& name) {
  return std::find(std::begin(kTargetNames), std::end(kTargetNames), name) !=
             std::end(kTargetNames) ||
         name == "qkv_proj" || name == "gate_up_proj";
}

// A config key that must be absent, null, false or empty (an option Ember does not implement).
Status RefuseIfSet(const json& j, const std::string& key, const std::string& source,
                   const std::string& what) {
  if (!j.contains(key)) return Status::Ok();
  const json& v = j[key];
  const bool set = !(v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                     ((v.is_array() || v.is_object()) && v.empty()));
  if (!set) return Status::Ok();
  return Status::Error(source + ": \"" + key + "\" is not supported (" + what + ")");
}

Status CheckUnsupportedOptions(const json& j, const std::string& source) {
  EMBER_RETURN_IF_ERROR(RefuseIfSet(j, "use_dora", source, "DoRA adapters"));
  EMBER_RETURN_IF_ERROR(
      RefuseIfSet(j, "modules_to_save", source, "fully trained modules beside the LoRA"));
  EMBER_RETURN_IF_ERROR(RefuseIfSet(j, "fan_in_fan_out", source, "transposed (Conv1D) weights"));
  EMBER_RETURN_IF_ERROR(
      RefuseIfSet(j, "layers_to_transform", source, "adapters on a subset of the layers"));
  EMBER_RETURN_IF_ERROR(RefuseIfSet(j, "rank_pattern", source, "per-module ranks"));
  EMBER_RETURN_IF_ERROR(RefuseIfSet(j, "alpha_pattern", source, "per-module alphas"));
  EMBER_RETURN_IF_ERROR(RefuseIfSet(j, "exclude_modules", source, "excluded modules"));
  EMBER_RETURN_IF_ERROR(
      RefuseIfSet(j, "trainable_token_indices", source, "trained embedding rows"));
  EMBER_RETURN_IF_ERROR(RefuseIfSet(j, "lora_bias", source, "a bias on lora_B"));
  EMBER_RETURN_IF_ERROR(
      RefuseIfSet(j, "target_parameters", source, "adapters on parameters (MoE experts)"));
  EMBER_RETURN_IF_ERROR(RefuseIfSet(j, "layer_replication", source, "replicated layers"));
  EMBER_RETURN_IF_ERROR(
      RefuseIfSet(j, "alora_invocation_tokens", source, "activated LoRA (aLoRA)"));
  if (j.contains("bias") && !j["bias"].is_null() &&
      !(j["bias"].is_string() && j["bias"].get<std::string>() == "none"))
    return Status::Error(source + ": \"bias\" must be \"none\" (trained biases are not supported)");
  return Status::Ok();
}

// Where a PEFT tensor name points: model.layers.L.{self_attn,mlp}.MODULE.lora_{A,B}.weight.
struct TensorRef {
  int64_t layer = -1;
  std::string block, module;
  bool is_a = false;
};

std::optional<TensorRef> ParseTensorName(std::string name) {
  const std::string prefix = "base_model.model.model.layers.";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  name = name.substr(prefix.size());
  const size_t dot = name.find('.');
  if (dot == std::string::npos || dot == 0 || dot > 6) return std::nullopt;
  TensorRef ref;
  for (size_t i = 0; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
  }
  ref.layer = std::stoll(name.substr(0, dot));
  name = name.substr(dot + 1);
  for (const char* suffix : {".lora_A.weight", ".lora_B.weight"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      ref.is_a = s[6] == 'A';
      name.resize(name.size() - s.size());
      const size_t sep = name.find('.');
      if (sep == std::string::npos) return std::nullopt;
      ref.block = name.substr(0, sep);
      ref.module = name.substr(sep + 1);
      return ref;
    }
  }
  return std::nullopt;
}

// One part of a (possibly fused) module: its target and its rows of B.
struct ModulePart {
  LoraTarget target;
  int64_t first_row, rows;
};

struct ModuleShape {
  int64_t in = 0, out = 0;
  std::vector<ModulePart> parts;
};

// The module's shape in `layer` of this model, or an error saying why it is not a target there.
Result<ModuleShape> ShapeOf(const ModelConfig& c, int64_t layer, const std::string& block,
                            const std::string& module) {
  const int64_t h = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim,
                kv = int64_t{c.num_kv_heads} * c.head_dim, inter = c.intermediate_size;
  const bool moe = !c.moe_layers.empty() && c.moe_layers[static_cast<size_t>(layer)] != 0;
  const std::string fused = c.fused_qkv ? " (this model fuses them: qkv_proj, gate_up_proj)"
                                        : " (this model does not fuse it)";
  if (block == "self_attn") {
    if (module == "qkv_proj") {
      if (!c.fused_qkv) return Status::Error("not a projection of " + c.model_type + fused);
      return ModuleShape{h, q + 2 * kv,
                         {{LoraTarget::kQ, 0, q}, {LoraTarget::kK, q, kv}, {LoraTarget::kV, q + kv, kv}}};
    }
    if (module == "o_proj") return ModuleShape{q, h, {{LoraTarget::kO, 0, h}}};
    const LoraTarget t = module == "q_proj" ? LoraTarget::kQ : module == "k_proj" ? LoraTarget::kK
                                                                                   : LoraTarget::kV;
    if (module == "q_proj" || module == "k_proj" || module == "v_proj") {
      if (c.fused_qkv) return Status::Error("not a projection of " + c.model_type + fused);
      const int64_t out = t == LoraTarget::kQ ? q : kv;
      return ModuleShape{h, out, {{t, 0, out}}};
    }
  } else if (block == "mlp") {
    if (moe || module.find("experts") != std::string::npos)
      return Status::Error("mixture-of-experts MLPs are not LoRA targets");
    if (module == "gate_up_proj") {
      if (!c.fused_qkv) return Status::Error("not a projection of " + c.model_type + fused);
      return ModuleShape{h, 2 * inter, {{LoraTarget::kGate, 0, inter}, {LoraTarget::kUp, inter, inter}}};
    }
    if (module == "down_proj") return ModuleShape{inter, h, {{LoraTarget::kDown, 0, h}}};
    if (module == "gate_proj" || module == "up_proj") {
      if (c.fused_qkv) return Status::Error("not a projection of " + c.model_type + fused);
      return ModuleShape{h, inter,
                         {{module == "gate_proj" ? LoraTarget::kGate : LoraTarget::kUp, 0, inter}}};
    }
  }
  return Status::Error("not a supported LoRA target (q/k/v/o/gate/up/down_proj, qkv_proj, "
                       "gate_up_proj)");
}

std::vector<float> ToF32(const TensorView& v, int64_t first_row, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const size_t elem = DTypeSize(v.dtype);
  cpu::ConvertToF32(static_cast<const uint8_t*>(v.data) + first_row * cols * elem, v.dtype,
                    rows * cols, out.data());
  return out;
}

// One module's A and B into the adapter's targets (B scaled, split into its parts' rows).
Status AddModule(const TensorView& a, const TensorView& b, const ModuleShape& shape,
                 double scale, std::array<LoraMatrices, kNumLoraTargets>& targets) {
  const int64_t r = a.shape[0];
  const std::vector<float> a32 = ToF32(a, 0, r, shape.in);
  for (const ModulePart& part : shape.parts) {
    LoraMatrices& m = targets[static_cast<size_t>(part.target)];
    m.in = shape.in;
    m.out = part.rows;
    m.a = a32;
    m.b = ToF32(b, part.first_row, part.rows, r);
    for (float& v : m.b) v = static_cast<float>(v * scale);
  }
  return Status::Ok();
}

}  // namespace

std::string LoraUnsupportedModel(const ModelConfig& model) {
  for (const char* t : {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "phi3", "gpt_oss",
                        "gemma2", "gemma3_text"})
    if (model.model_type == t) return "";
  return "model_type " + model.model_type +
         " does not take LoRA adapters yet (llama, mistral, qwen2, qwen3, qwen3_moe, phi3, "
         "gpt_oss, gemma2, gemma3_text do)";
}

const char* LoraTargetName(LoraTarget target) {
  return kTargetNames[static_cast<size_t>(target)];
}

double LoraConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / rank;
}

Result<LoraConfig> ParseLoraConfig(const std::string& json_text, const std::string& source,
                                   int32_t max_rank) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::Error(source + ": not a JSON object");
  const std::string peft_type = j.value("peft_type", std::string());
  if (peft_type != "LORA")
    return Status::Error(source + ": \"peft_type\" " +
                         (peft_type.empty() ? std::string("is missing") : "is " + peft_type) +
                         " (only LORA adapters are supported)");
  EMBER_RETURN_IF_ERROR(CheckUnsupportedOptions(j, source));
  LoraConfig c;
  if (!j.contains("r") || !j["r"].is_number_integer())
    return Status::Error(source + ": \"r\" must be an integer");
  const int64_t r = j["r"].get<int64_t>();
  if (r < 1 || r > max_rank)
    return Status::Error(source + ": \"r\" is " + std::to_string(r) + ", outside 1.." +
                         std::to_string(max_rank) + " (--max-lora-rank)");
  c.rank = static_cast<int32_t>(r);
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number())
    return Status::Error(source + ": \"lora_alpha\" must be a number");
  c.alpha = j["lora_alpha"].get<double>();
  if (j.contains("use_rslora") && !j["use_rslora"].is_null()) {
    if (!j["use_rslora"].is_boolean())
      return Status::Error(source + ": \"use_rslora\" must be true or false");
    c.use_rslora = j["use_rslora"].get<bool>();
  }
  if (!j.contains("target_modules") || !j["target_modules"].is_array() ||
      j["target_modules"].empty())
    return Status::Error(source +
                         ": \"target_modules\" must be a non-empty list of module names (a "
                         "pattern string is not supported)");
  for (const json& m : j["target_modules"]) {
    if (!m.is_string()) return Status::Error(source + ": \"target_modules\" must hold strings");
    const std::string name = m.get<std::string>();
    if (!IsSupportedModule(name))
      return Status::Error(source + ": \"target_modules\" names \"" + name +
                           "\", not a supported LoRA target (q/k/v/o/gate/up/down_proj, "
                           "qkv_proj, gate_up_proj)");
    c.target_modules.push_back(name);
  }
  return c;
}

int64_t LoraAdapter::HostBytes() const {
  int64_t bytes = 0;
  for (const auto& layer : layers) {
    for (const LoraMatrices& m : layer)
      bytes += static_cast<int64_t>((m.a.size() + m.b.size()) * sizeof(float));
  }
  return bytes;
}

Result<LoraAdapter> LoadLoraAdapter(const std::string& dir, const ModelConfig& model,
                                    int32_t max_rank) {
  if (const std::string why = LoraUnsupportedModel(model); !why.empty())
    return Status::Error("LoRA adapter " + dir + ": " + why);
  const std::string config_path = dir + "/adapter_config.json";
  EMBER_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(config_path));
  LoraAdapter adapter;
  EMBER_ASSIGN_OR_RETURN(adapter.config, ParseLoraConfig(text, config_path, max_rank));
  const std::string path = dir + "/adapter_model.safetensors";
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<WeightStore> store, WeightStore::OpenFile(path));
  adapter.layers.resize(static_cast<size_t>(model.num_layers));
  const std::vector<std::string>& targets = adapter.config.target_modules;
  Sha256 digest;
  digest.Update(text);
  int64_t num_modules = 0;
  for (const std::string& name : store->Names()) {
    auto err = [&](const std::string& what) {
      return Status::Error(path + ": tensor \"" + name + "\": " + what);
    };
    const std::optional<TensorRef> ref = ParseTensorName(name);
    if (!ref)
      return err("not a LoRA matrix of a decoder layer's projection (embedding, lm_head and "
                 "other adapters are not supported)");
    if (ref->layer >= model.num_layers)
      return err("layer " + std::to_string(ref->layer) + " of a model with " +
                 std::to_string(model.num_layers) + " layers");
    Result<ModuleShape> shape = ShapeOf(model, ref->layer, ref->block, ref->module);
    if (!shape.ok()) return err(shape.status().message());
    if (std::find(targets.begin(), targets.end(), ref->module) == targets.end())
      return err("module \"" + ref->module + "\" is not in target_modules");
    if (!ref->is_a) continue;  // each module is read from its A, with its B
    const std::string b_name = name.substr(0, name.size() - 14) + ".lora_B.weight";
    const int64_t r = adapter.config.rank;
    Result<TensorView> a = store->GetWithShape(name, {r, shape->in});
    if (!a.ok()) return err(a.status().message() + " (the model's projection takes " +
                            std::to_string(shape->in) + " inputs; r " + std::to_string(r) + ")");
    Result<TensorView> b = store->GetWithShape(b_name, {shape->out, r});
    if (!b.ok())
      return Status::Error(path + ": tensor \"" + b_name + "\": " + b.status().message() +
                           " (the model's projection has " + std::to_string(shape->out) +
                           " outputs; r " + std::to_string(r) + ")");
    for (const TensorView* v : {&*a, &*b}) {
      digest.Update(v->name);
      digest.Update({static_cast<const uint8_t*>(v->data), v->nbytes});
    }
    EMBER_RETURN_IF_ERROR(AddModule(*a, *b, *shape, adapter.config.scale(),
                                    adapter.layers[static_cast<size_t>(ref->layer)]));
    ++num_modules;
  }
  // Every B has its A (a lone B would be skipped above).
  for (const std::string& name : store->Names()) {
    if (name.size() > 14 && name.compare(name.size() - 14, 14, ".lora_B.weight") == 0 &&
        !store->Has(name.substr(0, name.size() - 14) + ".lora_A.weight"))
      return Status::Error(path + ": tensor \"" + name + "\" has no lora_A");
  }
  if (num_modules == 0) return Status::Error(path + ": no LoRA matrices");
  const Sha256Digest d = digest.Finish();
  for (int i = 0; i < 8; ++i) adapter.digest |= uint64_t{d[static_cast<size_t>(i)]} << (8 * i);
  return adapter;
}

}  // namespace ember
