#include "sampling/logit_edits.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "sampling/dry.h"
#include "sampling/processors.h"

namespace ember {
namespace {

struct Scratch {
  std::vector<std::pair<int32_t, int32_t>> bias;  // (token, index into params.logit_bias)
  std::vector<uint8_t> bias_done;                 // per entry of `bias`: emitted already
  std::vector<int32_t> masked;                    // sorted distinct stop ids (when masking)
  std::vector<std::pair<int32_t, float>> dry;     // (token, DRY penalty), sorted by token
  std::vector<uint8_t> dry_done;                  // per entry of `dry`: emitted already
};
thread_local Scratch t_scratch;

}  // namespace

void AppendLogitEdits(const SamplingParams& params, const SamplerState& state, int32_t row,
                      std::vector<LogitEdit>& edits) {
  const bool masking = state.num_output_tokens() < params.min_tokens;
  const bool penalties = params.has_penalties();
  if (params.logit_bias.empty() && !penalties && !masking && !params.has_dry()) return;
  Scratch& s = t_scratch;
  s.dry.clear();
  if (params.has_dry()) {
    const std::span<const int32_t> breakers =
        params.dry_breaker_ids ? std::span<const int32_t>(*params.dry_breaker_ids)
                               : std::span<const int32_t>();
    DryPenalties(state.dry_window(), params, breakers, &s.dry);
  }
  s.dry_done.assign(s.dry.size(), 0);
  const auto add_dry = [&](int32_t token) {  // the token's DRY kSubtract, if it has one
    auto it = std::lower_bound(s.dry.begin(), s.dry.end(), std::pair<int32_t, float>{token, 0.0f},
                               [](const auto& a, const auto& b) { return a.first < b.first; });
    if (it == s.dry.end() || it->first != token) return;
    edits.push_back({row, token, LogitEditOp::kSubtract, it->second});
    s.dry_done[static_cast<size_t>(it - s.dry.begin())] = 1;
  };

  s.masked.clear();
  if (masking) {
    const auto ids = state.min_tokens_mask_ids();
    s.masked.assign(ids.begin(), ids.end());
    std::sort(s.masked.begin(), s.masked.end());
    s.masked.erase(std::unique(s.masked.begin(), s.masked.end()), s.masked.end());
  }
  const auto is_masked = [&](int32_t token) {
    return std::binary_search(s.masked.begin(), s.masked.end(), token);
  };
  // Bias entries by token; a stable order keeps a repeated id's entries in request order. A list
  // sorted by id already (SamplingParams::SortLogitBias) costs one linear pass per step.
  s.bias.clear();
  for (size_t i = 0; i < params.logit_bias.size(); ++i)
    s.bias.emplace_back(params.logit_bias[i].first, static_cast<int32_t>(i));
  if (!std::is_sorted(s.bias.begin(), s.bias.end()))
    std::sort(s.bias.begin(), s.bias.end());  // (token, index): ties by index = request order
  s.bias_done.assign(s.bias.size(), 0);
  const auto add_bias = [&](int32_t token) {  // the token's kAdds, if it has any
    auto it = std::lower_bound(s.bias.begin(), s.bias.end(), std::pair<int32_t, int32_t>{token, 0});
    for (; it != s.bias.end() && it->first == token; ++it) {
      const float value = params.logit_bias[static_cast<size_t>(it->second)].second;
      edits.push_back({row, token, LogitEditOp::kAdd, value});
      s.bias_done[static_cast<size_t>(it - s.bias.begin())] = 1;
    }
  };

  if (penalties) {
    const auto seen = state.seen_ids();
    const auto counts = state.output_counts();
    for (size_t i = 0; i < seen.size(); ++i) {
      const int32_t token = seen[i];
      if (is_masked(token)) continue;
      if (!s.bias.empty()) add_bias(token);
      if (params.repetition_penalty != 1.0f)
        edits.push_back({row, token, LogitEditOp::kRepetition, params.repetition_penalty});
      if (counts[i] > 0) {
        const float drop =
            PenaltySubtrahend(params.frequency_penalty, params.presence_penalty, counts[i]);
        // x - (+0) == x bit for bit (signed zeros and NaN included): no edit needed.
        if (std::bit_cast<uint32_t>(drop) != 0)
          edits.push_back({row, token, LogitEditOp::kSubtract, drop});
      }
      if (!s.dry.empty()) add_dry(token);
    }
  }
  for (size_t i = 0; i < s.dry.size(); ++i) {  // DRY ids without penalty edits
    const int32_t token = s.dry[i].first;
    if (s.dry_done[i] || is_masked(token)) continue;
    if (!s.bias.empty()) add_bias(token);
    add_dry(token);
  }
  for (size_t i = 0; i < s.bias.size(); ++i) {
    if (s.bias_done[i] || is_masked(s.bias[i].first)) continue;
    add_bias(s.bias[i].first);  // marks this entry and the token's later ones
  }
  for (int32_t token : s.masked) edits.push_back({row, token, LogitEditOp::kMask, 0.0f});
}

}  // namespace ember
