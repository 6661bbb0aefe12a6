// GenerationConfig: what a checkpoint's generation_config.json says about stopping and default
// sampling (eos_token_id may be an int or a list). The engine stops on the union of these EOS ids
// and the tokenizer's; the serve layer starts each request from DefaultSamplingParams() and lets
// the request's explicit fields override it (vLLM's `--generation-config auto`). Plain values,
// parsed once at start-up; immutable afterwards.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/sampling_params.h"
#include "util/status.h"

namespace ember {

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;  // in file order, duplicates removed
  std::optional<int32_t> bos_token_id, pad_token_id;
  // Sampling defaults: present only when the file sets them (vLLM reads exactly these).
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k, max_new_tokens;
};

// Parses generation_config.json text; `source` names the file in error messages.
Result<GenerationConfig> ParseGenerationConfig(std::string_view json, const std::string& source);
// Reads `path`; a missing file is not an error (many checkpoints have none): empty config.
Result<GenerationConfig> LoadGenerationConfig(const std::string& path);

// SamplingParams defaults with the file's temperature / top_p / top_k / min_p /
// repetition_penalty / max_new_tokens (-> max_tokens) applied. do_sample is ignored, as in vLLM.
SamplingParams DefaultSamplingParams(const GenerationConfig& config);

// Sorted, de-duplicated union of the config's EOS ids and the tokenizer's EOS id(s).
std::vector<int32_t> EosTokenIds(const GenerationConfig& config,
                                 std::span<const int32_t> tokenizer_eos_ids);

}  // namespace ember
