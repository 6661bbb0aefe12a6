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

}  // namespace ember
