// The router of a mixture-of-experts MLP (Backend::MoeMlp), shared by the backends: which
// experts a row goes to and with what weight. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <span>

namespace ember {

// p = softmax(logits) in float32; the top_k experts by p (the lower index first on ties); with
// `normalize` their p divided by the sum of the k (transformers' norm_topk_prob). Writes the
// chosen experts to ids[0..top_k) in ascending id order (the order the MLP sums them in) and
// their weights to weights[0..top_k). logits [num_experts]; top_k in [1, num_experts].
void MoeRoute(std::span<const float> logits, int32_t top_k, bool normalize, int32_t* ids,
              float* weights);

}  // namespace ember
