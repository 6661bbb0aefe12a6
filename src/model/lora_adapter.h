// LoRA adapters in PEFT's folder format (adapter_config.json + adapter_model.safetensors): the
// config's options, checked (an option Ember does not implement is refused naming its key), and
// the A/B matrices of every targeted projection, checked against the loaded model's shapes (a
// tensor that does not fit is refused naming it), as float32 on the host.
// Invariants of a LoraAdapter: for each layer and target either both matrices are empty (not
// targeted) or a is [rank, in] and b [out, rank] with the projection's in/out features, and b
// already carries the adapter's scale (alpha / r, or alpha / sqrt(r) with use_rslora), so a row's
// update is (x a^T) b^T. phi3's fused qkv_proj / gate_up_proj are split like its weights: one A
// shared by the parts, B's rows split per part. Pure functions; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "util/status.h"

namespace ember {

// The projections of a decoder layer that an adapter may target (llama.cc's order).
enum class LoraTarget : uint8_t { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;
const char* LoraTargetName(LoraTarget target);  // "q_proj", ..., "down_proj"

// Why a model of this config cannot take LoRA adapters ("" when it can): the families of llama.cc
// (llama, mistral, qwen2, qwen3, qwen3_moe, phi3, gpt_oss) and gemma.cc (gemma2, gemma3_text)
// apply them; any other model_type (deepseek_v3, qwen3_next, and families added later) is refused
// by name.
std::string LoraUnsupportedModel(const ModelConfig& model);

// The largest rank Ember takes at all (--max-lora-rank may lower it).
inline constexpr int32_t kMaxLoraRankLimit = 256;

// adapter_config.json, as far as Ember reads it.
struct LoraConfig {
  int32_t rank = 0;
  double alpha = 0.0;
  bool use_rslora = false;
  std::vector<std::string> target_modules;  // PEFT's names (q_proj, ..., qkv_proj, gate_up_proj)
  double scale() const;  // alpha / rank, or alpha / sqrt(rank) with use_rslora
};

// Parses and checks adapter_config.json text (`source` names it in errors): peft_type LORA,
// 1 <= r <= max_rank, a list of target_modules among the supported names, and none of the
// options Ember does not implement (use_dora, modules_to_save, bias other than "none",
// fan_in_fan_out, layers_to_transform, rank_pattern, alpha_pattern, exclude_modules,
// trainable_token_indices, lora_bias, target_parameters, layer_replication,
// alora_invocation_tokens, a target_modules pattern string): each refused by its key.
Result<LoraConfig> ParseLoraConfig(const std::string& json_text, const std::string& source,
                                   int32_t max_rank);

struct LoraMatrices {
  std::vector<float> a;  // [rank, in]
  std::vector<float> b;  // [out, rank], times the scale
  int64_t in = 0, out = 0;
  bool empty() const { return a.empty(); }
};

struct LoraAdapter {
  LoraConfig config;
  // [num_layers][kNumLoraTargets]
  std::vector<std::array<LoraMatrices, kNumLoraTargets>> layers;
  // SHA-256 (first 8 bytes) of the config text and the safetensors bytes: the adapter's identity
  // (the prefix cache's namespace; equal digests are the same adapter).
  uint64_t digest = 0;
  int64_t HostBytes() const;  // of the matrices
};

// Loads `dir` for a model of config `model` (LoraUnsupportedModel refuses other families). Errors name the
// folder and the key or tensor at fault.
Result<LoraAdapter> LoadLoraAdapter(const std::string& dir, const ModelConfig& model,
                                    int32_t max_rank);

}  // namespace ember
