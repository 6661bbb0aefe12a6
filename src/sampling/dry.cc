#include "sampling/dry.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <memory>
#include <string_view>

namespace ember {
namespace {

// z[s] = the longest common prefix of r and r[s..] (z[0] = |r|). Classic Z-function, O(|r|).
void ZFunction(std::span<const int32_t> r, std::vector<int32_t>* z) {
  const auto n = static_cast<int32_t>(r.size());
  z->assign(r.size(), 0);
  if (n == 0) return;
  (*z)[0] = n;
  int32_t left = 0, right = 0;  // [left, right): the rightmost match window found so far
  for (int32_t s = 1; s < n; ++s) {
    int32_t k = s < right ? std::min(right - s, (*z)[static_cast<size_t>(s - left)]) : 0;
    while (s + k < n && r[static_cast<size_t>(k)] == r[static_cast<size_t>(s + k)]) ++k;
    (*z)[static_cast<size_t>(s)] = k;
    if (s + k > right) {
      left = s;
      right = s + k;
    }
  }
}

}  // namespace

void DryPenalties(std::span<const int32_t> window, const SamplingParams& params,
                  std::span<const int32_t> breaker_ids,
                  std::vector<std::pair<int32_t, float>>* out) {
  out->clear();
  const size_t n = window.size();
  if (n < 2 || !params.has_dry()) return;
  const auto is_breaker = [&](int32_t id) {
    return std::binary_search(breaker_ids.begin(), breaker_ids.end(), id);
  };
  // The longest breaker-free suffix bounds every match (the matched suffix holds no breaker).
  size_t limit = 0;
  while (limit < n && !is_breaker(window[n - 1 - limit])) ++limit;
  if (limit == 0) return;  // the last token is a breaker
  // Reversed, the suffix ending at n-1 is a prefix, and a match ending at i starts at n-1-i.
  thread_local std::vector<int32_t> reversed, z;
  reversed.assign(window.rbegin(), window.rend());
  ZFunction(reversed, &z);
  for (size_t i = 0; i + 1 < n; ++i) {
    const auto length = static_cast<int32_t>(std::min<size_t>(z[n - 1 - i], limit));
    if (length < params.dry_allowed_length) continue;
    const int32_t next = window[i + 1];
    if (is_breaker(next)) continue;
    out->emplace_back(next, static_cast<float>(length));
  }
  // Per candidate its largest length, then the penalty.
  std::sort(out->begin(), out->end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  });
  out->erase(std::unique(out->begin(), out->end(),
                         [](const auto& a, const auto& b) { return a.first == b.first; }),
             out->end());
  for (auto& [token, value] : *out) {
    const double exponent = static_cast<double>(value) - params.dry_allowed_length;
    const double penalty = params.dry_multiplier * std::pow(double{params.dry_base}, exponent);
    value = static_cast<float>(std::min(penalty, static_cast<double>(FLT_MAX)));
  }
}

std::vector<int32_t> DryBreakerIds(std::span<const std::string> breakers, int32_t vocab_size,
                                   const TokenTextFn& token_text) {
  std::vector<int32_t> ids;
  if (breakers.empty()) return ids;
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::optional<std::string_view> text = token_text(id);
    if (!text) continue;
    for (const std::string& breaker : breakers) {
      if (text->find(breaker) != std::string_view::npos) {
        ids.push_back(id);
        break;
      }
    }
  }
  return ids;
}

void ResolveDryBreakers(SamplingParams* params, int32_t vocab_size,
                        const TokenTextFn& token_text) {
  if (!params->has_dry()) return;
  params->dry_breaker_ids = std::make_shared<const std::vector<int32_t>>(
      DryBreakerIds(params->dry_sequence_breakers, vocab_size, token_text));
}

}  // namespace ember
