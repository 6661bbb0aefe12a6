#include "sampling/logit_edits.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "sampling/processors.h"

namespace ember {
namespace {

struct Scratch {
  std::vector<std::pair<int32_t, int32_t>> bias;  // (token, index into params.logit_bias)
  std::vector<uint8_t> bias_done;                 // per entry of `bias`: emitted already
  std::vector<int32_t> masked;                    // sorted distinct stop ids (when masking)
};
thread_local Scratch t_scratch;

}  // namespace

void AppendLogitEdits(const SamplingParams& params, const SamplerState& state, int32_t row,
                      std::vector<LogitEdit>& edits) {
  const bool masking = state.num_output_tokens() < params.min_tokens;
  const bool penalties = params.has_penalties();
  if (params.logit_bias.empty() && !penalties && !masking) return;
  Scratch& s = t_scratch;

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
    }
  }
  for (size_t i = 0; i < s.bias.size(); ++i) {
    if (s.bias_done[i] || is_masked(s.bias[i].first)) continue;
    add_bias(s.bias[i].first);  // marks this entry and the token's later ones
  }
  for (int32_t token : s.masked) edits.push_back({row, token, LogitEditOp::kMask, 0.0f});
}

}  // namespace ember
