#include "sampling/sampling_params.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

namespace ember {
namespace {

std::string Num(double value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

Status Bad(const std::string& field, const std::string& expected, double got) {
  return Status::Error(field + ": must be " + expected + ", got " + Num(got));
}

// Checks lo <= value <= hi (with open ends when the flags say so), rejecting NaN / inf.
Status CheckRange(const char* field, float value, double lo, bool lo_open, double hi,
                  bool hi_open) {
  const std::string expected =
      std::string("in ") + (lo_open ? "(" : "[") + Num(lo) + ", " + Num(hi) + (hi_open ? ")" : "]");
  if (!std::isfinite(value)) return Bad(field, "finite and " + expected, value);
  const bool below = lo_open ? !(value > lo) : !(value >= lo);
  const bool above = hi_open ? !(value < hi) : !(value <= hi);
  if (below || above) return Bad(field, expected, value);
  return Status::Ok();
}

}  // namespace

Status SamplingParams::Validate(int32_t vocab_size) const {
  // Ranges follow OpenAI where it defines the field, vLLM otherwise.
  EMBER_RETURN_IF_ERROR(CheckRange("temperature", temperature, 0.0, false, 2.0, false));
  EMBER_RETURN_IF_ERROR(CheckRange("top_p", top_p, 0.0, true, 1.0, false));
  EMBER_RETURN_IF_ERROR(CheckRange("min_p", min_p, 0.0, false, 1.0, false));
  if (top_k < -1) return Bad("top_k", "-1 or 0 (off) or >= 1", top_k);
  EMBER_RETURN_IF_ERROR(
      CheckRange("repetition_penalty", repetition_penalty, 0.0, true, 10.0, false));
  EMBER_RETURN_IF_ERROR(CheckRange("presence_penalty", presence_penalty, -2.0, false, 2.0, false));
  EMBER_RETURN_IF_ERROR(
      CheckRange("frequency_penalty", frequency_penalty, -2.0, false, 2.0, false));
  // One pass of comparisons (a bias for every id of a 152k vocabulary is a valid request); the
  // message is built only for the entry that fails.
  for (const auto& [id, bias] : logit_bias) {
    if (id >= 0 && id < vocab_size && std::isfinite(bias) && bias >= -100.0f && bias <= 100.0f)
      continue;
    const std::string field = "logit_bias[" + std::to_string(id) + "]";
    if (id < 0 || id >= vocab_size) {
      return Status::Error(field + ": token id must be in [0, " + std::to_string(vocab_size) +
                           "), got " + std::to_string(id));
    }
    return CheckRange(field.c_str(), bias, -100.0, false, 100.0, false);
  }
  if (top_logprobs < -1 || top_logprobs > kMaxTopLogprobs) {
    return Bad("top_logprobs", "in [0, " + std::to_string(kMaxTopLogprobs) + "] (or -1: off)",
               top_logprobs);
  }
  if (min_tokens < 0) return Bad("min_tokens", ">= 0", min_tokens);
  return ValidateLlamaCppSamplers();
}

Status SamplingParams::ValidateLlamaCppSamplers() const {
  if (!std::isfinite(top_n_sigma) || (top_n_sigma < 0.0f && top_n_sigma != -1.0f))
    return Bad("top_n_sigma", "> 0 (or 0 / -1: off)", top_n_sigma);
  EMBER_RETURN_IF_ERROR(CheckRange("typical_p", typical_p, 0.0, true, 1.0, false));
  EMBER_RETURN_IF_ERROR(CheckRange("xtc_probability", xtc_probability, 0.0, false, 1.0, false));
  // Above 0.5 no two tokens can reach the threshold: XTC could never remove anything.
  EMBER_RETURN_IF_ERROR(CheckRange("xtc_threshold", xtc_threshold, 0.0, false, 0.5, false));
  // The argmax ignores the distribution filters; these two may remove the most likely token, so
  // asking for them with greedy decoding would silently do nothing.
  if (is_greedy() && has_xtc())
    return Status::Error("xtc_probability: needs temperature > 0 (greedy decoding takes the "
                         "argmax, which XTC would remove)");
  if (is_greedy() && has_typical_p())
    return Status::Error("typical_p: needs temperature > 0 (greedy decoding takes the argmax, "
                         "which typical sampling may remove)");
  EMBER_RETURN_IF_ERROR(CheckRange("dry_multiplier", dry_multiplier, 0.0, false, 100.0, false));
  EMBER_RETURN_IF_ERROR(CheckRange("dry_base", dry_base, 1.0, false, 10.0, false));
  if (dry_allowed_length < 1) return Bad("dry_allowed_length", ">= 1", dry_allowed_length);
  if (dry_penalty_last_n < -1)
    return Bad("dry_penalty_last_n", ">= 0 (0: off) or -1 (the whole sequence)",
               dry_penalty_last_n);
  if (dry_sequence_breakers.size() > kMaxDrySequenceBreakers) {
    return Bad("dry_sequence_breakers", "at most " + std::to_string(kMaxDrySequenceBreakers) +
                                            " strings",
               static_cast<double>(dry_sequence_breakers.size()));
  }
  for (size_t i = 0; i < dry_sequence_breakers.size(); ++i) {
    const size_t size = dry_sequence_breakers[i].size();
    if (size == 0 || size > kMaxDrySequenceBreakerBytes) {
      return Bad("dry_sequence_breakers[" + std::to_string(i) + "]",
                 "a string of 1 to " + std::to_string(kMaxDrySequenceBreakerBytes) + " bytes",
                 static_cast<double>(size));
    }
  }
  return Status::Ok();
}

void SamplingParams::SortLogitBias() {
  std::stable_sort(logit_bias.begin(), logit_bias.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
}

}  // namespace ember
