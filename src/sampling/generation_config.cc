#include "sampling/generation_config.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "util/mapped_file.h"

namespace ember {
namespace {

using nlohmann::json;

Status FieldError(const std::string& source, const char* field, const std::string& expected,
                  const json& got) {
  return Status::Error(source + ": " + field + ": expected " + expected + ", got " + got.dump());
}

Result<std::optional<int32_t>> OptionalTokenId(const json& root, const char* field,
                                               const std::string& source) {
  const auto it = root.find(field);
  if (it == root.end() || it->is_null()) return std::optional<int32_t>();
  if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
      it->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    return FieldError(source, field, "a token id (non-negative integer)", *it);
  }
  return std::optional<int32_t>(it->get<int32_t>());
}

template <typename T>
Result<std::optional<T>> OptionalNumber(const json& root, const char* field,
                                        const std::string& source) {
  const auto it = root.find(field);
  if (it == root.end() || it->is_null()) return std::optional<T>();
  const bool ok = std::is_integral_v<T> ? it->is_number_integer() : it->is_number();
  if (!ok) return FieldError(source, field, std::is_integral_v<T> ? "an integer" : "a number", *it);
  if constexpr (std::is_integral_v<T>) {
    const auto value = it->get<int64_t>();
    if (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max()) {
      return FieldError(source, field, "a 32-bit integer", *it);
    }
  }
  return std::optional<T>(it->get<T>());
}

}  // namespace

Result<GenerationConfig> ParseGenerationConfig(std::string_view text, const std::string& source) {
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::Error(source + ": not valid JSON");
  if (!root.is_object()) return Status::Error(source + ": expected a JSON object");

  GenerationConfig config;
  if (const auto it = root.find("eos_token_id"); it != root.end() && !it->is_null()) {
    const json list = it->is_array() ? *it : json::array({*it});
    for (const json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return FieldError(source, "eos_token_id", "a token id or a list of token ids", *it);
      }
      const auto value = id.get<int32_t>();
      if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), value) ==
          config.eos_token_ids.end()) {
        config.eos_token_ids.push_back(value);
      }
    }
  }
  EMBER_ASSIGN_OR_RETURN(config.bos_token_id, OptionalTokenId(root, "bos_token_id", source));
  EMBER_ASSIGN_OR_RETURN(config.pad_token_id, OptionalTokenId(root, "pad_token_id", source));
  EMBER_ASSIGN_OR_RETURN(config.temperature, OptionalNumber<float>(root, "temperature", source));
  EMBER_ASSIGN_OR_RETURN(config.top_p, OptionalNumber<float>(root, "top_p", source));
  EMBER_ASSIGN_OR_RETURN(config.min_p, OptionalNumber<float>(root, "min_p", source));
  EMBER_ASSIGN_OR_RETURN(config.repetition_penalty,
                         OptionalNumber<float>(root, "repetition_penalty", source));
  EMBER_ASSIGN_OR_RETURN(config.top_k, OptionalNumber<int32_t>(root, "top_k", source));
  EMBER_ASSIGN_OR_RETURN(config.max_new_tokens,
                         OptionalNumber<int32_t>(root, "max_new_tokens", source));
  return config;
}

Result<GenerationConfig> LoadGenerationConfig(const std::string& path) {
  if (!FileExists(path)) return GenerationConfig();
  EMBER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseGenerationConfig(text, path);
}

SamplingParams DefaultSamplingParams(const GenerationConfig& config) {
  SamplingParams params;
  if (config.temperature) params.temperature = *config.temperature;
  if (config.top_p) params.top_p = *config.top_p;
  if (config.top_k) params.top_k = *config.top_k;
  if (config.min_p) params.min_p = *config.min_p;
  if (config.repetition_penalty) params.repetition_penalty = *config.repetition_penalty;
  if (config.max_new_tokens) params.max_tokens = *config.max_new_tokens;
  return params;
}

std::vector<int32_t> EosTokenIds(const GenerationConfig& config,
                                 std::span<const int32_t> tokenizer_eos_ids) {
  std::vector<int32_t> ids = config.eos_token_ids;
  ids.insert(ids.end(), tokenizer_eos_ids.begin(), tokenizer_eos_ids.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace ember
