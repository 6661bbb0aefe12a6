#include "backend/moe_route.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "util/check.h"

namespace ember {

void MoeRoute(std::span<const float> logits, int32_t top_k, bool normalize, int32_t* ids,
              float* weights) {
  const int32_t n = static_cast<int32_t>(logits.size());
  CHECK(top_k >= 1 && top_k <= n) << "top_k " << top_k << " of " << n << " experts";
  float max = -std::numeric_limits<float>::infinity();
  for (float v : logits) max = std::max(max, v);
  std::vector<float> p(logits.size());
  float sum = 0.0f;
  for (int32_t e = 0; e < n; ++e) {
    p[static_cast<size_t>(e)] = std::exp(logits[static_cast<size_t>(e)] - max);
    sum += p[static_cast<size_t>(e)];
  }
  for (float& v : p) v /= sum;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
    const float pa = p[static_cast<size_t>(a)], pb = p[static_cast<size_t>(b)];
    return pa > pb || (pa == pb && a < b);
  });
  // The top k in rank order (largest first): the order transformers sums them in for the norm.
  float top_sum = 0.0f;
  for (int32_t j = 0; j < top_k; ++j)
    top_sum += p[static_cast<size_t>(order[static_cast<size_t>(j)])];
  std::sort(order.begin(), order.begin() + top_k);
  for (int32_t j = 0; j < top_k; ++j) {
    const int32_t e = order[static_cast<size_t>(j)];
    ids[j] = e;
    weights[j] = normalize ? p[static_cast<size_t>(e)] / top_sum : p[static_cast<size_t>(e)];
  }
}

void MoeRouteGrouped(std::span<const float> logits, int32_t top_k, bool normalize,
                     const GroupedRouting& routing, int32_t* ids, float* weights) {
  const int32_t n = static_cast<int32_t>(logits.size());
  const int32_t groups = routing.groups, per = groups > 0 ? n / groups : 0;
  CHECK(top_k >= 1 && top_k <= n) << "top_k " << top_k << " of " << n << " experts";
  CHECK(groups >= 1 && per >= 2 && per * groups == n && routing.top_groups >= 1 &&
        routing.top_groups <= groups)
      << n << " experts in " << groups << " groups, " << routing.top_groups << " kept";
  CHECK_EQ(routing.bias.size(), logits.size());
  std::vector<float> score(logits.size()), choice(logits.size());
  for (size_t e = 0; e < logits.size(); ++e) {
    score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[e] = score[e] + routing.bias[e];
  }
  // Each group's score: its two largest choice values, summed.
  std::vector<float> group_score(static_cast<size_t>(groups));
  for (int32_t g = 0; g < groups; ++g) {
    float best = -std::numeric_limits<float>::infinity(), second = best;
    for (int32_t e = g * per; e < (g + 1) * per; ++e) {
      const float v = choice[static_cast<size_t>(e)];
      if (v > best) {
        second = best;
        best = v;
      } else if (v > second) {
        second = v;
      }
    }
    group_score[static_cast<size_t>(g)] = best + second;
  }
  const auto rank = [](const std::vector<float>& v) {
    return [&v](int32_t a, int32_t b) {
      const float va = v[static_cast<size_t>(a)], vb = v[static_cast<size_t>(b)];
      return va > vb || (va == vb && a < b);
    };
  };
  std::vector<int32_t> order(static_cast<size_t>(groups));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + routing.top_groups, order.end(),
                    rank(group_score));
  std::vector<uint8_t> kept(static_cast<size_t>(groups), 0);
  for (int32_t j = 0; j < routing.top_groups; ++j) kept[static_cast<size_t>(order[j])] = 1;
  for (int32_t e = 0; e < n; ++e)
    if (kept[static_cast<size_t>(e / per)] == 0) choice[static_cast<size_t>(e)] = 0.0f;
  order.resize(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), rank(choice));
  std::sort(order.begin(), order.begin() + top_k);
  float sum = 0.0f;
  for (int32_t j = 0; j < top_k; ++j) sum += score[static_cast<size_t>(order[j])];
  for (int32_t j = 0; j < top_k; ++j) {
    ids[j] = order[static_cast<size_t>(j)];
    const float w = score[static_cast<size_t>(ids[j])];
    weights[j] = (normalize ? w / (sum + 1e-20f) : w) * routing.scale;
  }
}

}  // namespace ember
