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

// deepseek_v3's router (MoeRouting::kSigmoidGrouped; transformers' DeepseekV3TopkRouter):
// s = sigmoid(logits) in float32; the choice uses c = s + bias: the experts split into `groups`
// equal groups, each scored by the sum of its two largest c, the best `top_groups` groups kept
// (the others' c set to 0), then the top_k experts by c (the lower index first on ties). Their
// weights are the unbiased s, divided by their sum (+ 1e-20) when `normalize`, times `scale`.
// Output as MoeRoute's: ids ascending, weights[j] of ids[j]. logits, bias [num_experts];
// num_experts % groups == 0 with at least 2 experts a group, top_groups in [1, groups].
struct GroupedRouting {
  std::span<const float> bias;
  int32_t groups = 1, top_groups = 1;
  float scale = 1.0f;
};
void MoeRouteGrouped(std::span<const float> logits, int32_t top_k, bool normalize,
                     const GroupedRouting& routing, int32_t* ids, float* weights);

}  // namespace ember
