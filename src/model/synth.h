// Synthetic checkpoints: a random-weight Hugging Face folder with the exact shapes and configs of a
// real model (`ember synth --like llama-3.2-1b`), so benchmarks and tests need no downloads.
// Written streaming (one tensor chunk at a time, never the whole model in memory), deterministic
// for a seed. Pure functions over the filesystem; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "util/status.h"

namespace ember {

struct SynthOptions {
  std::string preset;          // see SynthPresetNames()
  std::string out_dir;
  std::string tokenizer_dir;   // optional: copy tokenizer.json + tokenizer_config.json from here
  DType dtype = DType::kBF16;  // kF32, kF16 or kBF16
  uint64_t seed = 0;
  int64_t max_shard_bytes = 4LL << 30;  // split into model-0000i-of-0000N.safetensors above this
  int32_t num_layers = 0;  // > 0: only the first this many layers (shapes per layer unchanged)
  // gpt_oss presets: the experts as OpenAI's checkpoints store them, MXFP4 (gate_up_proj_blocks /
  // _scales, down_proj_blocks / _scales: random E2M1 bytes, scales 2^-9 to 2^-7) with
  // quantization_config mxfp4; everything else in `dtype`.
  bool mxfp4 = false;
  // deepseek_v3 presets: also write the multi-token-prediction module (model.layers.N.*, N the
  // layer count) that the real checkpoint carries and conversions drop (--spec-method mtp).
  bool mtp = false;
};

std::vector<std::string> SynthPresetNames();
// Writes config.json, generation_config.json, the safetensors file(s) (+ index) and the
// tokenizer files. Errors name the preset, flag or file.
Status WriteSynthCheckpoint(const SynthOptions& options);

// A random LoRA adapter in PEFT's folder format (adapter_config.json + adapter_model.safetensors)
// for the llama-family model whose config.json is in `model_dir`: rank `rank`, lora_alpha `alpha`,
// on `targets` (PEFT module names: q_proj ... down_proj) of every layer, A and B random in `dtype`
// (benchmarks; model/lora_adapter.h reads it).
struct SynthLoraOptions {
  std::string model_dir, out_dir;
  int32_t rank = 16;
  double alpha = 32;
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};
  DType dtype = DType::kBF16;
  uint64_t seed = 0;
};
Status WriteSynthLoraAdapter(const SynthLoraOptions& options);

}  // namespace ember
