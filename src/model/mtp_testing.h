// Test-only: float32 safetensors files (WriteF32Safetensors, ReadF32Tensors; lora_test uses them
// too) and temporary deepseek_v3 checkpoints with a multi-token-prediction module
// (WriteMtpCheckpoint), built from the deepseek_v3 fixture, whose conversion (transformers)
// dropped the checkpoint's model.layers.N tensors. Never writes into the fixtures. Header-only;
// the tests' thread only.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/matmul.h"  // ConvertToF32
#include "model/safetensors.h"
#include "util/check.h"

namespace ember::testing {

struct NamedF32 {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // empty: zeros
};

// A safetensors file of F32 tensors (the data 8-byte aligned: the CPU reads F32 weights in place).
inline void WriteF32Safetensors(const std::string& path, const std::vector<NamedF32>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string body;
  for (const NamedF32& t : tensors) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    std::vector<float> data = t.data;
    data.resize(n, 0.0f);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape},
                      {"data_offsets", {body.size(), body.size() + n * 4}}};
    body.append(reinterpret_cast<const char*>(data.data()), n * 4);
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  const uint64_t len = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << h << body;
}

// Every tensor of one safetensors file, as float32.
inline std::vector<NamedF32> ReadF32Tensors(const std::string& path) {
  auto store = WeightStore::OpenFile(path);
  CHECK(store.ok()) << store.message();
  std::vector<NamedF32> out;
  for (const std::string& name : (*store)->Names()) {
    auto view = (*store)->Get(name);
    CHECK(view.ok()) << view.message();
    NamedF32 t{name, view->shape, {}};
    int64_t n = 1;
    for (int64_t d : view->shape) n *= d;
    t.data.resize(static_cast<size_t>(n));
    cpu::ConvertToF32(view->data, view->dtype, n, t.data.data());
    out.push_back(std::move(t));
  }
  return out;
}

// How the temporary checkpoint's MTP module is made (WriteMtpCheckpoint).
struct MtpCheckpointOptions {
  // false: the fixture's layers, the MTP block a copy of its last layer (qwen3_next: of its
  // full-attention layer), eh_proj random
  // (drafts mostly wrong). true: one layer (the fixture's MoE layer 1 as layer 0, first dense
  // layer none), embeddings of +-1 (unit RMS: enorm / hnorm with weight 1 keep them), the MTP
  // block a copy of layer 0, shared_head.norm a copy of model.norm, no shared_head.head (the
  // main lm_head is shared).
  bool one_layer = false;
  // eh_proj [d, 2d] = [embedding half | hidden half]: random, or these identities.
  enum class EhProj { kRandom, kEmbeddingHalf, kHiddenHalf, kBothHalves } eh = EhProj::kRandom;
  bool zero_attention_out = false;  // o_proj = 0 in every block (attention adds nothing)
  uint32_t seed = 1;
};

inline std::vector<float> Identity(int64_t d) {
  std::vector<float> m(static_cast<size_t>(d * d), 0.0f);
  for (int64_t i = 0; i < d; ++i) m[static_cast<size_t>(i * d + i)] = 1.0f;
  return m;
}

// Writes `dir` (replaced): the fixture's config (one_layer: 1 layer, first_k_dense_replace 0),
// generation config and one model.safetensors with the main model's and the MTP module's
// (model.layers.N.*) tensors in float32. From the qwen3_next fixture (one_layer only): its
// full-attention layer as the one layer, the module as qwen3_next stores it (mtp.layers.0,
// mtp.fc, mtp.pre_fc_norm_*, mtp.norm; (1 + w) norms, so the input norms' weights are zero).
inline void WriteMtpCheckpoint(const std::string& fixture_dir, const std::string& dir,
                               const MtpCheckpointOptions& options) {
  namespace fs = std::filesystem;
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fixture_dir + "/generation_config.json", dir + "/generation_config.json");
  std::ifstream in(fixture_dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  const bool next = config["model_type"] == "qwen3_next";
  // The layer kept by one_layer and copied into the MTP block: deepseek's first MoE one;
  // qwen3_next's (last) full-attention layer (its module's block is one).
  std::string one = "model.layers.1.";
  if (next) {
    const auto& types = config["layer_types"];
    for (size_t l = 0; l < types.size(); ++l)
      if (types[l] == "full_attention") one = "model.layers." + std::to_string(l) + ".";
    if (options.one_layer) config["layer_types"] = nlohmann::json::array({"full_attention"});
  }
  if (options.one_layer) {
    config["num_hidden_layers"] = 1;
    if (!next) config["first_k_dense_replace"] = 0;
  }
  const int32_t layers = config["num_hidden_layers"];
  const int64_t d = config["hidden_size"];
  std::ofstream(dir + "/config.json") << config.dump(2);
  std::mt19937 rng(options.seed);
  std::vector<NamedF32> tensors;
  const std::string main_source = options.one_layer || next ? one : "model.layers.2.";
  const std::string mtp = next ? "mtp." : "model.layers." + std::to_string(layers) + ".";
  const std::string block = next ? mtp + "layers.0." : mtp;
  for (NamedF32& t : ReadF32Tensors(fixture_dir + "/model.safetensors")) {
    const bool o_proj = t.name.ends_with("self_attn.o_proj.weight");
    if (options.zero_attention_out && o_proj) std::fill(t.data.begin(), t.data.end(), 0.0f);
    if (t.name.starts_with(main_source)) {  // the MTP block's source
      NamedF32 copy = t;
      copy.name = block + t.name.substr(main_source.size());
      tensors.push_back(std::move(copy));
    }
    if (options.one_layer && t.name.starts_with("model.layers.")) {
      if (!t.name.starts_with(one)) continue;
      t.name = "model.layers.0." + t.name.substr(one.size());
    }
    if (options.one_layer) {
      if (t.name == "model.embed_tokens.weight")
        for (float& v : t.data) v = (rng() & 1) != 0 ? 1.0f : -1.0f;
    }
    if (t.name == "model.norm.weight")
      tensors.push_back({mtp + (next ? "norm.weight" : "shared_head.norm.weight"), t.shape, t.data});
    tensors.push_back(std::move(t));
  }
  const std::vector<float> unit(static_cast<size_t>(d), next ? 0.0f : 1.0f);  // 1 or (1 + 0)
  tensors.push_back({mtp + (next ? "pre_fc_norm_embedding.weight" : "enorm.weight"), {d}, unit});
  tensors.push_back({mtp + (next ? "pre_fc_norm_hidden.weight" : "hnorm.weight"), {d}, unit});
  NamedF32 eh{mtp + (next ? "fc.weight" : "eh_proj.weight"), {d, 2 * d},
              std::vector<float>(static_cast<size_t>(2 * d * d))};
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(2 * d)));
  const std::vector<float> id = Identity(d);
  for (int64_t r = 0; r < d; ++r)
    for (int64_t col = 0; col < 2 * d; ++col) {
      const bool hidden_half = col >= d;
      const float one = id[static_cast<size_t>(r * d + col % d)];
      float& v = eh.data[static_cast<size_t>(r * 2 * d + col)];
      switch (options.eh) {
        case MtpCheckpointOptions::EhProj::kRandom: v = normal(rng); break;
        case MtpCheckpointOptions::EhProj::kEmbeddingHalf: v = hidden_half ? 0.0f : one; break;
        case MtpCheckpointOptions::EhProj::kHiddenHalf: v = hidden_half ? one : 0.0f; break;
        case MtpCheckpointOptions::EhProj::kBothHalves: v = one; break;
      }
    }
  tensors.push_back(std::move(eh));
  WriteF32Safetensors(dir + "/model.safetensors", tensors);
}

}  // namespace ember::testing
